"""How long a thread may hold the GIL while another waits for it, in a serving node process.

The event loop holds the GIL nearly all the time under load (it releases it only while it waits for I/O).
A CPU-pool thread (node/pipeline/cpu.py) needs it twice per job, to start the job and to hand the result
back, and with CPython's default switch interval (5 ms) it waits up to that long each time: a prompt encoded
on the pool reached its worker up to ~10 ms late while the loop was busy streaming other answers. Measured
side by side with SMG (qwen, 7,800-token prompts, `bench.gateway_bench`, medians of 2): TTFT p50 at 64 users
went from +18 ms above SMG's to +6 ms with 200 output tokens and from +32 ms to -25 ms with 20, CPU per
request unchanged. A forced switch costs microseconds, and happens only while threads contend.
"""

from __future__ import annotations

import sys

#: Seconds a thread keeps the GIL after another asked for it (CPython's default is 0.005).
SWITCH_INTERVAL_S = 0.0005


def tune_gil_for_serving() -> None:
    """Hand the GIL over within half a millisecond of a waiting thread's request."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
