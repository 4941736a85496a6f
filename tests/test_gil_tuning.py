"""A serving process hands the GIL to a waiting thread (a CPU-pool job starting or handing its result back)
within about a millisecond while the event loop's thread is busy, not after CPython's 5 ms."""

from __future__ import annotations

import subprocess
import sys

# A thread wakes from a 1 ms sleep 40 times while the main thread runs Python without pause; each wake-up's
# lateness is how long it waited for the GIL. The lower quartile is robust to a noisy machine (which only makes
# waits longer): with CPython's default interval even the fastest handovers take ~5 ms.
_CODE = """
import statistics, sys, threading, time
from node.gil_tuning import SWITCH_INTERVAL_S, tune_gil_for_serving
if sys.argv[1] == "tuned":
    tune_gil_for_serving()
    assert sys.getswitchinterval() == SWITCH_INTERVAL_S
late = []
def waiter():
    for _ in range(40):
        t = time.perf_counter()
        time.sleep(0.001)
        late.append(time.perf_counter() - t - 0.001)
th = threading.Thread(target=waiter)
th.start()
while th.is_alive():
    sum(range(1000))  # the busy event loop
print(statistics.quantiles(late, n=4)[0])
"""


def _lower_quartile_lateness_s(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", _CODE, mode], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


def test_a_waiting_thread_gets_the_gil_within_a_millisecond_or_so() -> None:
    assert _lower_quartile_lateness_s("tuned") < 0.003
    assert _lower_quartile_lateness_s("default") > 0.003  # the control: what the tuning changes
