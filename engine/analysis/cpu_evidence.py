"""The CPU's own Tensor-Core question: which oneDNN implementation ran each matrix
primitive, and does this CPU have a native low-precision matrix unit at all?

oneDNN names the ISA of every primitive it executes when verbose mode is on, e.g.
`brg_matmul:avx512_core_bf16` (native bf16 dot products) or
`brgconv:avx512_core_amx` (AMX tiles). A bf16/fp16 op with no oneDNN primitive at all
fell back to ATen's reference code: emulated. Verbose mode is switched on only for the
profiler window (engine.training.onednn) and its output parsed here.
See docs/precision-reference.md#cpu-evidence-onednn-verbose.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from engine.hardware.cpu_units import cpu_matrix_unit, unit_for_isa

MATRIX_PRIMITIVES = ("matmul", "inner_product", "convolution", "deconvolution")
_DTYPE_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "s8": "int8", "u8": "int8",
                "f8_e4m3": "fp8", "f8_e5m2": "fp8"}

NATIVE_AMX = "AMX tiles"
NATIVE_BF16_DOT = "AVX-512 BF16 dot products"
NATIVE_FP16 = "AVX-512 FP16 vector units (about fp32 speed)"
EMULATED = "no native low-precision matrix unit: emulated"
NOT_APPLICABLE = "not applicable"  # an fp32 run: there is no low-precision question
UNKNOWN = "unknown"
NATIVE_VERDICTS = (NATIVE_AMX, NATIVE_BF16_DOT, NATIVE_FP16)


def verdict_tone(verdict: str) -> str:
    """How a surface should colour a CPU verdict: native | neutral | emulated."""
    if verdict in NATIVE_VERDICTS:
        return "native"
    return "neutral" if verdict in (NOT_APPLICABLE, UNKNOWN) else "emulated"


def primitive_summary(primitives: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recorded matrix primitives grouped by (kind, src dtype, implementation): count and
    summed execution time, slowest group first."""
    groups: dict[tuple, dict[str, Any]] = defaultdict(lambda: {"count": 0, "exec_ms": 0.0})
    for prim in primitives:
        key = (prim.get("kind"), prim.get("src_dtype"), prim.get("implementation"))
        groups[key]["count"] += 1
        groups[key]["exec_ms"] += prim.get("exec_ms") or 0.0
    rows = [{"kind": kind, "src_dtype": dtype, "implementation": impl, **totals}
            for (kind, dtype, impl), totals in groups.items()]
    return sorted(rows, key=lambda row: row["exec_ms"], reverse=True)


@dataclass(frozen=True)
class Primitive:
    kind: str  # matmul | inner_product | convolution | reorder | ...
    implementation: str  # e.g. "brg_matmul:avx512_core_bf16", "jit:avx2", "ref:any"
    isa: str  # the part after ':' ("avx512_core_bf16"), or the implementation itself
    src_dtype: str  # fp32 | bf16 | fp16 | int8 | fp8 | unknown
    problem: str
    exec_ms: float | None

    @property
    def is_matrix(self) -> bool:
        return self.kind in MATRIX_PRIMITIVES


def parse_onednn_verbose(text: str) -> list[Primitive]:
    """Primitive executions from oneDNN verbose output (v1 format, oneDNN 3.x)."""
    primitives = []
    for line in text.splitlines():
        if not line.startswith(("onednn_verbose,", "dnnl_verbose,")):
            continue
        fields = line.split(",")
        # v1 lines carry a version field: onednn_verbose,v1,primitive,exec,cpu,...
        if len(fields) > 1 and fields[1].startswith("v") and fields[1][1:].isdigit():
            fields = [fields[0]] + fields[2:]
        if len(fields) < 10 or fields[1] != "primitive" or fields[2] != "exec":
            continue
        kind, impl, descriptors = fields[4], fields[5], fields[7]
        primitives.append(Primitive(
            kind=kind, implementation=impl,
            isa=impl.split(":", 1)[1] if ":" in impl else impl,
            src_dtype=_src_dtype(descriptors), problem=fields[-2],
            exec_ms=_float_or_none(fields[-1])))
    return primitives


def _src_dtype(descriptors: str) -> str:
    for descriptor in descriptors.split():
        name, _, rest = descriptor.partition(":")
        if name in ("src", "src_m"):
            return _DTYPE_NAMES.get(rest.split(":", 1)[0], "unknown")
    return "unknown"


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def cpu_verdict(primitives: list[Primitive], compute_dtype: str,
                cpu_flags: frozenset[str] = frozenset()) -> dict:
    """What ran the matrix work of a CPU run, with the primitive names as evidence.

    `compute_dtype` is the run's intended matrix dtype (fp32, bf16, fp16).
    """
    matrix = [p for p in primitives if p.is_matrix]
    low_precision = [p for p in matrix if p.src_dtype in ("bf16", "fp16")]
    evidence = sorted({f"{p.kind} {p.src_dtype} {p.implementation}" for p in matrix})[:12]
    if compute_dtype not in ("bf16", "fp16"):
        isas = sorted({p.isa for p in matrix})
        unit = cpu_matrix_unit(cpu_flags, "fp32") if cpu_flags else None
        headline = (unit.words if unit else "fp32 matmuls on the CPU's vector units") + (
            f" ({', '.join(isas)})" if isas else " (MKL / ATen; no oneDNN matrix primitive "
            "was recorded)")
        return _verdict(NOT_APPLICABLE, headline, evidence, matrix)
    native = [(unit, p) for p in low_precision
              if (unit := unit_for_isa(p.isa, compute_dtype)) is not None]
    if native:
        # The most capable unit any primitive used names the run (AMX over dot products).
        unit, prim = max(native, key=lambda pair: _UNIT_RANK.get(_verdict_id(pair[0]), 0))
        by_flags = cpu_matrix_unit(cpu_flags, compute_dtype) if cpu_flags else None
        if by_flags is not None and by_flags.unit == unit.unit:
            unit = by_flags  # the same unit: the device card's exact words
        return _verdict(_verdict_id(unit), f"{unit.words} ({prim.implementation})",
                        evidence, matrix)
    missing = _missing_flags(compute_dtype, cpu_flags)
    if not low_precision and cpu_flags and not missing.count(" and "):
        # The CPU has a native unit but oneDNN recorded no primitive for it: the matmuls
        # may have gone to MKL, which does not report its ISA. Say so rather than guess.
        return _verdict(UNKNOWN, f"no oneDNN {compute_dtype} matrix primitive was recorded, "
                        f"although this CPU has native {compute_dtype} support; the work may "
                        "have run in MKL, which does not report its ISA", evidence, matrix)
    if low_precision:
        why = (f"{compute_dtype} primitives ran on {', '.join(sorted({p.isa for p in low_precision}))}, "
               "which converts to fp32 in software")
    else:
        why = (f"no oneDNN {compute_dtype} matrix primitive ran; the matmuls fell back to "
               "ATen's reference code")
    if missing:
        why += f"; this CPU lacks {missing}"
    return _verdict(EMULATED, f"emulated, no native {compute_dtype} matrix unit ({why})",
                    evidence, matrix)


_UNIT_RANK = {NATIVE_AMX: 3, NATIVE_BF16_DOT: 2, NATIVE_FP16: 1}


def _verdict_id(unit) -> str:
    if unit.unit.startswith("AMX"):
        return NATIVE_AMX
    return NATIVE_BF16_DOT if "BF16" in unit.unit else NATIVE_FP16


def _missing_flags(compute_dtype: str, cpu_flags: frozenset[str]) -> str:
    if not cpu_flags:
        return ""
    wanted = ("avx512_bf16", "amx_bf16") if compute_dtype == "bf16" else ("avx512_fp16", "amx_fp16")
    return " and ".join(flag for flag in wanted if flag not in cpu_flags)


def _verdict(verdict: str, headline: str, evidence: list[str], matrix: list[Primitive]) -> dict:
    return {"verdict": verdict, "headline": headline, "evidence": evidence,
            "matrix_primitives": len(matrix),
            "primitives": [asdict(p) for p in matrix[:50]]}
