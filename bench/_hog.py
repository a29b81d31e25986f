"""A competing CPU load that a benchmark or test starts itself: processes spinning
steadily (`cpu_hog`) or in random bursts (`bursty_hog`: spin, sleep, spin, each for a
random 20-600 ms, the load a shared machine's other jobs make).

Used to show what a busy machine does to a measurement (bench/speedup.py,
bench/speedup_calibration.py) and to check that the busy-machine guard notices it
(tests). Always a context manager, so the spinner is killed (and reaped) on every path;
it also dies with its parent.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator

# Spins one core until killed; exits by itself if the parent disappears (stdin closes).
_SPIN = (
    "import os, sys, threading\n"
    "threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()\n"
    "while True:\n"
    "    pass\n"
)


# Spins and sleeps in random bursts (seeded per process), same exit rule as _SPIN.
_BURSTS = (
    "import os, random, sys, threading, time\n"
    "threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()\n"
    "rng = random.Random(int(sys.argv[1]))\n"
    "while True:\n"
    "    until = time.monotonic() + rng.uniform(0.02, 0.6)\n"
    "    while time.monotonic() < until:\n"
    "        pass\n"
    "    time.sleep(rng.uniform(0.02, 0.6))\n"
)


@contextlib.contextmanager
def cpu_hog(processes: int = 1, detached: bool = False) -> Iterator[list]:
    """`detached`: the spinners are not this process's children (see `_detached`)."""
    with _spinners([[sys.executable, "-c", _SPIN] for _ in range(processes)],
                   detached) as procs:
        yield procs


@contextlib.contextmanager
def bursty_hog(processes: int = 1, seed: int = 0, detached: bool = False) -> Iterator[list]:
    """`processes` spinners that each spin and sleep for random 20-600 ms bursts."""
    with _spinners([[sys.executable, "-c", _BURSTS, str(seed + index)]
                    for index in range(processes)], detached) as procs:
        yield procs


# Starts the command as a grandchild and prints its pid: the spinner is then nobody's
# child here (reparented to init), as another user's job would be. A contention probe
# counts a process's children as its own work, so a benchmark that measures in-process
# must load the machine this way. The spinner keeps the pipe to us as its stdin, so it
# still exits when we do.
_DETACH = ("import subprocess, sys\n"
           "child = subprocess.Popen(sys.argv[1:], stdin=sys.stdin, stdout=subprocess.DEVNULL,"
           " stderr=subprocess.DEVNULL)\n"
           "print(child.pid, flush=True)\n")


class _Detached:
    def __init__(self, command: list[str]):
        self.pipe = subprocess.Popen([sys.executable, "-c", _DETACH, *command],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.pid = int(self.pipe.stdout.readline())
        self.pipe.wait(timeout=10)  # the intermediate exits at once

    def kill(self) -> None:
        import psutil

        with contextlib.suppress(psutil.NoSuchProcess):
            spinner = psutil.Process(self.pid)
            spinner.kill()
            spinner.wait(timeout=10)
        if self.pipe.stdin:
            self.pipe.stdin.close()


@contextlib.contextmanager
def _spinners(commands: list[list[str]], detached: bool = False) -> Iterator[list]:
    if detached:
        handles = [_Detached(command) for command in commands]
        try:
            yield handles
        finally:
            for handle in handles:
                handle.kill()
        return
    procs = [subprocess.Popen(command, stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for command in commands]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)
            if proc.stdin:
                proc.stdin.close()
