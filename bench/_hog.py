"""A competing CPU load that a benchmark or test starts itself: one process spinning.

Used to show what a busy machine does to a measurement (bench/speedup.py) and to check
that the busy-machine guard notices it (tests). Always a context manager, so the spinner
is killed (and reaped) on every path; it also dies with its parent.
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


@contextlib.contextmanager
def cpu_hog(processes: int = 1) -> Iterator[list[subprocess.Popen]]:
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(processes)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)
            if proc.stdin:
                proc.stdin.close()
