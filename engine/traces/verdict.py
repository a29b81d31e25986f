"""Kernel table -> breakdown: did the matrix work run on Tensor Cores, which kernels and
ops took the time, and which matrix ops could have used Tensor Cores and did not (why).
The parser (trace file -> kernel table) is engine.traces.parser.

Times are sums of kernel durations (`*_us`), not wall time: kernels on different streams
overlap, and a share of summed kernel time is what says where the GPU's work went.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import IO, Any

from engine.display import share_text
from engine.hardware.gpus import compute_capability_from_name
from engine.traces.kernel_table import KernelTable
from engine.traces.kernels import KERNEL_CATEGORIES, LOW_PRECISION_DTYPES, MATRIX_CATEGORIES
from engine.traces.parser import load_trace

UNATTRIBUTED_OP = "(unattributed)"
TOP_KERNELS = 20
TOP_OPS_WITHOUT_TC = 20
YES_SHARE = 0.8  # matrix time on Tensor Cores at or above which the verdict is a plain "yes"

# ---------------------------------------------------------------------------------------
# public: breakdown

def _us(value: float) -> float:
    return round(float(value), 3)


def _share(part: float, whole: float) -> float | None:
    # 8 decimals: 4 would store 0.00004 as 0 and 0.99996 as 1, and a page would then
    # print "0 %" or "100 %" for a share that is neither
    return round(float(part) / float(whole), 8) if whole > 0 else None


def _short_kernel_name(name: str, limit: int = 60) -> str:
    """`void ns::kernel<...>(...)` -> `ns::kernel`: enough to recognise it in a headline."""
    short = re.sub(r"^void\s+", "", name)
    short = re.split(r"[<(]", short, maxsplit=1)[0] or name
    return short if len(short) <= limit else short[:limit - 3] + "..."


def short_kernel_name(name: str, limit: int = 100) -> str:
    """A kernel name for a list: no `void `, no argument list, and template arguments
    elided to `<…>` unless they are one plain identifier (`cutlass::Kernel2<cutlass_80_
    tensorop_bf16_s16816gemm_...>` keeps the part that names the kernel). The full name
    goes on an expander."""
    short = re.sub(r"^void\s+", "", name.strip())
    if short.endswith(")"):
        short = _without_arguments(short)
    start = short.find("<")
    if start > 0:
        inner = short[start + 1:short.rfind(">")] if short.rfind(">") > start else ""
        if not re.fullmatch(r"[A-Za-z0-9_]+", inner):
            short = short[:start] + "<…>"
    return short if len(short) <= limit else short[:limit - 1] + "…"


def _without_arguments(text: str) -> str:
    depth = 0
    for pos in range(len(text) - 1, -1, -1):
        if text[pos] == ")":
            depth += 1
        elif text[pos] == "(":
            depth -= 1
            if depth == 0:
                return text[:pos] or text
    return text


def _capability_number(capability: str | None) -> float | None:
    try:
        return float(capability) if capability else None
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------
# kernel groups: the unit every breakdown sum is made of

@dataclass(frozen=True)
class KernelGroup:
    """The kernels of one (name, launching CPU op) pair, summed. A kernel's classification is
    a function of its name, so a trace of thousands of kernel events is a few hundred
    groups: the breakdown sums the table once into groups and derives every figure from
    them in plain Python (a pandas groupby costs about a millisecond of overhead, more than
    the sums themselves on a small trace, and a breakdown needs a dozen of them)."""

    name: str
    cpu_op: str          # UNATTRIBUTED_OP when no CPU op launched it
    us: float            # summed duration
    count: int
    category: str
    tensor_core: str     # "yes" | "no" | "unknown"
    dtype: str | None
    reason: str

    @property
    def is_matrix(self) -> bool:
        return self.category in MATRIX_CATEGORIES


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None  # pandas gives NaN for a missing dtype


def kernel_groups(table: KernelTable | Any) -> list[KernelGroup]:
    """One KernelGroup per (name, CPU op) in order of first appearance; durations summed
    with math.fsum (correctly rounded, whatever the order)."""
    if table.empty:
        return []
    memo = getattr(table, "memo", None)  # a KernelTable keeps its groups (a DataFrame does not)
    if memo is not None and "groups" in memo:
        return list(memo["groups"])
    groups = _kernel_groups(table)
    if memo is not None:
        memo["groups"] = tuple(groups)
    return groups


def _kernel_groups(table: KernelTable | Any) -> list[KernelGroup]:
    durations: dict[tuple[str, str], list[float]] = {}
    first_row: dict[tuple[str, str], int] = {}
    for row, (name, op, dur) in enumerate(zip(table["name"].tolist(), table["cpu_op"].tolist(),
                                              table["dur_us"].tolist())):
        key = (name, op if isinstance(op, str) else UNATTRIBUTED_OP)
        bucket = durations.get(key)
        if bucket is None:
            durations[key] = [float(dur)]
            first_row[key] = row
        else:
            bucket.append(float(dur))
    category, tensor_core = table["category"].tolist(), table["tensor_core"].tolist()
    dtype, reason = table["dtype"].tolist(), table["reason"].tolist()
    groups = []
    for (name, op), values in durations.items():
        row = first_row[(name, op)]
        groups.append(KernelGroup(name, op, math.fsum(values), len(values), category[row],
                                  tensor_core[row], _text_or_none(dtype[row]), reason[row]))
    return groups


def _totals(groups: list[KernelGroup], key: Any) -> dict[Any, float]:
    """{key(group): summed us} in order of first appearance."""
    values: dict[Any, list[float]] = {}
    for group in groups:
        values.setdefault(key(group), []).append(group.us)
    return {k: math.fsum(v) for k, v in values.items()}


def _largest_first(totals: dict[Any, float], alphabetical_ties: bool = True) -> list[Any]:
    """Keys by value, largest first; ties in alphabetical order (or first appearance)."""
    keys = sorted(totals, key=str) if alphabetical_ties else list(totals)
    return sorted(keys, key=lambda k: totals[k], reverse=True)


def _sum_us(groups: Any) -> float:
    return math.fsum(group.us for group in groups)


# ---------------------------------------------------------------------------------------

def breakdown(table: KernelTable | Any, device: str | None = None) -> dict:
    """JSON-serialisable summary of a kernel table: totals, Tensor-Core shares, categories,
    top kernels, per-op attribution, ops that could have used Tensor Cores, and a verdict."""
    device = device or table.attrs.get("device")
    vendor = table.attrs.get("vendor")
    if vendor == "amd":  # no NVIDIA compute capability for an AMD GPU, whatever its name
        capability = None
    else:
        capability = table.attrs.get("compute_capability") or compute_capability_from_name(device)
        if device and device != table.attrs.get("device"):
            capability = compute_capability_from_name(device) or capability
    groups = kernel_groups(table)
    on_tc = [g for g in groups if g.tensor_core == "yes"]
    matrix = [g for g in groups if g.is_matrix]
    total_us, tc_us = _sum_us(groups), _sum_us(on_tc)
    matrix_us = _sum_us(matrix)
    matrix_tc_us = _sum_us(g for g in matrix if g.tensor_core == "yes")
    categories = _totals(groups, lambda g: g.category)
    result = {
        "device": device,
        "vendor": vendor,
        "arch": table.attrs.get("arch"),
        "compute_capability": capability,
        "kernel_count": int(len(table)),
        "total_kernel_us": _us(total_us),
        "tensor_core_us": _us(tc_us),
        "tensor_core_share": _share(tc_us, total_us),
        "unknown_us": _us(_sum_us(g for g in groups if g.tensor_core == "unknown")),
        "matrix_us": _us(matrix_us),
        "matrix_tensor_core_us": _us(matrix_tc_us),
        "matrix_tensor_core_share": _share(matrix_tc_us, matrix_us),
        "categories": {c: _us(categories.get(c, 0.0)) for c in KERNEL_CATEGORIES},
        "tensor_core_dtypes": _tensor_core_dtypes(on_tc),
        "top_kernels": top_kernels(groups),
        "per_op": per_op(groups),
    }
    result["could_have_didnt"] = could_have_didnt(groups, device, capability)
    result["verdict"] = _verdict(groups, device, capability, vendor)
    return result


def _tensor_core_dtypes(tc_groups: list[KernelGroup]) -> dict[str, float]:
    """{dtype: us} of Tensor Core kernels, largest first."""
    by_dtype = _totals(tc_groups, lambda g: g.dtype or "unknown")
    return {dtype: _us(by_dtype[dtype]) for dtype in _largest_first(by_dtype)}


def top_kernels(groups: list[KernelGroup], limit: int = TOP_KERNELS) -> list[dict]:
    """Kernels by summed time, largest first (ties: first to run): name, total_us, count,
    verdict fields."""
    by_name: dict[str, list[KernelGroup]] = {}
    for group in groups:
        by_name.setdefault(group.name, []).append(group)
    totals = {name: _sum_us(members) for name, members in by_name.items()}
    rows = []
    for name in _largest_first(totals, alphabetical_ties=False)[:limit]:
        first = by_name[name][0]
        rows.append({"name": name, "total_us": _us(totals[name]),
                     "count": sum(g.count for g in by_name[name]),
                     "tensor_core": first.tensor_core, "dtype": first.dtype,
                     "reason": first.reason, "category": first.category})
    return rows


def per_op(groups: list[KernelGroup]) -> list[dict]:
    """Kernel time per launching CPU op, largest first."""
    by_op: dict[str, list[KernelGroup]] = {}
    for group in groups:
        by_op.setdefault(group.cpu_op, []).append(group)
    totals = {op: _sum_us(members) for op, members in by_op.items()}
    rows = []
    for op in _largest_first(totals):
        members = by_op[op]
        tc_us = _sum_us(g for g in members if g.tensor_core == "yes")
        rows.append({"cpu_op": op, "kernel_us": _us(totals[op]), "tensor_core_us": _us(tc_us),
                     "tensor_core_share": _share(tc_us, totals[op]),
                     "matrix_us": _us(_sum_us(g for g in members if g.is_matrix)),
                     "kernel_count": sum(g.count for g in members)})
    return rows


# ---------------------------------------------------------------------------------------
# ops whose matrix kernels ran without Tensor Cores, and why

CAUSE_NO_HARDWARE = "no Tensor Core hardware on this GPU"
CAUSE_FP32_NO_TF32 = "fp32 without TF32 (enable tf32 or autocast)"
CAUSE_FP32_IN_AMP = "op ran in fp32: outside autocast or kept in fp32 by autocast"
CAUSE_FP32_PRE_AMPERE = ("fp32 on a Volta/Turing GPU: its Tensor Cores take fp16 only "
                         "(use fp16 autocast; TF32 needs Ampere)")
CAUSE_SMALL_SHAPES = ("dimensions too small / not multiples of 8 (Tensor Cores need multiples "
                      "of 8 for fp16/bf16)")
CAUSE_BF16_EMULATED = "bf16 on a GPU without bf16 Tensor Cores (Volta/Turing emulate bf16)"
CAUSE_LOW_PRECISION_NO_TC = ("fp16/bf16 kernel without a Tensor Core path: check shapes "
                             "(multiples of 8), alignment and the kernel build")
CAUSE_FP64 = "fp64 math: only A100/H100-class GPUs have fp64 Tensor Cores"
CAUSE_COMPLEX = ("complex GEMM / FFT path (e.g. cuDNN FFT convolution in fp32): no Tensor "
                 "Core kernel was chosen")
CAUSE_OTHER = "kernel without a Tensor Core path: check dtype (fp16/bf16/tf32) and shapes"

_PRE_VOLTA_KERNELS = re.compile(r"^(?:cudnn_)?(?:infer_|train_)?(?:maxwell|pascal|kepler)_")
# Kernels built only for sm70+ (SASS names carry the build target): if one ran, so did a GPU
# with Tensor Cores. maxwell_ builds alone do not prove the opposite (cuDNN runs some on
# Volta), which is why that evidence is used only when nothing newer ran.
_VOLTA_OR_NEWER_KERNELS = re.compile(
    r"^(?:cudnn_)?(?:infer_|train_)?(?:volta|turing|ampere|hopper|blackwell)_"
    r"|(?:^|_)sm(?:7|8|9|1\d)\d_xmma|^nvjet_|cutlass_(?:7|8|9)\d_")
_SMALL_SHAPE_KERNELS = re.compile(r"gemv|gemmsn|gemmk1|dot_kernel", re.IGNORECASE)


def _has_tensor_core_hardware(capability: float | None, groups: list[KernelGroup]
                              ) -> bool | None:
    """True/False from the compute capability; without one, from which kernel builds ran;
    None when nothing says."""
    if capability is not None:
        return capability >= 7.0
    if any(g.tensor_core == "yes" or _VOLTA_OR_NEWER_KERNELS.search(g.name) for g in groups):
        return True
    if any(_PRE_VOLTA_KERNELS.search(g.name) for g in groups):
        return False
    return None


def _mixed_precision_run(groups: list[KernelGroup]) -> bool:
    """fp16/bf16/fp8 kernels anywhere: the run used autocast or low-precision tensors."""
    return any(g.dtype in LOW_PRECISION_DTYPES for g in groups)


def _likely_causes(kernels: list[KernelGroup], capability: float | None,
                   has_hardware: bool | None, mixed_precision: bool, device: str | None
                   ) -> list[str]:
    """Why these non-Tensor-Core matrix kernels (one op's) did not use Tensor Cores."""
    if has_hardware is False:
        where = f" ({device})" if device else (
            " (judged from the Maxwell/Pascal kernel builds; the trace names no GPU)")
        return [f"{CAUSE_NO_HARDWARE}{where}: Tensor Cores start with Volta (sm70)"]
    causes: list[str] = []
    dtypes = {g.dtype for g in kernels if g.dtype}
    if "fp32" in dtypes:
        if mixed_precision:
            causes.append(CAUSE_FP32_IN_AMP)
        if capability is not None and capability < 8.0:
            causes.append(CAUSE_FP32_PRE_AMPERE)
        elif not mixed_precision:
            causes.append(CAUSE_FP32_NO_TF32)
    if any(_SMALL_SHAPE_KERNELS.search(g.name) for g in kernels):
        causes.append(CAUSE_SMALL_SHAPES)
    if "bf16" in dtypes and capability is not None and capability < 8.0:
        causes.append(CAUSE_BF16_EMULATED)
    elif dtypes & {"fp16", "bf16"} and CAUSE_SMALL_SHAPES not in causes:
        causes.append(CAUSE_LOW_PRECISION_NO_TC)
    if "fp64" in dtypes:
        causes.append(CAUSE_FP64)
    if "complex64" in dtypes:
        causes.append(CAUSE_COMPLEX)
    return causes or [CAUSE_OTHER]


def could_have_didnt(groups: list[KernelGroup], device: str | None = None,
                     capability: str | None = None, limit: int = TOP_OPS_WITHOUT_TC
                     ) -> list[dict]:
    """CPU ops whose matrix kernels (gemm/conv/attention) ran without Tensor Cores, largest
    first, each with the kernels as evidence and likely causes."""
    no_tc = [g for g in groups if g.is_matrix and g.tensor_core == "no" and g.us > 0]
    if not no_tc:
        return []
    capability_number = _capability_number(capability)
    has_hardware = _has_tensor_core_hardware(capability_number, groups)
    mixed_precision = _mixed_precision_run(groups)
    matrix_us = _totals([g for g in groups if g.is_matrix], lambda g: g.cpu_op)
    entries = []
    for op in sorted({g.cpu_op for g in no_tc}):
        kernels = [g for g in no_tc if g.cpu_op == op]
        no_tc_us = _sum_us(kernels)
        entries.append({
            "cpu_op": op,
            "matrix_us": _us(matrix_us[op]),
            "without_tensor_core_us": _us(no_tc_us),
            "without_tensor_core_share": _share(no_tc_us, matrix_us[op]),
            "dtypes": sorted({g.dtype for g in kernels if g.dtype}),
            "kernels": _top_names(kernels),
            "likely_causes": _likely_causes(kernels, capability_number, has_hardware,
                                            mixed_precision, device),
        })
    entries.sort(key=lambda e: e["without_tensor_core_us"], reverse=True)
    return entries[:limit]


# ---------------------------------------------------------------------------------------
# verdict

def _top_names(groups: list[KernelGroup], count: int = 3) -> list[str]:
    return _largest_first(_totals(groups, lambda g: g.name))[:count]


def _dtype_words(groups: list[KernelGroup]) -> str:
    """"bf16" or "tf32/fp32": dtypes by time, largest first."""
    return "/".join(_largest_first(_totals(groups, lambda g: g.dtype or "unknown-dtype"))[:2])


@dataclass(frozen=True)
class _UnitWords:
    unit: str          # "Tensor Cores"
    kernels: str       # "tensor-core kernels"
    elsewhere: str     # "on CUDA cores"


_NVIDIA_WORDS = _UnitWords("Tensor Cores", "tensor-core kernels", "on CUDA cores")
# AMD's matrix units are "Matrix Cores" (MFMA instructions on CDNA); the evidence is the
# Tensile MI token and Composable Kernel's xdl/wmma families (engine.traces.kernels).
_AMD_WORDS = _UnitWords("Matrix Cores (AMD MFMA)", "matrix-core kernels", "on the vector ALUs")


def _verdict(groups: list[KernelGroup], device: str | None, capability: str | None,
             vendor: str | None = None) -> dict:
    words = _AMD_WORDS if vendor == "amd" else _NVIDIA_WORDS
    if not groups:
        return {"tensor_cores": "unknown", "evidence": [],
                "headline": "No GPU kernels in this trace: a CPU-only run, or the profiler "
                            "(CUPTI) recorded no GPU activity"}
    matrix = [g for g in groups if g.is_matrix]
    if not matrix:
        return {"tensor_cores": "unknown", "evidence": [],
                "headline": f"{words.unit}: unknown, no GEMM/conv/attention kernels in this trace"}
    matrix_us = _sum_us(matrix)
    if matrix_us <= 0:
        return {"tensor_cores": "unknown", "evidence": _top_names(matrix),
                "headline": f"{words.unit}: unknown, the matrix kernels have no duration"}
    yes_rows = [g for g in matrix if g.tensor_core == "yes"]
    no_rows = [g for g in matrix if g.tensor_core == "no"]
    unknown_rows = [g for g in matrix if g.tensor_core == "unknown"]
    yes_share = _sum_us(yes_rows) / matrix_us
    no_share = _sum_us(no_rows) / matrix_us
    unknown_share = _sum_us(unknown_rows) / matrix_us
    if unknown_share > yes_share + no_share:
        why = ("kernels whose names do not say (e.g. Triton)" if vendor != "amd" else
               "kernels whose names do not say; matrix-core verdicts on AMD are read from "
               "hipBLASLt/rocBLAS (Tensile MI tokens) and Composable Kernel names only")
        return {"tensor_cores": "unknown", "evidence": _top_names(unknown_rows),
                "headline": f"{words.unit}: unknown, {share_text(unknown_share)} of matrix time "
                            f"is in {why}"}
    if yes_share >= YES_SHARE:
        return {"tensor_cores": "yes", "evidence": _top_names(yes_rows),
                "headline": f"{words.unit}: yes, {share_text(yes_share)} of matrix time in "
                            f"{_dtype_words(yes_rows)} {words.kernels}"}
    elsewhere = ""
    if no_rows:
        example = _short_kernel_name(_top_names(no_rows, 1)[0])
        elsewhere = f"{words.elsewhere} ({_dtype_words(no_rows)}, e.g. {example})"
    if yes_share > 0:
        rest = (f"{share_text(no_share)} {elsewhere}" if no_rows else
                f"{share_text(unknown_share)} in kernels whose names do not say")
        return {"tensor_cores": "partly",
                "evidence": _top_names(yes_rows, 2) + _top_names(no_rows, 2),
                "headline": f"{words.unit}: partly, {share_text(yes_share)} of matrix time in "
                            f"{_dtype_words(yes_rows)} {words.kernels}; {rest}"}
    hardware = _has_tensor_core_hardware(_capability_number(capability), groups)
    why = f"; {device or 'this GPU'} has no Tensor Cores" if hardware is False else ""
    return {"tensor_cores": "no", "evidence": _top_names(no_rows),
            "headline": f"{words.unit}: no, {share_text(no_share)} of matrix time {elsewhere}{why}"}


# ---------------------------------------------------------------------------------------

def analyze_trace(path_or_fileobj: str | os.PathLike | IO[bytes]) -> dict:
    """The parsed kernel table's breakdown, plus the source and the defects."""
    table = load_trace(path_or_fileobj).table
    result = {"source": table.attrs.get("source"), **breakdown(table)}
    result["malformed_events"] = table.attrs.get("malformed_events", 0)
    return result


def kernel_summary_rows(table: KernelTable | Any) -> list[dict]:
    """One row per (kernel name, CPU op) with summed time, largest first (ties: first to
    run): the store's kernels table rows."""
    groups = kernel_groups(table)
    groups.sort(key=lambda g: g.us, reverse=True)  # stable
    return [{"name": g.name, "cpu_op": g.cpu_op, "total_us": _us(g.us), "count": g.count,
             "category": g.category, "tensor_core": g.tensor_core, "dtype": g.dtype,
             "reason": g.reason} for g in groups]
