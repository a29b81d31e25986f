"""Peak FLOP/s per device and compute dtype: the denominator of MFU.

Known GPUs: the dense datasheet figures of engine.hardware.gpus (sources in
docs/precision-reference.md#peak-throughput), matched on the exact device name NVML/torch
report. Anything else (a CPU, an unlisted GPU): measured with a short
matmul microbenchmark of that dtype and cached in `$PRECISION_LAB_HOME/peaks_cache.json`,
so workers do not re-measure on every run. Where no honest peak exists (tf32 on a V100,
fp8 on a CPU), the answer is None with the reason: MFU is then omitted, not invented.

A measured peak must not be poisoned by a busy machine (one 0.22 GFLOP/s record taken
under load once turned every later fp32 MFU into "n/a"). So (docs/precision-reference.md
#measured-peaks):
- it is the best of many timed trials, each at least MIN_TRIAL_S long (the max is the
  statistic for a peak: load only ever slows a trial down);
- the contention probe watches the measurement; a figure taken while busy is used for
  nothing and never kept: MFU is omitted for that run, with the reason;
- it must lie inside what the CPU's ISA and clock allow (`plausible_range`);
- the record keeps when, where from and under what load it was taken; a stored record
  that was busy, is implausible, or that a run has since beaten (`note_achieved`) is
  measured again; the device check replaces it with its own measurement (`record_check`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.config import Precision
from engine.hardware.contention import ContentionProbe, sample_causes, sample_is_busy
from engine.hardware.cpu_units import NATIVE, cpu_matrix_unit, vector_isa
from engine.hardware.devices import EMULATED, UNSUPPORTED, DeviceInfo, mode_support
from engine.hardware.dtypes import restore_tf32_flags, set_tf32, tf32_flags, torch_dtype
from engine.hardware.gpus import DATASHEET_TFLOPS, datasheet_row
from engine.proc import make_private
from engine.store import default_home

COMPUTE_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
CACHE_FILENAME = "peaks_cache.json"
MEASURE_BUDGET_S = 1.5
MIN_TRIAL_S = 0.05  # a trial shorter than this is mostly timer and wake-up noise
SOURCE_MEASURED = "measured (matmul microbenchmark)"
SOURCE_NA = "n/a"
RECORD_VERSION = 2  # records without the load evidence (version 1) are measured again

# The precision mode whose support decides whether a dtype can be measured on a device.
_MODE_FOR_DTYPE = {
    "fp32": Precision.FP32, "tf32": Precision.TF32, "fp16": Precision.FP16_AMP,
    "bf16": Precision.BF16_AMP, "fp8": Precision.FP8,
}


@dataclass
class PeakInfo:
    flops_per_s: float | None  # FLOP/s (not TFLOP/s); None when there is no honest peak
    source: str                # "datasheet (<row>)" | "measured (matmul microbenchmark)" | "n/a"
    note: str                  # why this peak, or why none
    label: str = ""            # what MFU is relative to, in words: "measured ... at <when>"
    record: dict[str, Any] = field(default_factory=dict)  # a measured peak's record
    measurable: bool = False   # None now, but a measurement (measure=True) could give one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------
# names and dtypes


def _check_dtype(compute_dtype: str) -> None:
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype={compute_dtype!r}: choose one of "
                         f"{', '.join(COMPUTE_DTYPES)}")


# ---------------------------------------------------------------------------------------
# peak_for


def peak_for(device: DeviceInfo, compute_dtype: str, measure: bool = True) -> PeakInfo:
    """The peak FLOP/s to divide achieved FLOP/s by, with where it came from.

    `measure=False` never runs a benchmark: it answers from the datasheet or the cache
    only (for a UI that must not stall), else n/a.
    """
    _check_dtype(compute_dtype)
    if device.kind == "cuda":
        row = datasheet_row(device.name)
        if row is not None:
            return _datasheet_peak(row, compute_dtype)
    support = mode_support(device, _MODE_FOR_DTYPE[compute_dtype])
    if support.status == UNSUPPORTED:
        return PeakInfo(None, SOURCE_NA, f"{compute_dtype} cannot run on {device.name}: "
                                         f"{support.reason}")
    record, why_not = _cached_or_measured(device, compute_dtype, measure)
    if record is None:
        return PeakInfo(None, SOURCE_NA, why_not or (
            f"no datasheet peak for {device.name} and no usable measurement yet (run "
            "`python -m engine check`)"), measurable=not measure)
    return PeakInfo(record["flops_per_s"], SOURCE_MEASURED,
                    _measured_note(device, compute_dtype, support),
                    label=measured_label(compute_dtype, record), record=record)


def _datasheet_peak(row: str, compute_dtype: str) -> PeakInfo:
    tflops = DATASHEET_TFLOPS[row][compute_dtype]
    if tflops is None:
        return PeakInfo(None, SOURCE_NA, f"{row} has no {compute_dtype} matrix units, so its "
                                         f"datasheet lists no {compute_dtype} peak; MFU is "
                                         "not defined for this mode on this GPU")
    return PeakInfo(tflops * 1e12, f"datasheet ({row})",
                    f"dense {compute_dtype} peak from the vendor datasheet, no sparsity",
                    label=f"datasheet dense {compute_dtype} peak of the {row}, "
                          f"{tflops:g} TFLOP/s")


def _rate_words(flops_per_s: float) -> str:
    if flops_per_s >= 1e12:
        return f"{flops_per_s / 1e12:.3g} TFLOP/s"
    return f"{flops_per_s / 1e9:.3g} GFLOP/s"


def measured_label(compute_dtype: str, record: dict[str, Any]) -> str:
    """'measured fp32 matmul peak, 87.9 GFLOP/s (device check, 2026-12-01 21:10 UTC,
    machine quiet)': what an MFU figure is relative to."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(record.get("measured_at", 0)))
    return (f"measured {compute_dtype} matmul peak, {_rate_words(record['flops_per_s'])} "
            f"({record.get('source', 'run start')}, {when}, machine quiet)")


def _measured_note(device: DeviceInfo, compute_dtype: str, support) -> str:
    where = "this CPU" if device.kind == "cpu" else f"{device.name} (not in the datasheet table)"
    note = (f"best {compute_dtype} matmul rate measured on {where} with "
            f"{_threads_label(device)}; MFU is relative to what this machine can do")
    if support.status == EMULATED:
        note += (f". {compute_dtype} is emulated here ({support.reason}): it runs far slower "
                 f"than fp32, so MFU against the measured {compute_dtype} peak is the honest "
                 f"figure (against the fp32 peak it would look near zero); compare samples/s "
                 f"with an fp32 run to see the real cost")
    return note


def _threads_label(device: DeviceInfo) -> str:
    if device.kind != "cpu":
        return "cuBLAS"
    import torch

    return f"{torch.get_num_threads()} torch threads"


# ---------------------------------------------------------------------------------------
# measurement and cache


def cache_path() -> Path:
    return default_home() / CACHE_FILENAME


def _cache_key(device: DeviceInfo, compute_dtype: str, threads: int | None = None) -> str:
    import torch

    # Threads and torch version change the achievable rate, so they are part of the key.
    if threads is None:
        threads = torch.get_num_threads() if device.kind == "cpu" else 0
    return f"{device.key}|{device.name}|{compute_dtype}|torch {torch.__version__}|threads {threads}"


cache_key = _cache_key  # public: tests and tools address one device's record


def read_cache() -> dict[str, Any]:
    try:
        with open(cache_path(), encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # missing or half-written by a killed process: re-measure
        return {}


def _write_cache_entry(key: str, entry: dict[str, Any]) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = read_cache()
        data[key] = entry
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        make_private(tmp)  # the data directory's files are owner-only
        os.replace(tmp, path)  # atomic: concurrent workers never read a torn file
    except OSError:
        pass  # a read-only data dir only costs a re-measurement next time


def _cached_or_measured(device: DeviceInfo, compute_dtype: str, measure: bool
                        ) -> tuple[dict[str, Any] | None, str | None]:
    """(the usable record, None) or (None, why there is none). A stored record is used
    only when `usable_record` accepts it; else, with `measure`, measured again."""
    key = _cache_key(device, compute_dtype)
    entry = read_cache().get(key)
    stale = None
    if isinstance(entry, dict):
        stale = unusable_reason(entry, device, compute_dtype)
        if stale is None:
            return entry, None
    if not measure:
        return None, (f"the stored {compute_dtype} peak is not used ({stale}); it is measured "
                      "again at the next run or device check" if stale else None)
    record = measure_peak(device, compute_dtype, source="a run")
    problem = unusable_reason(record, device, compute_dtype)
    if problem is not None:
        return None, (f"{compute_dtype} peak not usable: {problem}; MFU is omitted for this "
                      "run and the peak is measured again at the next run")
    _write_cache_entry(key, record)
    return record, None


def unusable_reason(record: dict[str, Any], device: DeviceInfo, compute_dtype: str) -> str | None:
    """Why a peak record must not be used (None: it may). Checked on every read, so a
    record written by older code or under load is never trusted."""
    flops = record.get("flops_per_s")
    if not isinstance(flops, (int, float)) or not flops > 0:
        return "no figure in the record"
    if record.get("version") != RECORD_VERSION or record.get("busy") is None:
        return "recorded without the machine's load, so it may have been taken busy"
    if record["busy"]:
        return f"measured while the machine was busy ({record.get('load_words', 'load')})"
    if record.get("beaten_by_flops_per_s"):
        return (f"a run achieved {_rate_words(record['beaten_by_flops_per_s'])}, more than "
                f"this peak of {_rate_words(flops)}")
    low, high, basis = plausible_range(device, compute_dtype)
    if low is not None and flops < low:
        return (f"{_rate_words(flops)} is below {_rate_words(low)}, the least a "
                f"{compute_dtype} matmul does on this CPU ({basis})")
    if high is not None and flops > high:
        return (f"{_rate_words(flops)} is above {_rate_words(high)}, the most this CPU's "
                f"{compute_dtype} units can do ({basis})")
    return None


# FLOP per cycle per core of the vector/matrix unit that runs each dtype (two FMA pipes,
# an FMA = 2 FLOP): AVX2 8 fp32 lanes, AVX-512 16, NEON counted generously as 4 pipes x
# 4 lanes; avx512_bf16 (vdpbf16ps) two bf16 products per fp32 lane; AMX 1024 bf16/fp16
# FLOP per cycle per core (16x16x32 tile product every 16 cycles). Sources:
# docs/precision-reference.md#measured-peaks.
_FP32_FLOP_PER_CYCLE = {"AVX-512": 64, "AVX2": 32, "NEON": 32, "scalar/SSE": 16}
CEILING_MARGIN = 2.0   # turbo above the reported clock, and headroom: rejects only timer nonsense
NATIVE_FLOOR_SHARE = 0.05   # a native dtype's matmul below 5 % of its ISA peak is a busy trial
EMULATED_FLOOR_SHARE = 0.0005  # conversion/reference code: ~1 % of fp32 here; floor far below


def _flop_per_cycle(flags: frozenset[str], compute_dtype: str) -> tuple[float, bool]:
    """(FLOP per cycle per core for `compute_dtype`, is it native)."""
    fp32 = _FP32_FLOP_PER_CYCLE[vector_isa(flags)]
    unit = cpu_matrix_unit(flags, compute_dtype)
    if compute_dtype == "fp32":
        return fp32, True
    if unit.status != NATIVE:
        return fp32, False  # conversion code computes in fp32: at most the fp32 rate
    if "AMX" in unit.unit:
        return 1024.0, True
    return 2.0 * fp32, True  # avx512_bf16 dot products, avx512_fp16 vectors


def cpu_clock_ghz(cpuinfo_path: str = "/proc/cpuinfo",
                  max_freq_path: str = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
                  ) -> float | None:
    """The CPU's highest clock: cpufreq's maximum, else the highest "cpu MHz" listed."""
    try:
        with open(max_freq_path, encoding="utf-8") as handle:
            return int(handle.read().strip()) / 1e6  # kHz
    except (OSError, ValueError):
        pass
    best = None
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("cpu MHz"):
                    mhz = float(line.split(":", 1)[1])
                    best = max(best or 0.0, mhz)
    except (OSError, ValueError):
        return None
    return best / 1000.0 if best else None


def isa_peak(device: DeviceInfo, compute_dtype: str, threads: int | None = None,
             clock_ghz: float | None = None) -> tuple[float | None, bool, str]:
    """(FLOP/s, native, basis): a CPU's theoretical `compute_dtype` matmul peak from its
    ISA flags, threads x clock x FLOP/cycle of the unit that runs the dtype (a CPU's
    "datasheet" figure); (None, False, why not) where it cannot be derived."""
    if device.kind != "cpu" or not device.cpu_flags:
        return None, False, "no ISA bound for this device"
    if threads is None:
        import torch  # the thread count the measurement uses

        threads = torch.get_num_threads()
    clock_ghz = clock_ghz or cpu_clock_ghz()
    if not clock_ghz:
        return None, False, "the CPU's clock is not readable"
    per_cycle, native = _flop_per_cycle(device.cpu_flags, compute_dtype)
    peak = threads * clock_ghz * 1e9 * per_cycle
    basis = (f"{threads} thread(s) x {clock_ghz:.2f} GHz x {per_cycle:g} FLOP/cycle "
             f"= {_rate_words(peak)}" + ("" if native else f", {compute_dtype} emulated"))
    return peak, native, basis


def plausible_range(device: DeviceInfo, compute_dtype: str, threads: int | None = None,
                    clock_ghz: float | None = None) -> tuple[float | None, float | None, str]:
    """(lowest, highest) FLOP/s a `compute_dtype` matmul peak can honestly be on this
    device, and the basis in words: around the ISA peak on CPUs; GPUs not in the
    datasheet: no bound (None, None)."""
    peak, native, basis = isa_peak(device, compute_dtype, threads, clock_ghz)
    if peak is None:
        return None, None, basis
    floor = peak * (NATIVE_FLOOR_SHARE if native else EMULATED_FLOOR_SHARE)
    return floor, peak * CEILING_MARGIN, basis


def reference_peaks(device: DeviceInfo, compute_dtype: str) -> dict[str, dict[str, Any]]:
    """Both peaks an MFU can be taken against, each named, never measured here:
    "datasheet" (the GPU catalogue's dense peak; on a CPU its ISA peak) and "measured"
    (this device's stored, quiet matmul ceiling). A missing one has flops_per_s None and
    says why in its label."""
    _check_dtype(compute_dtype)
    if device.kind == "cuda":
        row = datasheet_row(device.name)
        sheet = _datasheet_peak(row, compute_dtype) if row else None
        datasheet = ({"flops_per_s": sheet.flops_per_s, "label": sheet.label or sheet.note}
                     if sheet else {"flops_per_s": None,
                                    "label": f"{device.name} is not in the datasheet table"})
    else:
        flops, _native, basis = isa_peak(device, compute_dtype)
        datasheet = {"flops_per_s": flops,
                     "label": f"ISA peak of this CPU for {compute_dtype}: {basis}"
                     if flops else f"no ISA peak: {basis}"}
    record, why_not = _cached_or_measured(device, compute_dtype, measure=False)
    measured = ({"flops_per_s": record["flops_per_s"],
                 "label": measured_label(compute_dtype, record)} if record else
                {"flops_per_s": None, "label": why_not or (
                    f"no quiet {compute_dtype} matmul measurement stored for this device "
                    "(`python -m engine check` measures one)")})
    return {"datasheet": datasheet, "measured": measured}


def measure_peak(device: DeviceInfo, compute_dtype: str, budget_s: float = MEASURE_BUDGET_S,
                 source: str = "a run") -> dict[str, Any]:
    """A peak record: the best timed trial of `measure_matmul` and the load it ran under."""
    probe = ContentionProbe()
    timing = measure_matmul(device.key, compute_dtype, budget_s=budget_s)
    return _record(timing, probe.sample(), probe.cores, device, source)


def _record(timing: "MatmulTiming", sample: dict[str, Any], cores: int, device: DeviceInfo,
            source: str) -> dict[str, Any]:
    busy = sample_is_busy(sample, cores)
    causes = sample_causes(sample, cores)
    others = sample.get("others_cpu_cores")
    return {"version": RECORD_VERSION, "flops_per_s": timing.flops_per_s, "n": timing.n,
            "trials": timing.reps, "elapsed_s": round(timing.elapsed_s, 3),
            "measured_at": time.time(), "device_name": device.name, "source": source,
            # Unmeasured load counts as busy: a figure is kept only with evidence it was quiet.
            "busy": True if busy is None else busy, "causes": causes,
            "others_cpu_cores": others, "steal_pct": sample.get("steal_pct"),
            "load_words": _load_words(sample, cores)}


def _load_words(sample: dict[str, Any], cores: int) -> str:
    """The load a measurement ran under, every measured part: steal alone can make a
    quiet-looking VM busy, and "0.0 of 2 cores" would then not say why."""
    others, steal = sample.get("others_cpu_cores"), sample.get("steal_pct")
    if others is None and steal is None:
        return "load not measured"
    parts = [f"other processes used {others:.1f} of {cores} cores"] if others is not None else []
    if steal is not None:
        parts.append(f"the hypervisor took {steal:.0f} % of the CPU time (steal)")
    return "; ".join(parts)


def record_check(device: DeviceInfo, compute_dtype: str, timing: "MatmulTiming",
                 probe: ContentionProbe) -> dict[str, Any]:
    """The device check's measurement as this device's peak record: it replaces the
    stored one when quiet and plausible (the check measures longer than a run's start).
    Returns the record, with `kept` saying whether it was stored."""
    record = _record(timing, probe.sample(), probe.cores, device, "device check")
    problem = unusable_reason(record, device, compute_dtype)
    if problem is None:
        _write_cache_entry(_cache_key(device, compute_dtype), record)
    return {**record, "kept": problem is None, "not_kept_because": problem}


def note_achieved(device: DeviceInfo, compute_dtype: str, achieved_flops_per_s: float) -> bool:
    """A run reached `achieved_flops_per_s`: if that beats the stored peak, the peak was an
    underestimate; mark it so the next run measures it again. True when marked."""
    key = _cache_key(device, compute_dtype)
    entry = read_cache().get(key)
    if not isinstance(entry, dict) or not achieved_flops_per_s:
        return False
    if achieved_flops_per_s <= float(entry.get("flops_per_s") or 0):
        return False
    _write_cache_entry(key, {**entry, "beaten_by_flops_per_s": achieved_flops_per_s})
    return True


@dataclass
class MatmulTiming:
    flops_per_s: float  # best rate over the repetitions
    n: int              # square matrix side used
    reps: int
    elapsed_s: float


def matmul_operands(device_key: str, compute_dtype: str, n: int):
    """(fn, a, b): fn(a, b) runs one n x n x n matmul in `compute_dtype`.

    fp8 goes through torch._scaled_mm (e4m3 inputs, unit scales, bf16 output); its
    second operand must be column-major, hence the transpose of a contiguous tensor.
    """
    import torch

    device = torch.device(device_key)
    if compute_dtype == "fp8":
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
        scale = torch.ones((), device=device, dtype=torch.float32)

        def fp8_mm(x, y):
            return torch._scaled_mm(x, y, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)

        return fp8_mm, a, b
    dtype = torch_dtype(compute_dtype)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return torch.matmul, a, b


class tf32_mode:
    """Context: TF32 matmuls on (tf32) or strictly off (everything else), restored after.

    Only matters on CUDA; the fp32 line of the check must not silently use TF32.
    """

    def __init__(self, device_key: str, compute_dtype: str):
        self.active = device_key.startswith("cuda")
        self.enabled = compute_dtype == "tf32"
        self._saved = None

    def __enter__(self):
        if self.active:
            self._saved = tf32_flags()
            set_tf32(self.enabled)
        return self

    def __exit__(self, *_exc):
        if self.active and self._saved is not None:
            restore_tf32_flags(self._saved)


def _sync(device_key: str) -> None:
    if device_key.startswith("cuda"):
        import torch

        torch.cuda.synchronize(torch.device(device_key))


def _time_calls(fn, a, b, device_key: str, reps: int) -> float:
    """Seconds for `reps` back-to-back calls; one sync at the end (GPU work is async)."""
    _sync(device_key)
    start_s = time.perf_counter()
    for _ in range(reps):
        fn(a, b)
    _sync(device_key)
    return time.perf_counter() - start_s


def next_matrix_side(n: int, call_s: float, target_call_s: float, max_n: int) -> int | None:
    """Double the side while one call of the doubled size (8x the work) would still take
    under `target_call_s`; None when n should stay. Pure; tested."""
    if n * 2 > max_n or call_s * 8 > target_call_s:
        return None
    return n * 2


def measure_matmul(device_key: str, compute_dtype: str, budget_s: float = MEASURE_BUDGET_S,
                   max_n: int | None = None, min_n: int | None = None) -> MatmulTiming:
    """Best achieved FLOP/s of square matmuls in `compute_dtype`, within ~`budget_s`.

    The side grows from small by doubling while one call stays short, so a slow
    (emulated) dtype keeps a small matrix, a fast one reaches a saturating size, and no
    single uninterruptible call can overrun the budget by much. A ladder rather than a
    one-shot guess because on a busy CPU a tiny matmul is dominated by thread wake-up
    (16 ms for a 128^3 fp32 matmul with another process on the cores) and would
    under-predict the rate. The best repetition is kept: the peak is what the device
    *can* do.
    """
    _check_dtype(compute_dtype)
    is_gpu = device_key.startswith("cuda")
    # CPU cap 1024: near the fp32 plateau, and one call stays short even when other
    # processes steal the cores. GPU: 8192 saturates every GPU in the datasheet table.
    max_n = max_n or (8192 if is_gpu else 1024)
    n = min(max_n, min_n or (1024 if is_gpu else 128))
    target_call_s = budget_s / 10
    start_s = None
    with tf32_mode(device_key, compute_dtype):
        while True:
            fn, a, b = matmul_operands(device_key, compute_dtype, n)
            fn(a, b)  # first call at this size: autotuning, page faults
            # The budget starts after the very first call: one-time library and thread
            # pool start-up (seconds on a busy CPU, CUDA context on a GPU) is not matmul.
            start_s = start_s or time.perf_counter()
            call_s = _time_calls(fn, a, b, device_key, 1)
            bigger = next_matrix_side(n, call_s, target_call_s, max_n)
            if bigger is None or time.perf_counter() - start_s > budget_s / 2:
                break
            del a, b
            n = bigger
        best, reps_done = _repeat_best(fn, a, b, device_key, n, start_s, budget_s)
    if call_s >= MIN_TRIAL_S:  # the ladder's last single call was a trial long enough too
        best = max(best, 2.0 * n**3 / call_s)
    return MatmulTiming(flops_per_s=best, n=n, reps=reps_done,
                        elapsed_s=time.perf_counter() - start_s)


def _repeat_best(fn, a, b, device_key: str, n: int, start_s: float,
                 budget_s: float) -> tuple[float, int]:
    """(best FLOP/s over the timed trials, trials counted). A trial is `calls` back-to-back
    calls, doubled until it lasts MIN_TRIAL_S: shorter ones are timer and wake-up noise and
    do not count (unless no trial reached that length within the budget)."""
    flops_per_call = 2.0 * n**3
    best, fallback, trials, attempts, calls = 0.0, 0.0, 0, 0, 1
    while True:
        elapsed_s = _time_calls(fn, a, b, device_key, calls)
        rate = flops_per_call * calls / elapsed_s
        attempts += 1
        if elapsed_s >= MIN_TRIAL_S:
            best, trials = max(best, rate), trials + 1
        else:
            fallback = max(fallback, rate)
        grow = 2 if elapsed_s < MIN_TRIAL_S else 1
        spent_s = time.perf_counter() - start_s
        if spent_s + elapsed_s * grow > budget_s or trials >= 50 or attempts >= 80:
            return (best, trials) if trials else (fallback, 1)
        calls *= grow


__all__ = [
    "PeakInfo", "peak_for", "measured_label",
    "COMPUTE_DTYPES", "measure_matmul", "MatmulTiming", "matmul_operands",
    "next_matrix_side", "cache_path", "read_cache",
    "tf32_mode", "measure_peak", "record_check", "note_achieved", "unusable_reason",
    "plausible_range", "cpu_clock_ghz", "MIN_TRIAL_S", "cache_key",
]
