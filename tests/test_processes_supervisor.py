"""Children of `serve --processes N` die with their supervisor (node/processes.py `follow_supervisor`): through
PR_SET_PDEATHSIG, through the pipe where prctl is missing, and when the supervisor died before either was set."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.procs import REPO

#: A stand-in child: follows the supervisor named on its command line, says how, then waits to be ended.
CHILD = (
    "import sys, time\n"
    "import node.processes as p\n"
    "if sys.argv[3] == 'no-prctl':\n"
    "    p._set_parent_death_signal = lambda sig: False\n"
    "print(p.follow_supervisor(int(sys.argv[1]), int(sys.argv[2])), flush=True)\n"
    "time.sleep(60)\n"
)
#: A stand-in supervisor: starts CHILD (following itself), prints the child's pid, then waits to be killed.
SUPERVISOR = (
    "import os, subprocess, sys, time\n"
    "r, w = os.pipe()\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid()), str(r), 'prctl'],"
    " pass_fds=(r,), stdout=subprocess.PIPE)\n"
    "print(child.pid, child.stdout.readline().decode().strip(), flush=True)\n"
    "time.sleep(60)\n"
)
EXIT_WITHIN_S = 5.0


def _child(supervisor_pid: int, fd: int, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(supervisor_pid), str(fd), mode],
        pass_fds=(fd,),
        stdout=subprocess.PIPE,
        cwd=REPO,
    )


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"  # a zombie has exited
    except FileNotFoundError:
        return True


def test_a_child_dies_with_its_killed_supervisor() -> None:
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, CHILD], stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert supervisor.stdout is not None
        pid_text, mechanism = supervisor.stdout.readline().decode().split()
        assert mechanism == "prctl"
        child = int(pid_text)
        assert not _gone(child)
        os.kill(supervisor.pid, signal.SIGKILL)
        supervisor.wait(timeout=EXIT_WITHIN_S)
        # The child was reparented (no longer ours to wait for): watch /proc.
        deadline = time.monotonic() + EXIT_WITHIN_S
        while not _gone(child):
            assert time.monotonic() < deadline, "the child outlived its supervisor"
            time.sleep(0.02)
    finally:
        supervisor.kill()
        supervisor.wait()
        if supervisor.stdout is not None:
            supervisor.stdout.close()


def test_without_prctl_the_child_watches_its_supervisors_pipe() -> None:
    watched, held = os.pipe()
    child = _child(os.getpid(), watched, "no-prctl")
    os.close(watched)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"pipe\n"
        assert child.poll() is None
        os.close(held)  # as the kernel does when the supervisor dies
        assert child.wait(timeout=EXIT_WITHIN_S) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_child_whose_supervisor_died_before_it_could_follow_exits() -> None:
    watched, held = os.pipe()
    not_the_parent = os.getppid()  # alive, but not this child's parent: as if its supervisor were gone
    child = _child(not_the_parent, watched, "prctl")
    os.close(watched)
    try:
        assert child.wait(timeout=EXIT_WITHIN_S) == -signal.SIGTERM
    finally:
        os.close(held)
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
