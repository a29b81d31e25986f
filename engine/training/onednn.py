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
    switch; the original stdout (the worker log) is restored afterwards.
    """
    sys.stdout.flush()
    _flush_c_stdio()
    saved_fd = os.dup(1)
    try:
        with open(path, "wb") as sink:
            os.dup2(sink.fileno(), 1)
            try:
                with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                    yield
            finally:
                sys.stdout.flush()
                _flush_c_stdio()
                os.dup2(saved_fd, 1)
    finally:
        os.close(saved_fd)


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
        pass
