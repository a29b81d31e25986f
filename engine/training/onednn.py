"""oneDNN's verbose log for the profiler window of a CPU run: the evidence of which ISA
ran each matrix primitive (parsed by engine.analysis.cpu_evidence)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from pathlib import Path

import torch


@contextlib.contextmanager
def capture_onednn_verbose(path: Path):
    """Switch oneDNN verbose on and send fd 1 (where oneDNN prints) to `path`.

    oneDNN writes with C stdio, so both Python's and C's buffers are flushed around the
    switch; the original stdout (the worker log) is restored on every way out, an
    exception included: whatever is printed next (a traceback) belongs in the worker log.
    """
    _flush_stdout()
    saved_fd = os.dup(1)
    try:
        with open(path, "wb") as sink:
            os.dup2(sink.fileno(), 1)
            try:
                with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                    yield
            finally:
                _flush_stdout()  # never raises: fd 1 must be put back whatever happened
                os.dup2(saved_fd, 1)
    finally:
        os.close(saved_fd)


def _flush_stdout() -> None:
    """Python's and C's stdout buffers out to fd 1's file. A failed flush (a full disk) is
    not this capture's to report: the profiler window drops a log cut short by a full disk
    (loop.ProfilerWindow.close_verbose)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # ValueError: a stdout already closed
        pass
    _flush_c_stdio()


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
        pass
