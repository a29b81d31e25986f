"""The sanity check of one device: is each precision as fast as this hardware should be,
and did its matrix work run on Tensor Cores?

Per compute dtype: a matmul microbenchmark (achieved FLOP/s, ratio to the datasheet peak,
speed-up over fp32); on a GPU also a profiled matmul whose kernel names say whether Tensor
Cores ran it (engine.traces.kernels), and on Hopper+ the NVML GPM tensor-pipe counter; on a CPU
the native/emulated verdict of devices.mode_support. Then device memory copy bandwidth
and, on a GPU, an NVML snapshot (clocks, power, throttle reasons, ECC).

Bounded: every stage gets a share of `time_budget_s`; the measurement ladder in
peaks.measure_matmul keeps single calls short. Results are plain JSON.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any, Callable

from engine.analysis.cpu_evidence import cpu_mode_words, kind_table
from engine.config import ConfigError, Precision
from engine.diagnostics.onednn_probe import refresh_probe
from engine.hardware.contention import ContentionProbe
from engine.hardware.devices import (
    EMULATED,
    NATIVE,
    UNSUPPORTED,
    DeviceInfo,
    ModeSupport,
    get_device,
    list_devices,
    mode_support,
    resolve_device_key,
    torch_build,
)
from engine.hardware.gpus import datasheet_row
from engine.hardware.nvml import nvml_index, nvml_unavailable_reason
from engine.hardware.peaks import (
    COMPUTE_DTYPES,
    _sync,
    isa_peak,
    matmul_operands,
    measure_matmul,
    peak_for,
    record_check,
    tf32_mode,
)
from engine.hardware.telemetry import gpm_tensor_util, nvml_snapshot
from engine.proc import PROJECT_ROOT
from engine.traces.kernels import classify_kernel

OK, SLOW, NOT_SUPPORTED, SKIPPED = "ok", "slow", "not supported", "skipped"
VERDICTS = (OK, SLOW, NOT_SUPPORTED, SKIPPED)
SLOW_RATIO_TO_PEAK = 0.5  # under half the datasheet peak on a saturating matmul is "slow"
IMPLAUSIBLE_RATIO_TO_PEAK = 1.15  # boost clocks give a few % over the datasheet, never 15 %
STAGE_CAP_S = 2.0         # more time per dtype does not make the number better
MATRIX_CATEGORIES = ("gemm", "conv", "attention")
# Matmul dtypes that should run on Tensor Cores on a GPU that has them (fp32 has TF32 off).
TENSOR_CORE_DTYPES = ("tf32", "fp16", "bf16", "fp8")

_MODE_FOR_DTYPE = {"fp32": Precision.FP32, "tf32": Precision.TF32, "fp16": Precision.FP16_AMP,
                   "bf16": Precision.BF16_AMP, "fp8": Precision.FP8}

ProgressFn = Callable[[float, str], None]


# ---------------------------------------------------------------------------------------
# what can run where


def dtype_support(dev: DeviceInfo, dtype: str) -> ModeSupport:
    """Whether a bare matmul in `dtype` runs natively here. For fp8 on a GPU only the
    hardware counts (torch._scaled_mm, sm89+); torchao matters for training, not here."""
    if dtype == "fp8" and dev.kind == "cuda" and dev.torch_usable:
        cc = dev.compute_capability or (0, 0)
        if cc >= (8, 9):
            return ModeSupport(
                NATIVE, f"fp8 (e4m3) matmul via torch._scaled_mm on sm{cc[0]}{cc[1]}"
            )
    return mode_support(dev, _MODE_FOR_DTYPE[dtype])


def no_gpu_reason() -> str | None:
    """None when PyTorch can use a CUDA GPU here; otherwise the plain reason why not.

    Answered without importing torch (the GPU check page asks it inside the server): the
    build from torch's own version file, the GPUs from NVML (engine.hardware.devices).
    """
    version, cuda = torch_build()
    if cuda is not None and any(d.kind == "cuda" and d.torch_usable for d in list_devices()):
        return None
    parts = []
    if cuda is None:
        parts.append(f"this PyTorch ({version}) is a CPU-only build")
    else:
        parts.append(f"PyTorch {version} (CUDA {cuda}) sees no GPU")
    nvml_reason = nvml_unavailable_reason()
    if nvml_reason:
        parts.append(f"no NVIDIA driver found (NVML: {nvml_reason})")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------
# kernels from a profiler trace


def kernel_events(trace: dict | list) -> list[tuple[str, float]]:
    """(name, duration_us) of every GPU kernel in a Chrome trace (both schema variants:
    cat "kernel" in current traces, "Kernel" in old ones)."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    found = []
    for event in events:
        if isinstance(event, dict) and str(event.get("cat", "")).lower() == "kernel":
            found.append((str(event.get("name", "")), float(event.get("dur", 0.0) or 0.0)))
    return found


def summarize_kernels(events: list[tuple[str, float]], top: int = 5) -> list[dict[str, Any]]:
    """Group by name, classify each with engine.traces.kernels, longest total time first."""
    total_us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for name, dur_us in events:
        total_us[name] += dur_us
        count[name] += 1
    rows = []
    for name in sorted(total_us, key=total_us.get, reverse=True)[:top]:
        verdict = classify_kernel(name)
        rows.append({"name": name, "total_us": round(total_us[name], 3), "count": count[name],
                     "category": verdict.category, "tensor_core": verdict.tensor_core,
                     "dtype": verdict.dtype, "reason": verdict.reason})
    return rows


def tensor_core_of(kernels: list[dict[str, Any]]) -> tuple[str, str]:
    """("yes"|"no"|"unknown", evidence) from the longest-running matrix kernel."""
    if not kernels:
        return "unknown", ("the profiler recorded no GPU kernels (CUPTI unavailable?), so "
                           "there is no evidence either way")
    matrix = [k for k in kernels if k["category"] in MATRIX_CATEGORIES]
    if not matrix:
        return "unknown", f"no matrix kernel among the top kernels (top: {kernels[0]['name'][:80]})"
    main = max(matrix, key=lambda k: k["total_us"])
    return main["tensor_core"], f"{main['name'][:90]} ({main['reason']})"


def profile_kernels(fn, a, b, device_key: str, calls: int = 3) -> list[dict[str, Any]]:
    """Kernel table of a few `fn(a, b)` calls under torch.profiler (CUDA only)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(a, b)
        torch.cuda.synchronize(torch.device(device_key))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as handle:
            trace = json.load(handle)
    return summarize_kernels(kernel_events(trace))


# ---------------------------------------------------------------------------------------
# verdicts (pure)


def matmul_verdict(dev_kind: str, dtype: str, support: ModeSupport, ratio_to_peak: float | None,
                   speedup_vs_fp32: float | None, tensor_core: str | None = None,
                   tc_evidence: str = "", peak_note: str = "") -> tuple[str, str]:
    """(verdict, reason) for one matmul line, readable at a glance."""
    speed = speed_words(speedup_vs_fp32) if dtype != "fp32" else ""
    if support.status == EMULATED:
        return SLOW, _join(f"emulated: {support.reason}", speed)
    if dev_kind == "cpu":
        if dtype == "fp32" or speedup_vs_fp32 is None or speedup_vs_fp32 >= 1.0:
            return OK, _join(f"native: {support.reason}", speed)
        return SLOW, _join(f"native unit, yet slower than fp32: {support.reason}", speed)
    if ratio_to_peak is not None and ratio_to_peak > IMPLAUSIBLE_RATIO_TO_PEAK:
        # Faster than the silicon can go: the timing is wrong (an unsynchronised clock, a
        # kernel that did not run), not the GPU fast. Never reported as ok.
        return SLOW, _join(f"{ratio_to_peak:.0%} of the datasheet peak is more than the GPU "
                           "can do: the timing is not trustworthy; run the check again",
                           speed)
    if dtype in TENSOR_CORE_DTYPES and tensor_core == "no":
        return SLOW, _join(f"ran on CUDA cores, not Tensor Cores: {tc_evidence}", speed)
    if ratio_to_peak is not None and ratio_to_peak < SLOW_RATIO_TO_PEAK:
        return SLOW, _join(f"{ratio_to_peak:.0%} of datasheet peak (slow = under "
                           f"{SLOW_RATIO_TO_PEAK:.0%}): check clocks, power cap and throttle "
                           "reasons in the NVML snapshot", speed, _tc_words(dtype, tensor_core))
    peak_part = (f"{ratio_to_peak:.0%} of datasheet peak" if ratio_to_peak is not None
                 else f"no datasheet peak ({peak_note})" if peak_note else "no datasheet peak")
    return OK, _join(peak_part, speed, _tc_words(dtype, tensor_core))


def speed_words(speedup_vs_fp32: float | None) -> str:
    """'2.61x fp32', or '67x slower than fp32' where a ratio like 0.015x would hide it."""
    if speedup_vs_fp32 is None or speedup_vs_fp32 <= 0:
        return ""
    if speedup_vs_fp32 < 0.5:
        return f"{1.0 / speedup_vs_fp32:.0f}x slower than fp32"
    return f"{speedup_vs_fp32:.2f}x fp32"


def _tc_words(dtype: str, tensor_core: str | None) -> str:
    if tensor_core is None:
        return ""
    if dtype == "fp32" and tensor_core == "yes":
        return "Tensor Cores: yes although TF32 is off (check the TF32 switches)"
    return f"Tensor Cores: {tensor_core}"


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


# ---------------------------------------------------------------------------------------
# the check


class _Budget:
    """Shares the remaining time among the stages still to run, by weight."""

    def __init__(self, total_s: float, weights: dict[str, float], progress: ProgressFn | None):
        self.start_s = time.perf_counter()
        self.total_s = total_s
        self.remaining = dict(weights)
        self.all_weight = sum(weights.values()) or 1.0
        self.progress = progress

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start_s

    def begin(self, stage: str, message: str) -> float | None:
        """Seconds for `stage`, or None when the budget is spent (skip it)."""
        weight = self.remaining.get(stage, 0.0)
        done = 1.0 - sum(self.remaining.values()) / self.all_weight
        self.report(done, message)
        left_s = self.total_s * 0.85 - self.elapsed_s()  # keep a margin for the tail
        if left_s <= 0.2:
            return None
        share_s = left_s * weight / (sum(self.remaining.values()) or 1.0)
        return min(STAGE_CAP_S, max(0.2, share_s))

    def end(self, stage: str) -> None:
        self.remaining.pop(stage, None)

    def report(self, fraction: float, message: str) -> None:
        if self.progress is not None:
            self.progress(max(0.0, min(1.0, fraction)), message)


def run_check(device_key: str, progress: ProgressFn | None = None,
              time_budget_s: float = 45) -> dict[str, Any]:
    """Run the whole check on `device_key` ("cpu", "cuda:N", "cuda" or "auto")."""
    dev = _device(resolve_device_key(device_key))
    dtypes = list(COMPUTE_DTYPES)
    supports = {dtype: dtype_support(dev, dtype) for dtype in dtypes}
    weights = {f"matmul {d}": 1.0 for d in dtypes if supports[d].status != UNSUPPORTED}
    weights["memory copy"] = 0.5
    if dev.kind == "cpu":
        weights["onednn probe"] = 1.0
    budget = _Budget(float(time_budget_s), weights, progress)
    budget.report(0.0, f"checking {dev.name}")

    lines: list[dict[str, Any]] = []
    fp32_value = None
    probe, probe_error = _cpu_probe(dev, budget)
    for dtype in dtypes:
        line = _matmul_line(dev, dtype, supports[dtype], budget, fp32_value, probe)
        if dtype == "fp32":
            fp32_value = line["value"]
        lines.append(line)
    lines.append(_bandwidth_line(dev, budget))
    nvml, nvml_reason = _nvml_part(dev, budget)
    budget.report(1.0, "done")
    return {
        "device": _device_dict(dev),
        "lines": lines,
        "nvml": nvml,
        "nvml_reason": nvml_reason,
        "no_gpu_reason": no_gpu_reason() if dev.kind == "cpu" else None,
        "onednn_probe_error": probe_error,
        "time_budget_s": float(time_budget_s),
        "elapsed_s": round(budget.elapsed_s(), 3),
    }


def _device(key: str) -> DeviceInfo:
    try:
        return get_device(key)
    except KeyError:
        raise ConfigError("device", key, "a device listed by `python -m engine doctor`") from None


def _device_dict(dev: DeviceInfo) -> dict[str, Any]:
    import torch

    info = dev.to_dict()
    info["torch_version"] = torch.__version__
    info["datasheet_row"] = datasheet_row(dev.name) if dev.kind == "cuda" else None
    if dev.kind == "cpu":
        info["torch_threads"] = torch.get_num_threads()
    return info


def _unit(dev: DeviceInfo) -> tuple[str, float]:
    # GFLOP/s on CPUs (TFLOP/s would print 0.1), TFLOP/s on GPUs.
    return ("GFLOP/s", 1e9) if dev.kind == "cpu" else ("TFLOP/s", 1e12)


def _line(test: str, dtype: str | None, unit: str, verdict: str, reason: str,
          **values: Any) -> dict[str, Any]:
    line = {"test": test, "dtype": dtype, "value": None, "unit": unit, "peak": None,
            "ratio_to_peak": None, "speedup_vs_fp32": None, "verdict": verdict,
            "reason": reason, "kernels": []}
    line.update(values)
    return line


def _cpu_probe(dev: DeviceInfo, budget: _Budget) -> tuple[dict | None, str | None]:
    """The oneDNN probe, run again and stored (the check refreshes it as it does the
    peaks): which implementation ran each dtype's matmul and convolution here."""
    if dev.kind != "cpu":
        return None, None
    if budget.begin("onednn probe", "oneDNN probe: which implementation runs each dtype") is None:
        budget.end("onednn probe")
        return None, f"oneDNN probe skipped: time budget of {budget.total_s:g} s spent"
    try:
        return refresh_probe(dev.key, dev.name, source="device check"), None
    except Exception as exc:  # noqa: BLE001 - the matmul lines stand without it
        return None, f"oneDNN probe failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    finally:
        budget.end("onednn probe")


def cpu_evidence_rows(probe_dtype: dict | None) -> list[dict[str, Any]]:
    """A CPU check line's evidence, in the shape of a GPU line's kernel rows (`name`
    first, the slowest first): per kind of op the oneDNN implementation that ran it in the
    probe, the unit that is, its time and the op's speed against fp32."""
    ops = (probe_dtype or {}).get("ops") or {}
    speeds = (probe_dtype or {}).get("speed_vs_fp32") or {}
    rows = []
    for op, measured in ops.items():
        table = kind_table(measured.get("primitives") or [])
        if not table and "error" not in measured:
            rows.append({"name": f"{op}: no oneDNN primitive (MKL or ATen's own code)",
                         "kind": op, "implementation": None,
                         "unit": "MKL or ATen's own code", "total_us": _us(measured.get("wall_ms")),
                         "speedup_vs_fp32": speeds.get(op), "tensor_core": "n/a (CPU)"})
        rows += [{"name": f"{row['label']}: {row['src_dtype']} {row['implementation']} "
                          f"({row['unit']})",
                  "kind": row["label"], "implementation": row["implementation"],
                  "unit": row["unit"], "total_us": _us(row["exec_ms"]),
                  "speedup_vs_fp32": speeds.get(op), "tensor_core": "n/a (CPU)"}
                 for row in table]
    return sorted(rows, key=lambda row: row["total_us"] or 0.0, reverse=True)


def _us(ms: float | None) -> float | None:
    return None if ms is None else round(ms * 1000.0, 3)


def _matmul_line(dev: DeviceInfo, dtype: str, support: ModeSupport, budget: _Budget,
                 fp32_value: float | None, onednn: dict | None = None) -> dict[str, Any]:
    unit, scale = _unit(dev)
    stage = f"matmul {dtype}"
    if support.status == UNSUPPORTED:
        return _line("matmul", dtype, unit, NOT_SUPPORTED, support.reason)
    stage_s = budget.begin(stage, f"{dtype} matmul")
    if stage_s is None:
        budget.end(stage)
        return _line("matmul", dtype, unit, SKIPPED, f"time budget of {budget.total_s:g} s spent")
    probe = ContentionProbe()  # watches the measurement: a busy figure is not kept as the peak
    try:
        timing = measure_matmul(dev.key, dtype, budget_s=stage_s)
    except Exception as exc:  # e.g. a kernel missing from this build: say so, keep going
        budget.end(stage)
        return _line("matmul", dtype, unit, NOT_SUPPORTED,
                     f"matmul failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    value = timing.flops_per_s / scale
    # The check's measurement becomes the peak MFU is relative to on this device (quiet
    # and plausible only); a datasheet GPU keeps its datasheet peak.
    record = (record_check(dev, dtype, timing, probe)
              if dev.kind == "cpu" or datasheet_row(dev.name) is None else None)
    peak_info = peak_for(dev, dtype, measure=False) if dev.kind == "cuda" else None
    peak = (peak_info.flops_per_s / scale
            if peak_info and peak_info.flops_per_s and peak_info.source.startswith("datasheet")
            else None)
    if dev.kind == "cpu":  # the ISA peak Live's MFU uses (peaks.reference_peaks)
        isa_flops, _native, isa_basis = isa_peak(dev, dtype)
        peak = isa_flops / scale if isa_flops else None
        peak_source = f"ISA peak: {isa_basis}" if isa_flops else None
    else:
        peak_source = peak_info.source if peak_info else None
    ratio = value / peak if peak else None
    speedup = value / fp32_value if fp32_value else (1.0 if dtype == "fp32" else None)
    extra: dict[str, Any] = {"n": timing.n, "trials": timing.reps}
    if record is not None:
        extra["peak_record"] = {key: record.get(key) for key in (
            "kept", "not_kept_because", "busy", "load_words", "measured_at")}
    tensor_core, evidence, kernels = None, "", []
    if dev.kind == "cuda":
        budget.report(_fraction_done(budget), f"{dtype} matmul: profiling kernels")
        try:
            kernels, tensor_core, evidence, gpm = _gpu_evidence(dev, dtype, timing)
        except Exception as exc:  # evidence is extra; the timing above still stands
            kernels, tensor_core, gpm = [], "unknown", {}
            evidence = f"evidence unavailable: {type(exc).__name__}: {str(exc)[:160]}"
        extra.update(tensor_core=tensor_core, tensor_core_evidence=evidence, **gpm)
    if dev.kind == "cpu":
        # the one wording of this dtype here: flags apart from what the probe measured
        probe_dtype = ((onednn or {}).get("dtypes") or {}).get(dtype)
        words = cpu_mode_words(dev.cpu_flags, dtype, probe_dtype)
        support = ModeSupport(support.status, words["words"])
        kernels = cpu_evidence_rows(probe_dtype)
        extra.update(cpu_tone=words["tone"], reference_share=words["reference_share"])
    verdict, reason = matmul_verdict(dev.kind, dtype, support, ratio, speedup, tensor_core,
                                     evidence, peak_info.note if peak_info and not peak else "")
    if dev.kind == "cpu" and extra.get("cpu_tone") == "emulated" and verdict == OK:
        verdict = SLOW  # the probe saw reference code or a far slower op than fp32
    budget.end(stage)
    return _line("matmul", dtype, unit, verdict, reason, value=_round(value), peak=peak,
                 ratio_to_peak=_round(ratio), speedup_vs_fp32=_round(speedup), kernels=kernels,
                 peak_source=peak_source, **extra)


def _fraction_done(budget: _Budget) -> float:
    return 1.0 - sum(budget.remaining.values()) / budget.all_weight


def _gpu_evidence(dev: DeviceInfo, dtype: str, timing) -> tuple[list, str, str, dict]:
    """Profiled kernels, the Tensor-Core verdict, and the GPM counter on Hopper+."""
    import torch

    gpm: dict[str, Any] = {}
    with tf32_mode(dev.key, dtype):
        fn, a, b = matmul_operands(dev.key, dtype, timing.n)
        try:
            kernels = profile_kernels(fn, a, b, dev.key)
            tensor_core, evidence = tensor_core_of(kernels)
        except Exception as exc:  # the profiler is evidence, not a requirement
            kernels, tensor_core = [], "unknown"
            evidence = f"profiler failed: {type(exc).__name__}: {exc}"
        if (dev.compute_capability or (0, 0)) >= (9, 0):
            call_s = 2.0 * timing.n**3 / timing.flops_per_s
            gpm = _gpm_during(dev, fn, a, b, call_s)
        del a, b
    torch.cuda.empty_cache()
    return kernels, tensor_core, evidence, gpm


def _gpm_during(dev: DeviceInfo, fn, a, b, call_s: float, window_s: float = 0.5) -> dict[str, Any]:
    """Sample NVML GPM ANY_TENSOR_UTIL while the GPU is kept busy with this matmul."""
    import torch

    result: list[tuple[float | None, str]] = []
    sampler = threading.Thread(
        target=lambda: result.append(gpm_tensor_util(nvml_index(dev.key), window_s)),
        daemon=True)
    lead_calls = max(1, int(0.1 / call_s))          # ~0.1 s queued before the window opens
    window_calls = max(1, int((window_s + 0.3) / call_s))
    for _ in range(min(lead_calls, 2000)):
        fn(a, b)
    sampler.start()
    for _ in range(min(window_calls, 20000)):
        fn(a, b)
    torch.cuda.synchronize(torch.device(dev.key))
    sampler.join(5.0)
    value, note = result[0] if result else (None, "GPM sampler did not finish")
    return {"gpm_tensor_util_pct": _round(value), "gpm_note": note}


def _bandwidth_line(dev: DeviceInfo, budget: _Budget) -> dict[str, Any]:
    stage = "memory copy"
    stage_s = budget.begin(stage, "memory copy bandwidth")
    if stage_s is None:
        budget.end(stage)
        return _line(
            "memory copy", None, "GB/s", SKIPPED, f"time budget of {budget.total_s:g} s spent"
        )
    try:
        gb_per_s, size_bytes = measure_copy_bandwidth(dev.key, stage_s)
    except Exception as exc:
        budget.end(stage)
        return _line("memory copy", None, "GB/s", NOT_SUPPORTED,
                     f"copy failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    budget.end(stage)
    where = "device memory" if dev.kind == "cuda" else "RAM"
    return _line("memory copy", None, "GB/s", OK,
                 f"read+write bytes per second copying {size_bytes / 2**20:.0f} MiB within "
                 f"{where}; informational (no datasheet bandwidth to compare)",
                 value=_round(gb_per_s), size_bytes=size_bytes)


def measure_copy_bandwidth(device_key: str, budget_s: float) -> tuple[float, int]:
    """Best (GB/s, buffer bytes) of tensor copies; bytes moved = read + write = 2x size."""
    import torch

    is_gpu = device_key.startswith("cuda")
    size_bytes = (1 << 30) if is_gpu else (64 << 20)
    src = torch.empty(size_bytes // 4, dtype=torch.float32, device=device_key).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults on CPU, allocator on GPU
    start_s, best = time.perf_counter(), 0.0
    while True:
        _sync(device_key)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device_key)
        elapsed_s = time.perf_counter() - t0
        best = max(best, 2 * size_bytes / elapsed_s / 1e9)
        if time.perf_counter() - start_s + elapsed_s > budget_s:
            break
    del src, dst
    if is_gpu:
        torch.cuda.empty_cache()
    return best, size_bytes


def _nvml_part(dev: DeviceInfo, budget: _Budget) -> tuple[dict | None, str | None]:
    if dev.kind != "cuda":
        missing = nvml_unavailable_reason()
        return None, ("this check ran on the CPU, and NVML describes NVIDIA GPUs only"
                      + (f"; on this machine it is missing too ({missing})" if missing else ""))

    budget.report(0.97, "NVML snapshot")
    snapshot = nvml_snapshot(nvml_index(dev.key))
    if not snapshot.get("available"):
        return None, snapshot.get("reason")
    return snapshot, None


# ---------------------------------------------------------------------------------------
# in a child process (for the UI)

_PROGRESS_LINE = re.compile(r"^\[\s*([0-9.]+)%\]\s*(.*)$")


class CheckFailed(RuntimeError):
    """The check's child process failed; the message carries its last stderr lines."""


def run_check_subprocess(
    device_key: str,
    progress: ProgressFn | None = None,
    time_budget_s: float = 45,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """run_check in a child `python -m engine.diagnostics.check`, progress relayed from its stderr.

    For long-lived processes (the Streamlit server): the CUDA context, cuBLAS workspaces
    and 1 GiB test buffers die with the child instead of staying in the server, and a
    crashing driver call cannot take the server down.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "engine.diagnostics.check", "--device", device_key,
           "--time-budget", f"{float(time_budget_s):g}"]
    child = subprocess.Popen(cmd, cwd=str(PROJECT_ROOT), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    stdout_parts: list[str] = []
    reader = threading.Thread(target=lambda: stdout_parts.append(child.stdout.read()), daemon=True)
    reader.start()
    limit_s = timeout_s or (float(time_budget_s) + 120.0)  # + imports, CUDA init
    timer = threading.Timer(limit_s, child.kill)  # our own child, by its Popen handle
    timer.start()
    tail: list[str] = []
    try:
        for raw in child.stderr:
            line = raw.rstrip()
            match = _PROGRESS_LINE.match(line)
            if match and progress is not None:
                progress(float(match.group(1)) / 100.0, match.group(2))
            elif line and not match:
                tail = (tail + [line])[-5:]
        return_code = child.wait()
    finally:
        timer.cancel()
    reader.join(5.0)
    out_lines = "".join(stdout_parts).strip().splitlines()
    if return_code != 0 or not out_lines:
        why = "killed after the time limit" if return_code < 0 else f"exit code {return_code}"
        raise CheckFailed(f"the check process failed ({why}): " + (" | ".join(tail) or "no output"))
    return json.loads(out_lines[-1])


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def _progress_to_stderr(fraction: float, message: str) -> None:
    """One "[ 42.0%] message" line per update: what run_check_subprocess parses."""
    sys.stderr.write(f"[{fraction * 100:5.1f}%] {message}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.diagnostics.check --device KEY [--time-budget S]`: the check in this
    process, progress on stderr, the result as one JSON line on stdout (for the UI)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m engine.diagnostics.check")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--time-budget", type=float, default=45.0, dest="time_budget_s")
    args = parser.parse_args(argv)
    try:
        key = resolve_device_key(args.device)
    except ConfigError as exc:  # worded as `python -m engine check` words it
        print(f"error: --device {exc.value!r}: {exc.fix}", file=sys.stderr)
        return 2
    result = run_check(key, progress=_progress_to_stderr, time_budget_s=args.time_budget_s)
    print(json.dumps(result))
    return 0


__all__ = [
    "run_check",
    "run_check_subprocess",
    "CheckFailed",
    "matmul_verdict",
    "speed_words",
    "kernel_events",
    "summarize_kernels",
    "tensor_core_of",
    "profile_kernels",
    "dtype_support",
    "no_gpu_reason",
    "measure_copy_bandwidth",
    "OK",
    "SLOW",
    "NOT_SUPPORTED",
    "SKIPPED",
    "VERDICTS",
]


if __name__ == "__main__":
    sys.exit(main())
