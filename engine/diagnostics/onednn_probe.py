"""The oneDNN probe: per dtype (fp32, bf16, fp16 under autocast), one small matmul and one
convolution forward + backward, timed, and run once more under oneDNN's verbose mode to
name the implementation that ran each.

What it answers before any run: which oneDNN implementation (so which unit, or reference
code) runs each kind of op in each dtype on this CPU with this torch build, and how fast
each op runs against fp32. The words are decided by engine.analysis.cpu_evidence
(`cpu_mode_words`); the record is kept by engine.hardware.cpu_probe, measured when
missing (doctor, a CPU run's profiler window) and replaced by every device check.

The sizes are small on purpose: oneDNN's reference code can be 50-100x slower than a jit
kernel, and the probe must stay a second or two there too. Small sizes favour overheads,
so the speed ratios are rough; the implementation names are exact.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from engine.analysis.cpu_evidence import parse_onednn_verbose
from engine.hardware.contention import ContentionProbe, sample_causes, sample_is_busy
from engine.hardware.cpu_probe import (
    PROBE_DTYPES,
    RECORD_VERSION,
    stored_probe,
    torch_build_version,
    write_probe,
)

MATMUL_SIDE = 256           # one 256^3 matmul: 34 MFLOP
CONV_SHAPE = (4, 16, 16, 16)  # batch, channels, height, width; 16 -> 16 channels, 3x3
OP_BUDGET_S = 0.25          # timing budget per (dtype, op)
MAX_REPS = 20


def _flop(op: str) -> float:
    if op == "matmul":
        return 2.0 * MATMUL_SIDE ** 3
    batch, channels, height, width = CONV_SHAPE
    forward = 2.0 * batch * channels * height * width * channels * 3 * 3
    return 3.0 * forward  # forward, backward data, backward weights: about equal work


def _ops(torch_module, dtype: str):
    """{op: a callable running it once in `dtype`} on fresh fp32 parameters."""
    torch = torch_module
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(MATMUL_SIDE, MATMUL_SIDE, generator=generator)
    weight = torch.randn(MATMUL_SIDE, MATMUL_SIDE, generator=generator)
    conv = torch.nn.Conv2d(CONV_SHAPE[1], CONV_SHAPE[1], 3, padding=1)
    images = torch.randn(*CONV_SHAPE, generator=generator, requires_grad=True)

    def autocast():
        return torch.autocast("cpu", dtype=low or torch.bfloat16, enabled=low is not None)

    def matmul():
        with torch.no_grad(), autocast():
            torch.nn.functional.linear(rows, weight)

    def conv_step():
        with autocast():
            out = conv(images)
        out.float().sum().backward()

    return {"matmul": matmul, "conv": conv_step}


def _best_time_s(fn) -> float:
    fn()  # the first call creates the primitives (and pays page faults)
    best, start = float("inf"), time.perf_counter()
    for rep in range(MAX_REPS):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
        if rep >= 1 and time.perf_counter() - start > OP_BUDGET_S:
            break
    return best


def _primitives(fn, log_dir: Path, name: str) -> list[dict[str, Any]]:
    # late: the capture needs torch, imported only when a probe runs
    from engine.training.onednn import capture_onednn_verbose

    log = log_dir / f"{name}.log"
    with capture_onednn_verbose(log):
        fn()
    return [{"kind": p.kind, "prop_kind": p.prop_kind, "implementation": p.implementation,
             "isa": p.isa, "src_dtype": p.src_dtype, "problem": p.problem,
             "exec_ms": p.exec_ms}
            for p in parse_onednn_verbose(log.read_text(errors="replace")) if p.is_matrix]


def run_probe(device_name: str, source: str) -> dict[str, Any]:
    """Probe every dtype; the record engine.hardware.cpu_probe stores."""
    import torch  # the probe is torch's own ops under oneDNN

    load = ContentionProbe()  # the speed ratios mean little if others shared the CPU
    dtypes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="onednn-probe-") as tmp:
        for dtype in PROBE_DTYPES:
            ops: dict[str, Any] = {}
            for op, fn in _ops(torch, dtype).items():
                try:
                    seconds = _best_time_s(fn)
                    primitives = _primitives(fn, Path(tmp), f"{dtype}-{op}")
                except Exception as exc:  # noqa: BLE001 - a dtype this build cannot run
                    ops[op] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                    continue
                ops[op] = {"wall_ms": round(seconds * 1e3, 4), "flop": _flop(op),
                           "flops_per_s": _flop(op) / seconds if seconds > 0 else None,
                           "primitives": primitives}
            dtypes[dtype] = {"ops": ops}
        # fp32 once more at the end, the best of both kept: a burst of load during the
        # first pass would otherwise make every other dtype look fast against it
        for op, fn in _ops(torch, "fp32").items():
            measured = dtypes["fp32"]["ops"].get(op) or {}
            if measured.get("flops_per_s"):
                seconds = min(_best_time_s(fn), measured["wall_ms"] / 1e3)
                measured.update(wall_ms=round(seconds * 1e3, 4), flops_per_s=_flop(op) / seconds)
    fp32 = dtypes["fp32"]["ops"]
    for entry in dtypes.values():
        entry["speed_vs_fp32"] = {
            op: round(measured["flops_per_s"] / fp32[op]["flops_per_s"], 4)
            for op, measured in entry["ops"].items()
            if measured.get("flops_per_s") and (fp32.get(op) or {}).get("flops_per_s")}
    sample = load.sample()
    busy = sample_is_busy(sample, load.cores)
    return {"version": RECORD_VERSION, "measured_at": time.time(), "source": source,
            "device_name": device_name, "torch": torch_build_version(),
            "threads": torch.get_num_threads(), "dtypes": dtypes,
            # unmeasured load counts as busy, as for the peaks: measured again next time
            "busy": True if busy is None else busy,
            "busy_causes": sample_causes(sample, load.cores)}


def refresh_probe(device_key: str, device_name: str, source: str) -> dict[str, Any]:
    """Probe now and replace the stored record (the device check)."""
    record = run_probe(device_name, source)
    write_probe(device_key, device_name, record)
    return record


def cached_or_probe(device_key: str, device_name: str, source: str) -> dict[str, Any]:
    """The stored record, or a new probe stored (doctor): also when the stored one was
    taken while the machine was busy (its implementation names hold, its speeds may not),
    as a busy peak is measured again."""
    record = stored_probe(device_key, device_name)
    if record is not None and not record.get("busy"):
        return record
    return refresh_probe(device_key, device_name, source)
