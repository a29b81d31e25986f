"""Telemetry: clocks-event decoding, NVML raw-value conversion (real H200 values), the
sampler on this machine (NVML absent for real), and the store round trip."""

from __future__ import annotations

import json
import time

import pytest
import torch

from engine.hardware.nvml import nvml_index, nvml_unavailable_reason
from engine.hardware.telemetry import (
    CLOCK_EVENT_REASONS,
    TelemetrySampler,
    decode_clock_event_reasons,
    gpm_tensor_util,
    gpu_fields_from_raw,
    is_throttled,
    nvml_snapshot,
)
from engine.schema import TELEMETRY_COLUMNS

NVML_MISSING = nvml_unavailable_reason()
needs_no_nvml = pytest.mark.skipif(NVML_MISSING is None,
                                   reason="NVML is present here; this tests the NVML-absent path")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs an NVIDIA GPU with a driver (NVML) and CUDA torch")


# ---------------------------------------------------------------------------------------
# decoding


@pytest.mark.parametrize("mask, words", [
    (0x0, []),
    (0x1, ["idle"]),
    (0x4, ["sw power cap"]),                      # H100 at its power limit under load
    (0x5, ["idle", "sw power cap"]),
    (0x60, ["sw thermal", "hw thermal"]),
    (0x88, ["hw slowdown", "hw power brake"]),
    (0x2, ["applications clocks setting"]),
    (0x110, ["sync boost", "display clock setting"]),
    (0x1FF, [word for _bit, word in CLOCK_EVENT_REASONS]),
    (0x404, ["sw power cap", "unknown 0x400"]),   # a bit a newer driver may add
])
def test_decode_clock_event_reasons(mask, words):
    assert decode_clock_event_reasons(mask) == words


def test_bits_match_the_nvml_bindings():
    import pynvml

    named = {
        "nvmlClocksEventReasonGpuIdle": "idle",
        "nvmlClocksEventReasonApplicationsClocksSetting": "applications clocks setting",
        "nvmlClocksEventReasonSwPowerCap": "sw power cap",
        "nvmlClocksEventReasonHwSlowdown": "hw slowdown",
        "nvmlClocksEventReasonSyncBoost": "sync boost",
        "nvmlClocksEventReasonSwThermalSlowdown": "sw thermal",
        "nvmlClocksEventReasonHwThermalSlowdown": "hw thermal",
        "nvmlClocksEventReasonHwPowerBrakeSlowdown": "hw power brake",
        "nvmlClocksEventReasonDisplayClockSetting": "display clock setting",
    }
    for constant, word in named.items():
        assert decode_clock_event_reasons(getattr(pynvml, constant)) == [word], constant


@pytest.mark.parametrize("reasons, throttled", [
    ([], False), (None, False), ("", False), (["idle"], False), ("idle", False),
    (["sw power cap"], True), ("idle, sw thermal", True), (["idle", "hw slowdown"], True),
])
def test_is_throttled_ignores_idle(reasons, throttled):
    assert is_throttled(reasons) is throttled


def test_gpu_fields_from_raw_h200_under_load():
    # Values as NVML reports them on an H200 running a bf16 GEMM loop at its power cap.
    raw = {"gpu_util_pct": 100, "mem_util_pct": 62, "mem_used_bytes": 81_604_378_624,
           "power_mw": 689_512, "power_limit_mw": 700_000, "temp_c": 61,
           "sm_clock_mhz": 1755, "clocks_event_mask": 0x4}
    fields = gpu_fields_from_raw(raw)
    assert fields == {"gpu_util_pct": 100.0, "mem_util_pct": 62.0,
                      "gpu_mem_used_bytes": 81_604_378_624, "power_w": 689.512,
                      "power_limit_w": 700.0, "temp_c": 61.0, "sm_clock_mhz": 1755.0,
                      "throttle_reasons": "sw power cap", "sm_clock_max_mhz": None,
                      "gpu_other_procs": None}
    host_fields = {"t_s", "cpu_pct", "rss_bytes", "load_per_core", "others_cpu_cores", "steal_pct"}
    assert set(fields) | host_fields == set(TELEMETRY_COLUMNS)


def test_gpu_fields_idle_and_unsupported():
    idle = gpu_fields_from_raw({"clocks_event_mask": 0x1, "power_mw": 71_000})
    assert idle["throttle_reasons"] == "idle" and not is_throttled(idle["throttle_reasons"])
    assert gpu_fields_from_raw({"clocks_event_mask": 0})["throttle_reasons"] == ""
    # A GeForce board that does not report power or throttle reasons: None, not a crash.
    none = gpu_fields_from_raw({})
    assert all(value is None for value in none.values())


def test_nvml_index():
    assert nvml_index("cpu") is None
    assert nvml_index("cuda") == 0
    assert nvml_index("cuda:3") == 3


# ---------------------------------------------------------------------------------------
# NVML absent (real on this machine)


@needs_no_nvml
def test_nvml_absent_is_reported_not_raised():
    assert isinstance(NVML_MISSING, str) and NVML_MISSING
    snapshot = nvml_snapshot(0)
    assert snapshot["available"] is False and snapshot["reason"] == NVML_MISSING
    value, reason = gpm_tensor_util(0, 0.1)
    assert value is None and "NVML not available" in reason


@needs_no_nvml
def test_sampler_without_nvml_still_records_cpu_fields():
    batches: list[list[dict]] = []
    sampler = TelemetrySampler("cuda:0", batches.append, interval_s=0.05, flush_interval_s=0.1)
    sampler.start()
    _busy(0.4)
    sampler.stop()
    rows = [row for batch in batches for row in batch]
    assert rows, "no rows recorded"
    assert sampler.nvml_reason == NVML_MISSING
    for row in rows:
        assert tuple(row) == TELEMETRY_COLUMNS
        assert row["gpu_util_pct"] is None and row["power_w"] is None
        assert row["rss_bytes"] > 0
    # cpu_pct needs an interval of >= MIN_SAMPLE_INTERVAL_S; at 20 Hz most samples carry none.
    assert any(row["cpu_pct"] is not None for row in rows)


# ---------------------------------------------------------------------------------------
# the sampler


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(2000))


def test_sampler_rows_batches_and_flush_on_stop():
    batches: list[list[dict]] = []
    start_s = time.time()
    sampler = TelemetrySampler("cpu", batches.append, interval_s=0.05, flush_interval_s=0.2)
    sampler.start()
    busy_started = time.monotonic()
    _busy(0.7)
    # ~14 samples in 0.7 s on a quiet machine; a loaded one may give the sampler thread
    # fewer turns: stay busy (bounded) until two hand-overs of five rows in all arrived.
    while (len(batches) < 2 or sum(map(len, batches)) < 5) and time.monotonic() - busy_started < 10:
        _busy(0.1)
    busy_s = time.monotonic() - busy_started
    sampler.stop()
    assert not sampler._thread.is_alive()
    rows = [row for batch in batches for row in batch]
    assert len(batches) >= 2, "rows must be handed over periodically, not only at stop"
    assert 5 <= len(rows) <= busy_s / 0.05 + 3  # never more than one per interval
    assert sampler.rows_emitted == len(rows)
    times = [row["t_s"] for row in rows]
    assert times == sorted(times) and start_s - 1 < times[0] and times[-1] < time.time() + 1
    assert all(tuple(row) == TELEMETRY_COLUMNS for row in rows)
    assert max(row["cpu_pct"] or 0 for row in rows) > 0  # we kept this process busy
    assert all(row["gpu_util_pct"] is None for row in rows)  # CPU device: no GPU fields


def test_default_rate_is_2_hz():
    sampler = TelemetrySampler("cpu", lambda rows: None)
    assert sampler.interval_s == 0.5 and sampler.flush_interval_s == 1.0
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler("cpu", lambda rows: None, interval_s=0)


def test_failing_consumer_does_not_stop_sampling(capsys):
    calls = []

    def broken(rows):
        calls.append(len(rows))
        raise RuntimeError("database is locked")

    sampler = TelemetrySampler("cpu", broken, interval_s=0.03, flush_interval_s=0.06).start()
    time.sleep(0.4)
    assert sampler._thread.is_alive()
    sampler.stop()
    assert len(calls) >= 2 and "database is locked" in sampler.last_error
    assert capsys.readouterr().err.count("dropping rows") == 1  # said once, not per flush


def test_sampler_rows_round_trip_through_the_store(store):
    from engine.config import RunConfig

    run_id = store.create_run(RunConfig(device="cpu"), "cpu")
    with TelemetrySampler("cpu", lambda rows: store.write_telemetry(run_id, rows),
                          interval_s=0.05, flush_interval_s=0.1):
        # 0.3 s gives ~6 samples on a quiet machine; a loaded one may give the sampler
        # thread fewer turns, so keep the main thread busy (bounded) until three landed.
        deadline = time.monotonic() + 10.0
        _busy(0.3)
        while (len(store.read_telemetry(run_id, max_points=None)) < 3
               and time.monotonic() < deadline):
            _busy(0.1)
    frame = store.read_telemetry(run_id, max_points=None)
    assert len(frame) >= 3
    assert list(frame.columns) == [*TELEMETRY_COLUMNS, "rank"]
    assert (frame["rank"] == 0).all()  # a single-process run is rank 0
    assert (frame["rss_bytes"] > 0).all()


def test_stop_is_prompt_and_idempotent():
    sampler = TelemetrySampler("cpu", lambda rows: None, interval_s=5.0).start()
    start_s = time.monotonic()
    sampler.stop()
    sampler.stop()
    assert time.monotonic() - start_s < 1.0  # does not wait out the 5 s interval
    assert not sampler._thread.is_alive()


# ---------------------------------------------------------------------------------------
# GPU only


@needs_cuda
def test_sampler_on_gpu_reads_nvml():
    rows: list[dict] = []
    with TelemetrySampler("cuda:0", rows.extend, interval_s=0.1, flush_interval_s=0.2):
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()
        time.sleep(0.3)
    assert rows and rows[-1]["sm_clock_mhz"] and rows[-1]["gpu_mem_used_bytes"]
    assert rows[-1]["throttle_reasons"] is not None


@needs_cuda
def test_nvml_snapshot_on_gpu():
    snapshot = nvml_snapshot(0)
    assert snapshot["available"] is True and snapshot["name"]
    assert snapshot["clocks_mhz"]["max_sm"]
    assert isinstance(snapshot["throttle_reasons"], list)


# ---------------------------------------------------------------------------------------
# NVML query assembly against an H200-like NVML (the real library is absent here)


class H200Nvml:
    """The pynvml calls the snapshot makes, answering as an H200 at its power cap does.

    Uses pynvml's own constants and exception classes; `unsupported` names the queries
    that raise NVMLError_NotSupported, as GeForce boards do for ECC and some for power.
    """

    def __init__(self, unsupported: tuple[str, ...] = ()):
        import pynvml

        self._pynvml = pynvml
        self.unsupported = set(unsupported)

    def __getattr__(self, name):
        pynvml = self.__dict__["_pynvml"]
        if name.startswith("NVML"):
            return getattr(pynvml, name)
        answers = {
            "nvmlDeviceGetUtilizationRates": lambda h: _Util(gpu=100, memory=62),
            "nvmlDeviceGetMemoryInfo": lambda h: _Mem(used=81_604_378_624),
            "nvmlDeviceGetPowerUsage": lambda h: 689_512,
            "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
            "nvmlDeviceGetPowerManagementDefaultLimit": lambda h: 700_000,
            "nvmlDeviceGetTemperature": lambda h, sensor: 61,
            "nvmlDeviceGetTemperatureThreshold": lambda h, kind: {
                pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 87,
                pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92}.get(kind, 0),
            "nvmlDeviceGetClockInfo": lambda h, clock: {
                pynvml.NVML_CLOCK_SM: 1755, pynvml.NVML_CLOCK_MEM: 3201,
                pynvml.NVML_CLOCK_GRAPHICS: 1755}[clock],
            "nvmlDeviceGetMaxClockInfo": lambda h, clock: {
                pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}[clock],
            "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x4,
            "nvmlDeviceGetName": lambda h: "NVIDIA H200",
            "nvmlDeviceGetPerformanceState": lambda h: 0,
            "nvmlDeviceGetEccMode": lambda h: [1, 1],
            "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 0,
        }
        if name not in answers:
            raise AttributeError(name)
        if name in self.unsupported:
            def not_supported(*_args):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return not_supported
        return answers[name]


class _Util:
    def __init__(self, gpu, memory):
        self.gpu, self.memory = gpu, memory


class _Mem:
    def __init__(self, used):
        self.used = used


def test_snapshot_assembly_h200():
    from engine.hardware.telemetry import read_gpu_raw, snapshot_from

    nvml = H200Nvml()
    snap = snapshot_from(nvml, handle=object(), index=0)
    json.dumps(snap)
    assert snap["name"] == "NVIDIA H200" and snap["pstate"] == "P0"
    assert snap["clocks_mhz"] == {"sm": 1755, "mem": 3201, "graphics": 1755, "max_sm": 1980,
                                  "max_mem": 3201}
    assert snap["power_w"] == 689.512 and snap["power_limit_w"] == 700.0
    assert snap["temp_slowdown_c"] == 87 and snap["throttle_reasons"] == ["sw power cap"]
    assert snap["throttled"] is True
    assert snap["ecc_errors"] == {"volatile_corrected": 0, "volatile_uncorrected": 0,
                                  "aggregate_uncorrected": 0}
    row = gpu_fields_from_raw(read_gpu_raw(nvml, object()))
    assert row["throttle_reasons"] == "sw power cap" and row["sm_clock_mhz"] == 1755.0


def test_each_unsupported_query_gives_none_not_a_crash():
    from engine.hardware.telemetry import snapshot_from

    nvml = H200Nvml(unsupported=("nvmlDeviceGetPowerUsage", "nvmlDeviceGetEccMode",
                                 "nvmlDeviceGetCurrentClocksEventReasons",
                                 "nvmlDeviceGetMaxClockInfo"))
    snap = snapshot_from(nvml, handle=object(), index=0)
    assert snap["power_w"] is None and snap["ecc_errors"] is None
    assert snap["throttle_reasons"] is None and snap["throttled"] is None
    assert snap["clocks_mhz"]["max_sm"] is None and snap["clocks_mhz"]["sm"] == 1755
    assert snap["temp_c"] == 61.0  # the rest still answered
