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
