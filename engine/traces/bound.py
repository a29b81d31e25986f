"""What limits the step: input, CPU/launch overhead, communication, memory traffic or
matrix math, decided from the time accounting (engine.traces.accounting), with the
numbers behind the verdict and what to try. The rules and thresholds:
docs/precision-reference.md#bound-by-verdict.

Why it matters for a precision tool: lower precision speeds up the matrix part (Tensor
Cores) and halves the bytes of the memory-bound part; it does nothing for a GPU that
waits on the DataLoader or on Python. A "Tensor Cores: yes" on a GPU idle 70 % of the
step promises a speedup the run cannot get.
"""

from __future__ import annotations

from engine.display import share_text

INPUT_SHARE = 0.2        # data-loader wait of the step at or above which input-bound
COMMUNICATION_SHARE = 0.3  # exposed (not hidden) communication of the step
IDLE_SHARE = 0.4         # GPU idle (CPU: outside any op) share of the step
SHORT_MEDIAN_US = 50.0   # median kernel below this: launch overhead dominates the gaps
MATH_SHARE = 0.5         # matrix + attention share of busy time for math-bound

ADVICE = {
    "input": ["Use more DataLoader workers (num_workers) with persistent_workers=True",
              "pin_memory=True and non_blocking=True copies overlap the host-to-device transfer",
              "Move decoding/augmentation off the training process or onto the GPU"],
    "cpu_launch": ["Larger batch: more work per kernel launch",
                   "torch.compile fuses small kernels; CUDA graphs (mode='reduce-overhead') "
                   "remove the launch cost",
                   "Avoid host syncs in the step (.item(), .cpu(), printing tensors)"],
    "communication": ["Overlap communication with compute (DDP bucket_cap_mb, FSDP prefetch)",
                      "Larger batch or gradient accumulation: fewer all-reduces per sample",
                      "bf16 gradient communication (DDP bf16_compress_hook) halves the bytes"],
    "memory": ["torch.compile fuses elementwise and normalisation kernels (fewer round trips "
               "to memory)",
               "Where these kernels still run in fp32, bf16/fp16 autocast halves the bytes "
               "they move"],
    "math": ["Matrix work dominates: bf16/fp16 (or fp8 on Hopper+) on Tensor Cores pays "
             "directly",
             "Keep matrix dimensions multiples of 8 (16 for fp8) so the fast kernels are chosen"],
}
# A CPU run has no Tensor Cores, kernels or CUDA graphs: its own words.
CPU_ADVICE = {
    "cpu_launch": ["Larger batch: more work per op dispatch",
                   "torch.compile removes Python and dispatch overhead between small ops",
                   "Avoid .item() / printing tensors inside the step"],
    "math": ["Matrix work dominates: bf16 autocast pays where the CPU has AMX or AVX512-BF16 "
             "(the oneDNN primitive below says which ran)",
             "Set torch.set_num_threads to the physical cores the run may use"],
}
# Memory-bound advice that only applies where the window shows its cause.
CHANNELS_LAST_ADVICE = "channels_last memory format: the convolutions run without layout copies"
FUSED_OPTIMIZER_ADVICE = ("Fused optimizer (torch.optim.AdamW(fused=True)) instead of one "
                          "kernel per tensor")
OPTIMIZER_SHARE = 0.05   # optimizer share of busy time from which its fusing is worth it
LABELS = {"input": "input-bound", "cpu_launch": "CPU/launch-bound",
          "communication": "communication-bound", "memory": "memory-bound",
          "math": "math-bound", "unknown": "unknown"}
_MEMORY_PARTS = ("elementwise", "normalisation", "copies", "optimizer")


def _pct(share: float | None) -> str:
    return "n/a" if share is None else share_text(share)


def _numbers(accounting: dict, data_wait_ms: float | None) -> dict:
    step_us = accounting.get("step_time_us") or 0.0
    count = (accounting.get("window") or {}).get("step_count") or 1
    parts = accounting.get("parts_per_step_us") or {}
    busy_us = sum(us for part, us in parts.items() if part != "idle")
    if data_wait_ms is not None:
        data_us, data_source = data_wait_ms * 1000.0, "data_wait_ms passed in"
    else:
        data_us, data_source = (accounting.get("data_loader_us") or 0.0) / count, \
            "enumerate(DataLoader) spans in the trace"
    exposed = accounting.get("exposed_communication_us")
    return {
        "step_time_us": step_us,
        "busy_share": busy_us / step_us if step_us else None,
        "idle_share": accounting.get("idle_share"),
        "data_wait_us_per_step": round(data_us, 3), "data_wait_source": data_source,
        "data_wait_share": data_us / step_us if step_us else None,
        "exposed_communication_share": (exposed / count / step_us) if exposed is not None
        and step_us else None,
        "matrix_share_of_busy": (parts.get("matrix", 0) + parts.get("attention", 0)) / busy_us
        if busy_us else None,
        "memory_share_of_busy": sum(parts.get(p, 0) for p in _MEMORY_PARTS) / busy_us
        if busy_us else None,
        "optimizer_share_of_busy": parts.get("optimizer", 0) / busy_us if busy_us else None,
        "convolutions": _has_convolutions(accounting),
        "median_kernel_us": accounting.get("median_kernel_us"),
        "kernel_count": accounting.get("kernel_count"),
        "sync_calls": accounting.get("sync_calls"),
    }


def _has_convolutions(accounting: dict) -> bool:
    """Convolution kernels (GPU) or ops (CPU) in the window."""
    if (accounting.get("conv_kernel_us") or 0) > 0:
        return True
    return any("conv" in (row.get("cpu_op") or "") for row in accounting.get("ops") or [])


def _advice(verdict: str, kind: str, n: dict) -> list[str]:
    advice = list((CPU_ADVICE if kind == "cpu" else {}).get(verdict) or ADVICE.get(verdict, []))
    if verdict == "memory":
        if n["convolutions"]:
            advice.insert(1, CHANNELS_LAST_ADVICE)
        if (n["optimizer_share_of_busy"] or 0) >= OPTIMIZER_SHARE:
            advice.insert(1, FUSED_OPTIMIZER_ADVICE)
    return advice


def _decide(kind: str, n: dict) -> str:
    if not n["step_time_us"]:
        return "unknown"
    if (n["data_wait_share"] or 0) >= INPUT_SHARE:
        return "input"
    if (n["exposed_communication_share"] or 0) >= COMMUNICATION_SHARE:
        return "communication"
    if (n["idle_share"] or 0) >= IDLE_SHARE:
        return "cpu_launch"
    if n["matrix_share_of_busy"] is None:
        return "unknown"
    if n["matrix_share_of_busy"] >= MATH_SHARE:
        return "math"
    # memory-bound only where the memory-bound parts are the larger share, not where
    # "other" kernels (or hidden communication) fill the busy time
    matrix, memory = n["matrix_share_of_busy"], n["memory_share_of_busy"] or 0.0
    return "memory" if memory >= matrix and memory + matrix >= MATH_SHARE else "unknown"


def _sentence(verdict: str, kind: str, n: dict) -> str:
    idle_what = (
        "the GPU was idle" if kind == "gpu" else "time outside any CPU op (Python, framework)"
    )
    step_ms = n["step_time_us"] / 1000.0
    if verdict == "input":
        idle = (f"; {idle_what} {_pct(n['idle_share'])} of the step meanwhile"
                if n["idle_share"] is not None else "")
        return (f"Input-bound: waiting for data took {_pct(n['data_wait_share'])} of the "
                f"{step_ms:,.2f} ms step ({n['data_wait_source']}){idle}")
    if verdict == "communication":
        return (f"Communication-bound: communication not hidden under compute took "
                f"{_pct(n['exposed_communication_share'])} of the {step_ms:,.2f} ms step")
    if verdict == "cpu_launch":
        if kind == "gpu":
            short = (n["median_kernel_us"] or 0) < SHORT_MEDIAN_US
            why = (f"between {n['kernel_count']:,} kernels of median "
                   f"{n['median_kernel_us']:,.1f} µs (launch overhead)" if short else
                   f"between kernels while the CPU worked (host code, {n['sync_calls'] or 0} "
                   "synchronisations)")
            return f"CPU/launch-bound: the GPU was idle {_pct(n['idle_share'])} of the step {why}"
        return (f"CPU/framework-bound: {_pct(n['idle_share'])} of the {step_ms:,.2f} ms step "
                "was outside any op (Python, dispatch)")
    if verdict == "math":
        return (f"Math-bound: matrix and attention work is {_pct(n['matrix_share_of_busy'])} "
                f"of the busy "
                f"time; {idle_what} {_pct(n['idle_share'])} of the step")
    if verdict == "memory":
        return (f"Memory-bound: elementwise, normalisation, copies and optimizer are "
                f"{_pct(n['memory_share_of_busy'])} of the busy time, matrix and attention "
                f"work {_pct(n['matrix_share_of_busy'])}")
    if n["step_time_us"] and n["matrix_share_of_busy"] is not None:
        return (f"Bound-by: unknown, no kind of work dominates the busy time (matrix and "
                f"attention {_pct(n['matrix_share_of_busy'])}, elementwise, normalisation, "
                f"copies and optimizer {_pct(n['memory_share_of_busy'])}, the rest other "
                "kernels)")
    return "Bound-by: unknown, no time recorded in this window"


def bound_by(accounting: dict, data_wait_ms: float | None = None) -> dict:
    """-> {"verdict": input|cpu_launch|communication|memory|math|unknown, "label",
    "numbers": {shares and times behind it}, "advice": [str], "sentence": str}.

    `accounting` is time_accounting()'s result (GPU or CPU); `data_wait_ms`, when given
    (a run's measured wait for its next batch per step), replaces the DataLoader spans.
    Checked in order: input, communication, CPU/launch, then math vs memory on the busy
    time: the first limit that holds is the one worth fixing first.
    """
    kind = accounting.get("kind", "gpu")
    numbers = _numbers(accounting, data_wait_ms)
    verdict = _decide(kind, numbers)
    return {"verdict": verdict, "label": LABELS[verdict],
            "numbers": {k: (round(v, 4) if isinstance(v, float) else v)
                        for k, v in numbers.items()},
            "advice": _advice(verdict, kind, numbers),
            "sentence": _sentence(verdict, kind, numbers)}


def busy_headline(verdict_headline: str, accounting: dict) -> str:
    """The Tensor-Core headline with how busy the GPU was:
    "Tensor Cores: yes, 100 % of matrix time ..., but the GPU was idle 69 % of the step"."""
    idle = accounting.get("idle_share")
    if idle is None or accounting.get("kind") != "gpu":
        return verdict_headline
    if idle >= 0.25:
        return f"{verdict_headline}, but the GPU was idle {share_text(idle)} of the step"
    return f"{verdict_headline}; the GPU was busy {share_text(1.0 - idle)} of the step"
