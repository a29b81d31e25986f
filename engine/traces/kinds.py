"""Traces that are not kernel timelines, read for what they are.

- A CUPTI range-profiler trace has no `kernel` events: one `cuda_profiler_range` event per
  kernel, replayed under SASS instruction counters. Its durations include the replays (no
  kernel time), but its counters are evidence a timeline never has: a matrix kernel that
  executed (almost) no FFMA/HFMA/DFMA did its multiply-adds on the Tensor Cores; one with
  billions ran them on the CUDA cores.
- A trace of another accelerator (Meta's MTIA, Intel's XPU, ...) has CPU ops and that
  device's runtime events but no CUDA/ROCm kernels: it is named as such. Neither is a CPU run.
"""

from __future__ import annotations

from engine.traces.kernels import MATRIX_CATEGORIES, classify_kernel
from engine.traces.parser import ParsedTrace

# A matrix kernel whose FMA instructions are below this share of its multiply-adds' worth
# of floating-point instructions did not run its MACs on CUDA cores (the xmma Tensor-Core
# kernels of the A100 fixture execute 0 FFMA and some FMUL/FADD for the epilogue).
FMA_SHARE_OF_CUDA_CORE_MATH = 0.01
_ACCELERATOR_NAMES = {"mtia": "Meta MTIA", "xpu": "Intel XPU", "hpu": "Intel Gaudi (HPU)",
                      "tpu": "TPU", "privateuse1": "a PrivateUse1 backend"}


def accelerator_name(other_devices: dict) -> str:
    prefixes = {category.split("_")[0] for category in other_devices}
    names = sorted(_ACCELERATOR_NAMES.get(prefix, prefix) for prefix in prefixes)
    return " / ".join(names) or "another accelerator"


def _counter_verdict(counters: tuple) -> str | None:
    """"yes" (no CUDA-core multiply-adds), "no" (they ran there) or None (not recorded)."""
    ffma, fadd, fmul, hfma, hadd, hmul, dfma, dadd, dmul = counters
    if ffma is None and hfma is None and dfma is None:
        return None
    fma = (ffma or 0) + (hfma or 0) + (dfma or 0)
    every = fma + sum(value or 0 for value in (fadd, fmul, hadd, hmul, dadd, dmul))
    if fma == 0 or fma < FMA_SHARE_OF_CUDA_CORE_MATH * every:
        return "yes"
    return "no"


def range_profiler_summary(parsed: ParsedTrace) -> dict:
    """The matrix kernels of a range-profiler trace with their counters and both verdicts
    (name and counters), and one verdict over them, by kernel count (no kernel time)."""
    kernels = []
    for name, _ts, _dur, counters in parsed.ranges:
        verdict = classify_kernel(name)
        if verdict.category not in MATRIX_CATEGORIES:
            continue
        ffma, _fadd, _fmul, hfma, _hadd, _hmul, dfma, _dadd, _dmul = counters
        kernels.append({"name": name, "category": verdict.category, "dtype": verdict.dtype,
                        "name_verdict": verdict.tensor_core,
                        "counter_verdict": _counter_verdict(counters),
                        "ffma": ffma, "hfma": hfma, "dfma": dfma})
    judged = [k for k in kernels if k["counter_verdict"] is not None]
    on_matrix = [k for k in judged if k["counter_verdict"] == "yes"]
    disagree = [k for k in judged
                if k["name_verdict"] in ("yes", "no") and k["name_verdict"] != k["counter_verdict"]]
    share = len(on_matrix) / len(judged) if judged else None
    if share is None:
        answer, headline = "unknown", "the trace records no FMA counters for its matrix kernels"
    else:
        answer = "yes" if share >= 0.8 else ("no" if share == 0 else "partly")
        headline = (f"{answer}, {len(on_matrix)} of {len(judged)} matrix kernel runs executed "
                    "no CUDA-core multiply-adds (FFMA/HFMA/DFMA counters)")
    return {
        "kernels": kernels, "tensor_cores": answer,
        "headline": f"Tensor Cores (from SASS counters): {headline}",
        "counters_agree_with_names": not disagree if judged else None,
        "disagreements": [k["name"] for k in disagree][:10],
    }


def other_kind_result(parsed: ParsedTrace) -> dict:
    """What `engine kernels` reports for a range-profiler or other-accelerator trace."""
    device = parsed.table.attrs.get("device")
    if parsed.kind == "range profiler":
        evidence = range_profiler_summary(parsed)
        sentence = ("A CUPTI range-profiler trace: one replayed range per kernel with SASS "
                    "counters, no kernel timeline, so no step time or GPU busy time; the "
                    "counters say where the multiply-adds ran.")
        tone = {"yes": "success", "partly": "warning", "no": "error"}.get(
            evidence["tensor_cores"], "info")
        return {"source": parsed.source, "trace_kind": parsed.kind, "device": device,
                "range_profiler": evidence,
                "verdict": {"tensor_cores": evidence["tensor_cores"],
                            "headline": evidence["headline"]},
                "banner": {"headline": evidence["headline"], "tone": tone,
                           "sentence": sentence, "advice": []}}
    name = accelerator_name(parsed.other_devices)
    headline = (f"A {name} trace: {sum(parsed.other_devices.values()):,} device events "
                f"({', '.join(sorted(parsed.other_devices))}) and no CUDA/ROCm kernels, so "
                "no Tensor-Core verdict; not a CPU run")
    return {"source": parsed.source, "trace_kind": parsed.kind, "device": name,
            "other_devices": dict(parsed.other_devices),
            "verdict": {"tensor_cores": "unknown", "headline": headline},
            "banner": {"headline": headline, "tone": "info",
                       "sentence": "The accelerator's own kernels are not CUDA/ROCm kernel "
                                   "events; read them in the vendor's tools.",
                       "advice": []}}

