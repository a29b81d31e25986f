"""Device telemetry at 2 Hz: NVML on CUDA GPUs, psutil for the worker process everywhere.

Why 2 Hz: peers sample every 10-15 s and lose short runs entirely; a tiny run here lasts
seconds. Why a thread of the worker (not of the UI): the numbers must describe the
process that trains, and the UI must never touch NVML (a monitoring process that holds
NVML handles in the server would outlive and confuse every run).

Every NVML query is wrapped on its own: `NotSupported` is common (power on some boards,
ECC on GeForce), and one missing value must give None, never a crash. Without an NVIDIA
driver (`NVMLError_LibraryNotFound`) the sampler still records the CPU fields.

Rows use exactly `store.TELEMETRY_COLUMNS`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from engine.hardware.contention import ContentionProbe
from engine.hardware.nvml import NvmlSession, nvml_index, nvml_query
from engine.schema import TELEMETRY_COLUMNS

# GetCurrentClocksEventReasons bits (nvml.h, nvmlClocksEventReason*), in bit order; what
# each means: docs/precision-reference.md#telemetry-facts.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "idle"),
    (0x2, "applications clocks setting"),
    (0x4, "sw power cap"),
    (0x8, "hw slowdown"),
    (0x10, "sync boost"),
    (0x20, "sw thermal"),
    (0x40, "hw thermal"),
    (0x80, "hw power brake"),
    (0x100, "display clock setting"),
)
IDLE_REASON = "idle"

DEFAULT_INTERVAL_S = 0.5  # 2 Hz
DEFAULT_FLUSH_INTERVAL_S = 1.0


# ---------------------------------------------------------------------------------------
# pure decoding


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Words for the set bits of a clocks-event (throttle) mask; [] when none.

    Bits this table does not know are kept as "unknown 0x..." so a newer driver's reason
    is shown rather than silently dropped.
    """
    mask = int(mask)
    words = [word for bit, word in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _word in CLOCK_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    if rest:
        words.append(f"unknown {rest:#x}")
    return words


def is_throttled(reasons: list[str] | str | None) -> bool:
    """True when any reason other than "idle" holds the clocks down.

    Accepts the decoded list or the ", "-joined form stored in telemetry rows. Idle is
    not throttling: an idle GPU lowers its clocks on purpose.
    """
    if not reasons:
        return False
    if isinstance(reasons, str):
        reasons = [word.strip() for word in reasons.split(",")]
    return any(word and word != IDLE_REASON for word in reasons)


def gpu_fields_from_raw(raw: dict[str, Any]) -> dict[str, Any]:
    """NVML's raw units -> telemetry fields. Pure, so it is tested with real H200 values.

    raw keys (each may be None when its query failed): gpu_util_pct, mem_util_pct,
    mem_used_bytes, power_mw, power_limit_mw, temp_c, sm_clock_mhz, clocks_event_mask.
    """
    mask = raw.get("clocks_event_mask")
    return {
        "gpu_util_pct": _float_or_none(raw.get("gpu_util_pct")),
        "mem_util_pct": _float_or_none(raw.get("mem_util_pct")),
        "gpu_mem_used_bytes": _int_or_none(raw.get("mem_used_bytes")),
        "power_w": _mw_to_w(raw.get("power_mw")),
        "power_limit_w": _mw_to_w(raw.get("power_limit_mw")),
        "temp_c": _float_or_none(raw.get("temp_c")),
        "sm_clock_mhz": _float_or_none(raw.get("sm_clock_mhz")),
        "sm_clock_max_mhz": _float_or_none(raw.get("sm_clock_max_mhz")),
        "gpu_other_procs": _int_or_none(raw.get("other_procs")),
        # "" = no reason reported; None = the query itself is unsupported here.
        "throttle_reasons": ", ".join(decode_clock_event_reasons(mask))
        if mask is not None
        else None,
    }


def _mw_to_w(value) -> float | None:
    return float(value) / 1000.0 if value is not None else None


def _float_or_none(value) -> float | None:
    return float(value) if value is not None else None


def _int_or_none(value) -> int | None:
    return int(value) if value is not None else None


def empty_row(t_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {column: None for column in TELEMETRY_COLUMNS}
    row["t_s"] = t_s
    return row


def _clocks_event_mask(nvml, handle) -> int | None:
    # Renamed from "throttle reasons" in driver 535 / nvidia-ml-py 12.535; support both.
    if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
        return nvml_query(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    return nvml_query(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)


def read_gpu_raw(nvml, handle) -> dict[str, Any]:
    """One sample of the raw NVML values the telemetry row needs; each query separately."""
    util = nvml_query(nvml, "nvmlDeviceGetUtilizationRates", handle)
    mem = nvml_query(nvml, "nvmlDeviceGetMemoryInfo", handle)
    return {
        "gpu_util_pct": util.gpu if util is not None else None,
        "mem_util_pct": util.memory if util is not None else None,
        "mem_used_bytes": mem.used if mem is not None else None,
        "power_mw": nvml_query(nvml, "nvmlDeviceGetPowerUsage", handle),
        "power_limit_mw": nvml_query(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle),
        "temp_c": nvml_query(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU),
        "sm_clock_mhz": nvml_query(nvml, "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": nvml_query(nvml, "nvmlDeviceGetMaxClockInfo", handle,
                                       nvml.NVML_CLOCK_SM),
        "other_procs": other_gpu_processes(nvml, handle),
        "clocks_event_mask": _clocks_event_mask(nvml, handle),
    }


def other_gpu_processes(nvml, handle, own_pids: set[int] | None = None) -> int | None:
    """Processes other than ours with a compute context on this GPU (None: unsupported).

    The sampler runs in the trainer, so "ours" is this process (a multi-process run puts
    one rank per GPU, each with its own sampler).
    """
    procs = nvml_query(nvml, "nvmlDeviceGetComputeRunningProcesses", handle)
    if procs is None:
        return None
    own = own_pids if own_pids is not None else {os.getpid()}
    return sum(1 for proc in procs if getattr(proc, "pid", None) not in own)


# ---------------------------------------------------------------------------------------
# the sampler thread


class ProcessStats:
    """cpu_pct and rss_bytes of one process, and the host contention fields
    (engine.hardware.contention); None fields when psutil fails.

    cpu_pct counts the process and its children (DataLoader workers): 100 = one core fully
    busy, so a training process using 8 threads can read 800. It is None on the first
    sample (no interval yet), never an artefact of a microsecond-long interval.
    """

    def __init__(self, pid: int | None = None):
        self.contention = ContentionProbe(pid)
        self.process = self.contention.process

    def sample(self) -> dict[str, Any]:
        row = self.contention.sample()
        rss_bytes = None
        if self.process is not None:
            try:
                rss_bytes = int(self.process.memory_info().rss)
            except Exception:
                pass
        row["rss_bytes"] = rss_bytes
        return row


class TelemetrySampler:
    """Samples every `interval_s` in a daemon thread; hands rows to `on_rows` about once
    a second (and once more on `stop()`).

    `on_rows` runs on the sampler thread. If it raises (e.g. the database is locked), the
    rows of that flush are dropped and the error kept in `last_error`: telemetry is
    informative and must never stop a training run.
    """

    def __init__(self, device_key: str, on_rows: Callable[[list[dict]], None],
                 interval_s: float = DEFAULT_INTERVAL_S,
                 flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S, pid: int | None = None):
        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s!r}: a positive sampling interval in "
                             "seconds, e.g. 0.5")
        self.device_key = device_key
        self.on_rows = on_rows
        self.interval_s = float(interval_s)
        self.flush_interval_s = float(flush_interval_s)
        self.pid = pid
        self.nvml_reason: str | None = None  # why GPU fields are None, when they are
        self.last_error: str | None = None
        self.rows_emitted = 0
        self._rows: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: NvmlSession | None = None
        self._process: ProcessStats | None = None
        self.latest: dict[str, Any] | None = None  # the last sample (the session marks steps)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> "TelemetrySampler":
        if self._thread is not None:
            return self
        self._process = ProcessStats(self.pid)
        index = nvml_index(self.device_key)
        if index is not None:
            self._nvml = NvmlSession(index).open()
            self.nvml_reason = self._nvml.reason
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling, join the thread and flush what is buffered."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._flush()
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def __enter__(self) -> "TelemetrySampler":
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    # -- sampling ----------------------------------------------------------------------
    def sample(self) -> dict[str, Any]:
        """One row now (also usable without the thread)."""
        row = empty_row(time.time())
        if self._process is None:
            self._process = ProcessStats(self.pid)
        row.update(self._process.sample())
        session = self._nvml
        if session is not None and session.handle is not None:
            row.update(gpu_fields_from_raw(read_gpu_raw(session.nvml, session.handle)))
        return row

    def _loop(self) -> None:
        # Schedule on the monotonic clock so samples do not drift by the sampling cost.
        next_sample_s = time.monotonic()
        last_flush_s = next_sample_s
        while not self._stop.is_set():
            self.latest = self.sample()
            self._rows.append(self.latest)
            now_s = time.monotonic()
            if now_s - last_flush_s >= self.flush_interval_s:
                self._flush()
                last_flush_s = now_s
            next_sample_s += self.interval_s
            if next_sample_s < now_s:  # we fell behind (a stalled GIL): do not burst
                next_sample_s = now_s + self.interval_s
            self._stop.wait(max(0.0, next_sample_s - time.monotonic()))

    def _flush(self) -> None:
        rows, self._rows = self._rows, []
        if not rows:
            return
        try:
            self.on_rows(rows)
            self.rows_emitted += len(rows)
        except Exception as exc:
            if self.last_error is None:  # say it once, not twice a second
                print(f"[telemetry] dropping rows: {type(exc).__name__}: {exc}", file=sys.stderr)
            self.last_error = f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------
# one-off snapshot and GPM (for the check)


def nvml_snapshot(index: int) -> dict[str, Any]:
    """A JSON-ready picture of one GPU now: clocks, power, temperatures, throttle, ECC.

    `available` False with `reason` when NVML cannot be used; otherwise each value is
    None where its query is unsupported.
    """
    with NvmlSession(index) as session:
        if session.handle is None:
            return {"available": False, "reason": session.reason, "index": index}
        return snapshot_from(session.nvml, session.handle, index)


def snapshot_from(nvml, handle, index: int) -> dict[str, Any]:
    """The snapshot's queries against an initialised NVML module and a device handle."""
    raw = read_gpu_raw(nvml, handle)
    fields = gpu_fields_from_raw(raw)
    mask = raw["clocks_event_mask"]
    reasons = decode_clock_event_reasons(mask) if mask is not None else None
    name = nvml_query(nvml, "nvmlDeviceGetName", handle)
    return {
        "available": True,
        "reason": None,
        "index": index,
        "name": name.decode() if isinstance(name, bytes) else name,
        "pstate": _pstate(nvml, handle),
        "gpu_util_pct": fields["gpu_util_pct"],
        "mem_util_pct": fields["mem_util_pct"],
        "gpu_mem_used_bytes": fields["gpu_mem_used_bytes"],
        "clocks_mhz": _clocks(nvml, handle),
        "power_w": fields["power_w"],
        "power_limit_w": fields["power_limit_w"],
        "power_default_limit_w": _mw_to_w(
            nvml_query(nvml, "nvmlDeviceGetPowerManagementDefaultLimit", handle)),
        "temp_c": fields["temp_c"],
        "temp_slowdown_c": _threshold(nvml, handle, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
        "temp_shutdown_c": _threshold(nvml, handle, "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
        "throttle_mask": mask,
        "throttle_reasons": reasons,
        "throttled": is_throttled(reasons) if reasons is not None else None,
        "ecc_errors": _ecc_errors(nvml, handle),
    }


def _pstate(nvml, handle) -> str | None:
    value = nvml_query(nvml, "nvmlDeviceGetPerformanceState", handle)
    return f"P{value}" if value is not None else None


def _clocks(nvml, handle) -> dict[str, int | None]:
    get, get_max = "nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo"
    return {
        "sm": nvml_query(nvml, get, handle, nvml.NVML_CLOCK_SM),
        "mem": nvml_query(nvml, get, handle, nvml.NVML_CLOCK_MEM),
        "graphics": nvml_query(nvml, get, handle, nvml.NVML_CLOCK_GRAPHICS),
        "max_sm": nvml_query(nvml, get_max, handle, nvml.NVML_CLOCK_SM),
        "max_mem": nvml_query(nvml, get_max, handle, nvml.NVML_CLOCK_MEM),
    }


def _threshold(nvml, handle, constant: str) -> int | None:
    kind = getattr(nvml, constant, None)
    if kind is None:
        return None
    return nvml_query(nvml, "nvmlDeviceGetTemperatureThreshold", handle, kind)


def _ecc_errors(nvml, handle) -> dict[str, int | None] | None:
    """Corrected/uncorrected ECC counts; None when the GPU has no ECC (GeForce) or it is off."""
    mode = nvml_query(nvml, "nvmlDeviceGetEccMode", handle)
    if not mode or not mode[0]:  # (current, pending); 0 = disabled
        return None
    get = "nvmlDeviceGetTotalEccErrors"
    return {
        "volatile_corrected": nvml_query(
            nvml, get, handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
        ),
        "volatile_uncorrected": nvml_query(
            nvml, get, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
        "aggregate_uncorrected": nvml_query(
            nvml, get, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC
        ),
    }


GPM_ANY_TENSOR_UTIL = 5  # NVML_GPM_METRIC_ANY_TENSOR_UTIL: % of time any tensor pipe was busy


def gpm_tensor_util(index: int, duration_s: float = 0.5) -> tuple[float | None, str]:
    """Counter-based Tensor-Core activity (%) over `duration_s`, via NVML GPM (Hopper+).

    Returns (percent, how it was measured) or (None, why not). Start the GPU work
    *before* calling: GPU work is asynchronous, so queue enough of it to cover the window.
    This is ground truth where the kernel-name evidence can only infer.
    """
    with NvmlSession(index) as session:
        if session.handle is None:
            return None, f"NVML not available: {session.reason}"
        nvml, handle = session.nvml, session.handle
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return None, "this nvidia-ml-py has no GPM API (needs nvidia-ml-py >= 12.520)"
        support = nvml_query(nvml, "nvmlGpmQueryDeviceSupport", handle)
        if support is None or not support.isSupportedDevice:
            return None, ("NVML GPM metrics are not supported on this GPU/driver "
                          "(they need Hopper or newer and a recent driver)")
        try:
            return _gpm_sample_pair(nvml, handle, duration_s)
        except Exception as exc:
            return None, f"NVML GPM query failed: {type(exc).__name__}: {exc}"


def _gpm_sample_pair(nvml, handle, duration_s: float) -> tuple[float | None, str]:
    first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    try:
        nvml.nvmlGpmSampleGet(handle, first)
        time.sleep(max(0.1, duration_s))  # GPM needs samples >= 100 ms apart
        nvml.nvmlGpmSampleGet(handle, second)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = first
        request.sample2 = second
        request.metrics[0].metricId = GPM_ANY_TENSOR_UTIL
        nvml.nvmlGpmMetricsGet(request)
        metric = request.metrics[0]
        if metric.nvmlReturn != nvml.NVML_SUCCESS:
            return None, f"GPM metric ANY_TENSOR_UTIL returned NVML error {metric.nvmlReturn}"
        return float(metric.value), f"NVML GPM ANY_TENSOR_UTIL over {duration_s:.1f} s"
    finally:
        nvml_query(nvml, "nvmlGpmSampleFree", first)
        nvml_query(nvml, "nvmlGpmSampleFree", second)


__all__ = [
    "CLOCK_EVENT_REASONS", "TelemetrySampler", "decode_clock_event_reasons", "is_throttled",
    "gpu_fields_from_raw", "read_gpu_raw", "nvml_snapshot", "snapshot_from", "gpm_tensor_util",
    "ProcessStats",
]
