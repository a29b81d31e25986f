"""The numerics probe's records read back (runs/<id>/numerics.json): which steps were
sampled, and per layer what share of gradient/activation values falls outside fp16's
range with and without the loss scale. Written by engine.training.numerics; read by the
Compare page's Numerics view and the report. Torch-free.

Format ranges (docs/precision-reference.md#number-formats): fp16's smallest normal is
2**-14 and its largest finite value 65504; bf16 shares fp32's exponent range.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from engine.schema import NUMERICS_FILENAME

FILE_FORMAT = "precision-lab-numerics"
FILE_VERSION = 1

FP16_MIN_NORMAL = 2.0 ** -14  # ~6.10e-5: below this fp16 keeps fewer significant bits
FP16_MAX = 65504.0
BF16_MIN_NORMAL = 2.0 ** -126  # ~1.18e-38, as fp32

KINDS = ("activation", "output_grad", "grad")


def load(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records written by `NumericsProbe.save`; ValueError naming the file otherwise."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read numerics records ({exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FILE_FORMAT:
        raise ValueError(f"{path}: not a numerics file (expected format {FILE_FORMAT!r})")
    if payload.get("version", 0) > FILE_VERSION:
        raise ValueError(f"{path}: written by a newer Precision Lab "
                         f"(version {payload['version']} > {FILE_VERSION})")
    return list(payload.get("records") or [])


def numerics_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / NUMERICS_FILENAME


def sampled_steps(records: list[dict[str, Any]]) -> list[int]:
    return sorted({int(r["step"]) for r in records})


def fractions_rows(records: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """The per-layer table of one sampled step (percentages, None where n/a)."""
    rows = []
    for r in records:
        if r["step"] != step:
            continue
        rows.append({
            "layer": r["layer"], "kind": r["kind"], "dtype": r["dtype"], "values": r["numel"],
            "loss_scale": r.get("loss_scale"),
            "zero_pct": _pct(r.get("zero_frac")),
            "underflow_fp16_pct": _pct(r.get("underflow_frac_fp16")),
            "underflow_fp16_scaled_pct": _pct(r.get("underflow_frac_fp16_scaled")),
            "subnormal_fp16_pct": _pct(r.get("subnormal_frac_fp16")),
            "subnormal_fp16_scaled_pct": _pct(r.get("subnormal_frac_fp16_scaled")),
            "overflow_fp16_pct": _pct(r.get("overflow_frac_fp16")),
            "overflow_fp16_scaled_pct": _pct(r.get("overflow_frac_fp16_scaled")),
            "underflow_bf16_pct": _pct(r.get("underflow_frac_bf16")),
        })
    return rows


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None or not math.isfinite(fraction) else 100.0 * fraction


def _weighted(records: list[dict[str, Any]], key: str) -> float | None:
    """Share of all values (numel-weighted over layers) for one fraction field."""
    pairs = [(r.get(key), r.get("numel") or 0) for r in records]
    pairs = [(f, n) for f, n in pairs if f is not None and math.isfinite(f) and n]
    total = sum(n for _f, n in pairs)
    return sum(f * n for f, n in pairs) / total if total else None


def underflow_summary(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Activation gradients at the last sampled step: exact zeros, and what would
    underflow in fp16 without and with the run's loss scale (shares of all values)."""
    steps = sampled_steps(records)
    if not steps:
        return None
    step = steps[-1]
    grads = [r for r in records if r["step"] == step and r["kind"] == "output_grad"]
    if not grads:
        return None
    return {"step": step, "zero": _weighted(grads, "zero_frac"),
            "underflow_fp16": _weighted(grads, "underflow_frac_fp16"),
            "underflow_fp16_scaled": _weighted(grads, "underflow_frac_fp16_scaled"),
            "loss_scale": max((r.get("loss_scale") or 1.0) for r in grads)}


def underflow_sentence(name: str, summary: dict[str, Any]) -> str:
    """The numerics demo's point in one line per run: zero gradients, with and without
    the loss scale."""
    parts = [f"{name}: at step {summary['step']}"]
    if summary["zero"] is not None:
        parts.append(f"{summary['zero']:.1%} of activation gradients were exactly zero")
    if summary["underflow_fp16"] is not None:
        text = f"{summary['underflow_fp16']:.1%} would underflow to 0 in fp16 unscaled"
        if summary["loss_scale"] and summary["loss_scale"] != 1.0 \
                and summary["underflow_fp16_scaled"] is not None:
            text += (f", {summary['underflow_fp16_scaled']:.1%} with the loss scale "
                     f"{summary['loss_scale']:g}")
        parts.append(text)
    return ", ".join(parts[:1] + [", ".join(parts[1:])]) + "."


def numerics_findings(runs: list, run_dir) -> list[str]:
    """One underflow sentence per run that recorded numerics (`run_dir(run_id)` gives the
    run's directory); [] when none did."""
    statements = []
    for run in runs:
        path = numerics_path(run_dir(run.id))
        if not run.config.numerics or not path.exists():
            continue
        try:
            summary = underflow_summary(load(path))
        except ValueError:
            continue
        if summary:
            statements.append(underflow_sentence(run.config.label, summary))
    return statements
