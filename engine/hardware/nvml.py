"""The one NVML wrapper. Every query is wrapped on its own: `NotSupported` is common
(power on some boards, ECC on GeForce), and one missing value must give None, never a
crash. Without an NVIDIA driver (`NVMLError_LibraryNotFound`) nothing here raises: the
callers get None and the reason.

NVML reference-counts nvmlInit/nvmlShutdown, so several sessions in one process are fine.
Device discovery (engine.hardware.devices), telemetry, the snapshot and the GPM counter
(engine.hardware.telemetry) all go through here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def nvml_library() -> Iterator[tuple[Any, str | None]]:
    """(pynvml initialised, None) or (None, why NVML cannot be used here)."""
    try:
        import pynvml  # optional at run time: a machine without the bindings has no NVML
    except ImportError:
        yield None, "the nvidia-ml-py package (import pynvml) is not installed"
        return
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded: no driver here
        yield None, f"{type(exc).__name__}: {exc}"
        return
    try:
        yield pynvml, None
    finally:
        nvml_call(pynvml.nvmlShutdown)




def nvml_call(fn, *args):
    """One NVML query; any error (NotSupported, NoPermission, GPU lost) becomes None."""
    try:
        return fn(*args)
    except Exception:
        return None


def nvml_query(nvml, function_name: str, *args):
    """nvml_call by name: an older nvidia-ml-py without that function also gives None."""
    fn = getattr(nvml, function_name, None)
    return nvml_call(fn, *args) if fn is not None else None


def nvml_index(device_key: str) -> int | None:
    """'cuda:N' -> NVML index N (devices.py keys GPUs by NVML index); None for the CPU."""
    if not device_key.startswith("cuda"):
        return None
    _, _, index = device_key.partition(":")
    return int(index) if index else 0


class NvmlSession:
    """nvmlInit ... nvmlShutdown around one device handle. `handle` is None with `reason`."""

    def __init__(self, index: int):
        self.index = index
        self.handle = None
        self.reason: str | None = None
        self._pynvml = None
        self._initialised = False

    def open(self) -> "NvmlSession":
        self._library = nvml_library()
        pynvml, self.reason = self._library.__enter__()
        if pynvml is None:
            return self
        self._pynvml, self._initialised = pynvml, True
        try:
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as exc:
            self.reason = f"no NVML device {self.index} ({type(exc).__name__}: {exc})"
        return self

    @property
    def nvml(self):
        return self._pynvml

    def close(self) -> None:
        if self._initialised:
            self._library.__exit__(None, None, None)
            self._initialised = False
            self.handle = None

    def __enter__(self) -> "NvmlSession":
        return self.open()

    def __exit__(self, *_exc) -> None:
        self.close()


def nvml_unavailable_reason() -> str | None:
    """None when NVML initialises here; otherwise why not (e.g. library not found)."""
    with NvmlSession(0) as session:
        if session.nvml is None:
            return session.reason
    return None
