"""`serve --processes N --mesh-key-file F`: the supervisor passes SIGHUP on to its children (each reloads F)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from node.processes import ProcessGroup, _Child

HANGUP_EXIT = 7
#: A stand-in child: exits with HANGUP_EXIT on SIGHUP, after saying its handler is in place.
CHILD = (
    "import signal, sys, time\n"
    f"signal.signal(signal.SIGHUP, lambda *_: sys.exit({HANGUP_EXIT}))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_the_supervisor_forwards_sighup_to_its_running_children() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        group = ProcessGroup(argv=[], count=2, grace_s=1.0, hangup=True)
        group._children = [_Child(k, proc, time.monotonic()) for k, proc in enumerate(procs)]
        group._on_hangup(signal.SIGHUP, None)
        assert [proc.wait(timeout=10) for proc in procs] == [HANGUP_EXIT, HANGUP_EXIT]
        group._on_hangup(signal.SIGHUP, None)  # children that are gone are skipped
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
