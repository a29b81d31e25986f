"""The CPU's own Tensor-Core question: which oneDNN implementation ran each matrix
primitive, how much of the matrix time each took, and what a mode means on this CPU.

oneDNN names the implementation and ISA of every primitive it executes when verbose mode
is on, e.g. `brg_matmul:avx512_core_bf16` (native bf16 dot products),
`brgconv:avx512_core_amx` (AMX tiles) or `ref:any` (its reference C++ loops). The CPU
flags say what the CPU could do; only this log says what it did. So a run's verdict is
decided from the primitives that ran, weighted by their time: per kind of matrix op
(matmul / inner product, convolution forward, backward data, backward weights) the
implementation that took most of its time, and the share of all matrix time spent in
reference code. A reference share that dominates decides the verdict, whatever unit
the other primitives used: one fp16 convolution pass in `ref:any` made a resnet step 14x
slower than fp32 on a CPU whose flags promise fp16 vector units.

Before a run, the same words come from a short probe per dtype (a small matmul and one
convolution forward + backward under verbose mode, engine.diagnostics.onednn_probe,
cached by engine.hardware.cpu_probe). `cpu_mode_words` is the one function that words a
mode on this CPU for every surface. See docs/precision-reference.md#cpu-evidence-onednn-verbose.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from engine.config import COMPUTE_DTYPES, Precision
from engine.display import share_text
from engine.hardware.cpu_probe import PROBE_DTYPES, probe_for_dtype
from engine.hardware.cpu_units import (
    EMULATED as FLAGS_EMULATED,
)
from engine.hardware.cpu_units import (
    NATIVE as FLAGS_NATIVE,
)
from engine.hardware.cpu_units import (
    UNSUPPORTED as FLAGS_UNSUPPORTED,
)
from engine.hardware.cpu_units import (
    cpu_matrix_unit,
    implementation_unit,
    is_reference_implementation,
    unit_for_isa,
)
from engine.hardware.devices import mode_support

MATRIX_PRIMITIVES = ("matmul", "inner_product", "convolution", "deconvolution")
_DTYPE_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "s8": "int8", "u8": "int8",
                "f8_e4m3": "fp8", "f8_e5m2": "fp8"}

# The kinds of matrix op a verdict is decided per, in the order every table lists them.
OP_KINDS = ("matmul", "conv_forward", "conv_backward_data", "conv_backward_weights")
OP_KIND_LABELS = {"matmul": "matmul / inner product", "conv_forward": "convolution forward",
                  "conv_backward_data": "convolution backward data",
                  "conv_backward_weights": "convolution backward weights"}

NATIVE_AMX = "AMX tiles"
NATIVE_BF16_DOT = "AVX-512 BF16 dot products"
NATIVE_FP16 = "AVX-512 FP16 vector units (about fp32 speed)"
EMULATED = "no native low-precision matrix unit: emulated"
REFERENCE = "oneDNN reference code"  # most matrix time in `ref` implementations
NOT_APPLICABLE = "not applicable"  # an fp32 run: there is no low-precision question
UNKNOWN = "unknown"
NATIVE_VERDICTS = (NATIVE_AMX, NATIVE_BF16_DOT, NATIVE_FP16)
# The verdicts that explain a slow low-precision run: its matrix work converted to fp32 in
# software, or ran oneDNN's reference (non-vectorised) code.
SLOW_CPU_VERDICTS = (EMULATED, REFERENCE)

# Reference code at half the matrix time or more decides the verdict: at the 10-100x
# slowdown of `ref` against a jit kernel, that half is already most of the step.
REFERENCE_DOMINATES = 0.5
# Below that, a reference share this large is still named in the headline.
REFERENCE_NOTABLE = 0.1
# A probe's op this many times slower than fp32 says "expect far slower" before a run.
FAR_SLOWER_RATIO = 0.5


def verdict_tone(verdict: str) -> str:
    """How a surface should colour a CPU verdict: native | neutral | emulated."""
    if verdict in NATIVE_VERDICTS:
        return "native"
    return "neutral" if verdict in (NOT_APPLICABLE, UNKNOWN) else "emulated"


@dataclass(frozen=True)
class Primitive:
    kind: str  # matmul | inner_product | convolution | reorder | ...
    implementation: str  # e.g. "brg_matmul:avx512_core_bf16", "jit:avx2", "ref:any"
    isa: str  # the part after ':' ("avx512_core_bf16"), or the implementation itself
    src_dtype: str  # fp32 | bf16 | fp16 | int8 | fp8 | unknown
    problem: str
    exec_ms: float | None
    prop_kind: str = ""  # forward_training | backward_data | backward_weights | undef ...

    @property
    def is_matrix(self) -> bool:
        return self.kind in MATRIX_PRIMITIVES

    @property
    def is_reference(self) -> bool:
        return is_reference_implementation(self.implementation)

    @property
    def op_kind(self) -> str | None:
        """matmul | conv_forward | conv_backward_data | conv_backward_weights; None for
        a primitive that is not matrix work."""
        return op_kind(self.kind, self.prop_kind)


def op_kind(kind: str | None, prop_kind: str | None) -> str | None:
    if kind in ("matmul", "inner_product"):
        return "matmul"
    if kind not in ("convolution", "deconvolution"):
        return None
    prop = prop_kind or ""
    if prop == "backward_data":
        return "conv_backward_data"
    # "backward" (data and weights in one) is counted with the weights pass
    return "conv_backward_weights" if prop.startswith("backward") else "conv_forward"


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
        kind, impl, prop, descriptors = fields[4], fields[5], fields[6], fields[7]
        primitives.append(Primitive(
            kind=kind, implementation=impl,
            isa=impl.split(":", 1)[1] if ":" in impl else impl,
            src_dtype=_src_dtype(descriptors), problem=fields[-2],
            exec_ms=_float_or_none(fields[-1]), prop_kind=prop))
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


def _as_primitive(prim: Primitive | Mapping[str, Any]) -> Primitive:
    if isinstance(prim, Primitive):
        return prim
    return Primitive(kind=str(prim.get("kind") or ""),
                     implementation=str(prim.get("implementation") or ""),
                     isa=str(prim.get("isa") or ""), src_dtype=str(prim.get("src_dtype") or ""),
                     problem=str(prim.get("problem") or ""), exec_ms=prim.get("exec_ms"),
                     prop_kind=str(prim.get("prop_kind") or ""))


# ---------------------------------------------------------------------------------------
# time-weighted tables


def primitive_summary(primitives: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recorded matrix primitives grouped by (kind of op, src dtype, implementation): count,
    summed execution time, share of the matrix time and the unit it ran on, slowest first."""
    groups: dict[tuple, dict[str, Any]] = defaultdict(lambda: {"count": 0, "exec_ms": 0.0})
    for prim in map(_as_primitive, primitives):
        key = (prim.op_kind or prim.kind, prim.src_dtype, prim.implementation)
        groups[key]["count"] += 1
        groups[key]["exec_ms"] += prim.exec_ms or 0.0
    total_ms = sum(group["exec_ms"] for group in groups.values())
    rows = [{"kind": OP_KIND_LABELS.get(kind, kind), "src_dtype": dtype, "implementation": impl,
             "unit": implementation_unit(impl, dtype), **totals,
             "share of matrix time": share_text(totals["exec_ms"] / total_ms, 1)
             if total_ms > 0 else share_text(None)}
            for (kind, dtype, impl), totals in groups.items()]
    return sorted(rows, key=lambda row: row["exec_ms"], reverse=True)


def kind_table(primitives: list[Primitive | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per kind of matrix op that ran: its time, its share of all matrix time, the
    implementation that took most of its time and the unit that is, and its time in
    reference code. Kinds in OP_KINDS order."""
    matrix = [p for p in map(_as_primitive, primitives) if p.op_kind is not None]
    total_ms = sum(p.exec_ms or 0.0 for p in matrix)
    rows = []
    for kind in OP_KINDS:
        mine = [p for p in matrix if p.op_kind == kind]
        if not mine:
            continue
        by_impl: dict[tuple[str, str], float] = defaultdict(float)
        for prim in mine:
            by_impl[(prim.implementation, prim.src_dtype)] += prim.exec_ms or 0.0
        (impl, dtype), _ms = max(by_impl.items(), key=lambda item: item[1])
        kind_ms = sum(p.exec_ms or 0.0 for p in mine)
        reference_ms = sum(p.exec_ms or 0.0 for p in mine if p.is_reference)
        rows.append({
            "kind": kind, "label": OP_KIND_LABELS[kind], "count": len(mine),
            "exec_ms": round(kind_ms, 4),
            "share": kind_ms / total_ms if total_ms > 0 else None,
            "implementation": impl, "src_dtype": dtype,
            "unit": implementation_unit(impl, dtype),
            "reference": is_reference_implementation(impl),
            "reference_ms": round(reference_ms, 4),
            "reference_share": reference_ms / total_ms if total_ms > 0 else None,
        })
    return rows


def reference_share(primitives: list[Primitive | Mapping[str, Any]]) -> float | None:
    """The share of the matrix primitives' time spent in oneDNN reference code; None when
    no matrix primitive with a time ran."""
    matrix = [p for p in map(_as_primitive, primitives) if p.op_kind is not None]
    total_ms = sum(p.exec_ms or 0.0 for p in matrix)
    if total_ms <= 0:
        return None
    return sum(p.exec_ms or 0.0 for p in matrix if p.is_reference) / total_ms


def _noun(kinds: list[str]) -> str:
    if all(kind.startswith("conv") for kind in kinds):
        return "convolutions"
    return "matmuls" if all(kind == "matmul" for kind in kinds) else "matrix ops"


def reference_words(table: list[dict[str, Any]], share: float, where: str = "") -> str:
    """"fp16 convolutions ran oneDNN's reference code: 97 % of matrix time (backward
    weights: ref:any); expect far slower than fp32"; `where` e.g. " in this machine's
    probe"."""
    rows = sorted((row for row in table if row["reference_ms"] > 0),
                  key=lambda row: row["reference_ms"], reverse=True)
    dtypes = sorted({row["src_dtype"] for row in rows}) or ["the"]
    passes = ", ".join(f"{row['label'].removeprefix('convolution ')}: {row['implementation']}"
                       for row in rows)
    against = ("oneDNN's vector kernels" if dtypes == ["fp32"] else "fp32")
    return (f"{'/'.join(dtypes)} {_noun([row['kind'] for row in rows])} ran oneDNN's "
            f"reference code{where}: {share_text(share)} of matrix time ({passes}); expect "
            f"far slower than {against}")


def evidence_lines(primitives: list[Primitive]) -> list[str]:
    """One line per (kind of op, dtype, implementation), the most matrix time first, with
    its share: the deciding evidence leads, so a surface that shows only the first few
    shows it."""
    rows = primitive_summary([asdict(p) for p in primitives if p.is_matrix])
    return [f"{row['kind']} {row['src_dtype']} {row['implementation']}: "
            f"{row['share of matrix time']} of matrix time" for row in rows][:12]


# ---------------------------------------------------------------------------------------
# a run's verdict


def cpu_verdict(primitives: list[Primitive], compute_dtype: str,
                cpu_flags: frozenset[str] = frozenset()) -> dict:
    """What ran the matrix work of a CPU run, decided from the primitives weighted by
    their time, with the primitive names as evidence.

    `compute_dtype` is the run's intended matrix dtype (fp32, bf16, fp16).
    """
    matrix = [p for p in primitives if p.is_matrix]
    low_precision = [p for p in matrix if p.src_dtype in ("bf16", "fp16")]
    table = kind_table(matrix)
    share = reference_share(matrix)
    evidence = evidence_lines(matrix)
    if share is not None and share >= REFERENCE_DOMINATES:
        return _verdict(REFERENCE, reference_words(table, share), evidence, matrix, table,
                        share)
    note = (f"; {share_text(share)} of matrix time in oneDNN's reference code"
            if share is not None and share >= REFERENCE_NOTABLE else "")
    if compute_dtype not in ("bf16", "fp16"):
        isas = sorted({p.isa for p in matrix})
        unit = cpu_matrix_unit(cpu_flags, "fp32") if cpu_flags else None
        headline = (unit.words if unit else "fp32 matmuls on the CPU's vector units") + (
            f" ({', '.join(isas)})" if isas else " (MKL / ATen; no oneDNN matrix primitive "
            "was recorded)")
        return _verdict(NOT_APPLICABLE, headline + note, evidence, matrix, table, share)
    # Time-weighted: the unit that ran most of the low-precision matrix time names the
    # run (None: conversion code on a non-native ISA).
    by_unit: dict[str | None, list] = defaultdict(lambda: [0.0, None, None])
    for prim in low_precision:
        unit = unit_for_isa(prim.isa, compute_dtype)
        entry = by_unit[unit.unit if unit else None]
        entry[0] += prim.exec_ms or 0.0
        entry[1], entry[2] = unit, entry[2] or prim
    if by_unit:
        _ms, unit, prim = max(by_unit.values(), key=lambda entry: (
            entry[0], _UNIT_RANK.get(_verdict_id(entry[1]) if entry[1] else "", 0)))
        if unit is not None:
            by_flags = cpu_matrix_unit(cpu_flags, compute_dtype) if cpu_flags else None
            if by_flags is not None and by_flags.unit == unit.unit:
                unit = by_flags  # the same unit: the device card's exact words
            return _verdict(_verdict_id(unit), f"{unit.words} ({prim.implementation}){note}",
                            evidence, matrix, table, share)
    missing = _missing_flags(compute_dtype, cpu_flags)
    if not low_precision and cpu_flags and not missing.count(" and "):
        # The CPU has a native unit but oneDNN recorded no primitive for it: the matmuls
        # may have gone to MKL, which does not report its ISA. Say so rather than guess.
        return _verdict(UNKNOWN, f"no oneDNN {compute_dtype} matrix primitive was recorded, "
                        f"although this CPU has native {compute_dtype} support; the work may "
                        "have run in MKL, which does not report its ISA", evidence, matrix,
                        table, share)
    if low_precision:
        # the ISAs of the conversion code that decided, not of the native minority
        isas = ", ".join(sorted({p.isa for p in low_precision if not p.is_reference
                                 and unit_for_isa(p.isa, compute_dtype) is None}))
        why = (f"{compute_dtype} primitives ran on {isas}, which converts to fp32 in software"
               if isas else f"{compute_dtype} primitives ran oneDNN's reference code")
    else:
        why = (f"no oneDNN {compute_dtype} matrix primitive ran; its matmuls and "
               "convolutions fell back to ATen's own code")
    if missing:
        why += f"; this CPU lacks {missing}"
    return _verdict(EMULATED, f"emulated, no native {compute_dtype} matrix unit ({why}){note}",
                    evidence, matrix, table, share)


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


def _verdict(verdict: str, headline: str, evidence: list[str], matrix: list[Primitive],
             table: list[dict[str, Any]], share: float | None) -> dict:
    return {"verdict": verdict, "headline": headline, "evidence": evidence,
            "reference_share": share, "by_kind": table,
            "matrix_ms": round(sum(p.exec_ms or 0.0 for p in matrix), 4),
            "matrix_primitives": len(matrix),
            "primitives": [asdict(p) for p in _kept(matrix)]}


def _kept(matrix: list[Primitive], limit: int = 50) -> list[Primitive]:
    """The primitives stored with the verdict: the slowest `limit`, so the evidence a
    reader recomputes from them (the Kernels page's table) keeps what decided it."""
    return sorted(matrix, key=lambda p: p.exec_ms or 0.0, reverse=True)[:limit]


def kernels_verdict(evidence: Mapping[str, Any] | None) -> dict[str, Any]:
    """A CPU run's verdict in the shape `engine kernels` gives a GPU trace's: the CPU
    evidence's headline and deciding lines instead of "no GPU kernels"."""
    if not evidence:
        return {"tensor_cores": "not applicable", "cpu_verdict": UNKNOWN, "evidence": [],
                "headline": "CPU trace: no oneDNN verbose log recorded with it, so which "
                            "implementation ran the matrix work is not known"}
    return {"tensor_cores": "not applicable", "cpu_verdict": evidence.get("verdict"),
            "evidence": list(evidence.get("evidence") or [])[:4],
            "reference_share": evidence.get("reference_share"),
            "headline": f"CPU matrix unit: {evidence.get('headline')}"}


# ---------------------------------------------------------------------------------------
# what a mode means on this CPU: flags (known before a run) and what ran (measured)


def probe_words(probe_dtype: Mapping[str, Any] | None, dtype: str) -> tuple[str | None, str]:
    """(the measured sentence, tone) from one dtype of this machine's oneDNN probe
    (engine.hardware.cpu_probe); (None, "") when not measured."""
    if not probe_dtype or not probe_dtype.get("ops"):
        return None, ""
    ops = probe_dtype["ops"]
    primitives = [prim for op in ops.values() for prim in op.get("primitives") or []]
    table = kind_table(primitives)
    share = reference_share(primitives)
    speeds = probe_dtype.get("speed_vs_fp32") or {}
    speed = "; ".join(f"{op} {_speed_text(ratio)}" for op, ratio in sorted(speeds.items())
                      if ratio and dtype != "fp32")
    if speed and probe_dtype.get("busy"):
        speed += " (timed while the machine was busy: rough)"
    if share is not None and share >= REFERENCE_DOMINATES:
        words = reference_words(table, share, where=" in this machine's probe")
        return words + (f" (probe: {speed})" if speed else ""), "emulated"
    ran = "; ".join(_op_ran(op, measured, [row for row in table if _op_of(row["kind"]) == op],
                            dtype) for op, measured in ops.items())
    slow = any(ratio and ratio < FAR_SLOWER_RATIO for ratio in speeds.values())
    tone = "emulated" if slow and dtype != "fp32" else ""
    return (f"{ran}" + (f"; {speed}" if speed else "")
            + ("; expect far slower than fp32" if tone else "")), tone


def _op_of(kind: str) -> str:
    return "matmul" if kind == "matmul" else "conv"


def _op_ran(op: str, measured: Mapping[str, Any], rows: list[dict[str, Any]],
            dtype: str) -> str:
    """"conv: forward jit:avx2, backward data jit:avx2, ...", "matmul: brg_matmul:avx2" or
    "matmul: no oneDNN primitive (MKL or ATen's own code)"."""
    if measured.get("error"):
        return f"{op}: failed in the probe ({measured['error']})"
    if not rows:
        return f"{op}: no oneDNN {dtype} primitive (MKL or ATen's own code)"
    return f"{op}: " + ", ".join(
        (f"{row['label'].removeprefix('convolution ')} " if row["kind"] != "matmul" else "")
        + row["implementation"] for row in rows)


def _speed_text(ratio: float) -> str:
    return (f"{1 / ratio:.0f}x slower than fp32" if ratio < FAR_SLOWER_RATIO
            else f"{ratio:.2f}x fp32")


def cpu_mode_words(cpu_flags: frozenset[str], dtype: str,
                   probe_dtype: Mapping[str, Any] | None = None,
                   run_evidence: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The one wording of a mode's dtype on a CPU, for every surface before a run (doctor,
    the device card, Launch, the CPU check; a run's Kernels and Live show its own verdict,
    `cpu_verdict`, decided by the same rules): what the flags say before anything ran
    (`known`), apart from what was measured (`measured`: a run's oneDNN evidence when
    given, else this machine's probe), the colour (`tone`: native | neutral |
    emulated | unsupported) and the sentence to show (`words`)."""
    unit = cpu_matrix_unit(cpu_flags, dtype)
    known = f"flags: {unit.words}"
    if unit.status == FLAGS_UNSUPPORTED:
        return {"dtype": dtype, "status": unit.status, "tone": "unsupported", "known": known,
                "measured": None, "source": None, "reference_share": None,
                "words": unit.words}
    tone = "native" if unit.status == FLAGS_NATIVE and dtype != "fp32" else (
        "emulated" if unit.status == FLAGS_EMULATED else "neutral")
    if run_evidence:
        measured, source = f"this run: {run_evidence.get('headline')}", "run"
        tone = verdict_tone(str(run_evidence.get("verdict")))
        share = run_evidence.get("reference_share")
    else:
        sentence, probe_tone = probe_words(probe_dtype, dtype)
        share = None
        if sentence is None:
            measured, source = None, None
        else:
            measured, source = f"measured: {sentence}", "probe"
            tone = probe_tone or tone
            share = reference_share([prim for op in (probe_dtype or {}).get("ops", {}).values()
                                     for prim in op.get("primitives") or []])
    words = known + (f"; {measured}" if measured else
                     "; not measured on this machine yet (`python -m engine check` runs the "
                     "oneDNN probe)")
    return {"dtype": dtype, "status": unit.status, "tone": tone, "known": known,
            "measured": measured, "source": source, "reference_share": share, "words": words}


def device_mode_words(device, mode: str) -> dict[str, Any] | None:
    """`cpu_mode_words` for a precision mode on a CPU device (engine.hardware.devices
    .DeviceInfo), with this machine's stored oneDNN probe; None for a GPU. Reads a JSON
    file, never measures: the pages call it."""
    if getattr(device, "kind", "cpu") != "cpu":
        return None
    dtype = COMPUTE_DTYPES[Precision(mode)]
    probe = probe_for_dtype(device.key, device.name, dtype) if dtype in PROBE_DTYPES else None
    return cpu_mode_words(device.cpu_flags, dtype, probe)


MEASURED_SLOW = "native by its flags, slow here (measured)"


def mode_words(device, mode: str) -> dict[str, Any]:
    """What a precision mode means on a device, for every surface before a run (doctor,
    the device card, Launch, the check): {"status" (native | emulated | unsupported, from
    engine.hardware.devices), "badge" (the status, or MEASURED_SLOW where this CPU's probe
    saw reference code or a far slower op), "tone", "words"}. A GPU's words are its mode
    support's reason; a CPU's are `cpu_mode_words` (flags apart from the probe)."""
    support = mode_support(device, Precision(mode))
    cpu = device_mode_words(device, mode)
    if cpu is None:
        return {"status": support.status, "badge": support.status, "tone": support.status,
                "words": support.reason}
    badge = (MEASURED_SLOW if support.status == FLAGS_NATIVE and cpu["tone"] == "emulated"
             else support.status)
    return {"status": support.status, "badge": badge, "tone": cpu["tone"],
            "words": cpu["words"]}
