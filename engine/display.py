"""One formatter per kind of figure, used by every surface (pages, report, CLI, findings).

A person who reads "1.2" on Live and "1.1995" on Compare, or "512.0 MiB" on one page and
"0.500 GiB" on the next, cannot tell whether the two are the same figure. Every surface
formats a figure of a kind through the function here, so the same run reads the same
everywhere; tables that keep numbers (sortable grids) use the printf twins below, which
print the same digits, without thousands separators (a grid sorts and downloads the
number itself; printf cannot switch digits, so there a loss under 0.001 reads 0.0000).

- memory: binary units (MiB below 1 GiB, GiB from there), by size; a table column takes
  one unit for all its rows (`memory_unit`), named in its header.
- loss: four decimals (the digits at which precisions differ after a few hundred steps).
- throughput: one decimal; step time: two decimals in ms; ratios (speedups): two
  decimals, more digits when tiny.
- shares (Tensor-Core share) and MFU: percentages that never round to a claim they are not.
- a figure not measured: "n/a", never "None" or "nan".
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

NA = "n/a"
MIB = 2**20
GIB = 2**30
MEMORY_UNITS = {"MiB": MIB, "GiB": GIB}
MEMORY_DECIMALS = {"MiB": 1, "GiB": 2}
LOSS_DECIMALS = 4
THROUGHPUT_DECIMALS = 1
STEP_TIME_DECIMALS = 2  # CPU MLP steps take 1-3 ms: one decimal would hide a 4 % change

# Two memory figures, two names, on every surface (engine.training.memory): the bytes
# tensors held at the step's peak, and what the process held (CPU: peak resident set;
# CUDA: the allocator's peak reserved bytes).
TENSOR_PEAK_NAME = "tensor peak"
PROCESS_PEAK_NAME = "process peak"
# The tensor peak's split (engine.training.memory.memory_by_kind): key, words.
MEMORY_KINDS = (("parameters_bytes", "parameters"), ("gradients_bytes", "gradients"),
                ("optimizer_state_bytes", "optimizer state"),
                ("master_copies_bytes", "fp32 master copies"),
                ("rest_bytes", "activations, autocast cache, workspace"))

# The same digits for a sortable grid column (Streamlit's NumberColumn takes printf).
LOSS_PRINTF = f"%.{LOSS_DECIMALS}f"
THROUGHPUT_PRINTF = f"%.{THROUGHPUT_DECIMALS}f"
STEP_TIME_PRINTF = f"%.{STEP_TIME_DECIMALS}f"


def measured(value: object) -> bool:
    """A number that was measured: not None, not NaN or infinite, not a bool (numpy's
    numbers are numbers.Real too: pandas hands them out)."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


def memory_unit(values_bytes: Iterable[object]) -> str:
    """The unit for a column of byte counts: GiB when its largest is 1 GiB or more."""
    largest = max((abs(v) for v in values_bytes if measured(v)), default=0.0)
    return "GiB" if largest >= GIB else "MiB"


def memory_value(value_bytes: object, unit: str) -> float | None:
    """Bytes in `unit`, rounded to the digits `memory_text` prints; None when not measured."""
    if not measured(value_bytes) or not value_bytes:
        return None
    return round(float(value_bytes) / MEMORY_UNITS[unit], MEMORY_DECIMALS[unit])


def memory_printf(unit: str) -> str:
    return f"%.{MEMORY_DECIMALS[unit]}f"


def memory_text(value_bytes: object, unit: str | None = None, with_unit: bool = True) -> str:
    """ "512.0 MiB", "1.23 GiB" (the unit by size unless given); "n/a" when not measured
    (a peak of 0 bytes means no reading, not an empty process)."""
    if not measured(value_bytes) or not value_bytes:
        return NA
    unit = unit or memory_unit([value_bytes])
    number = f"{float(value_bytes) / MEMORY_UNITS[unit]:,.{MEMORY_DECIMALS[unit]}f}"
    return f"{number} {unit}" if with_unit else number


def memory_split_text(split: object) -> str:
    """A tensor peak's split (engine.training.memory.memory_by_kind) in one unit:
    "parameters 0.3 MiB; gradients 0.3 MiB; ..."; a kind that holds nothing (no fp32
    master copies) is left out; "n/a" when there is no split."""
    if not isinstance(split, dict) or not measured(split.get("peak_bytes")):
        return NA
    unit = memory_unit([split["peak_bytes"]])
    parts = []
    for key, words in MEMORY_KINDS:
        value = split.get(key)
        if measured(value) and (value or key != "master_copies_bytes"):
            parts.append(f"{words} {float(value) / MEMORY_UNITS[unit]:,.{MEMORY_DECIMALS[unit]}f}"
                         f" {unit}")
    return "; ".join(parts) or NA


def loss_text(loss: object) -> str:
    """ "1.1995"; a loss under 0.001 in three significant digits ("2.35e-05")."""
    if not measured(loss):
        return NA
    if loss != 0 and abs(loss) < 1e-3:
        return f"{loss:.2e}"
    return f"{loss:,.{LOSS_DECIMALS}f}"


def throughput_text(per_s: object, unit: str = "") -> str:
    """ "1,234.5 samples/s" (the unit when given)."""
    if not measured(per_s):
        return NA
    number = f"{per_s:,.{THROUGHPUT_DECIMALS}f}"
    return f"{number} {unit}" if unit else number


def step_time_text(step_time_ms: object, with_unit: bool = True) -> str:
    """ "12.34 ms" (a step's wall time)."""
    if not measured(step_time_ms):
        return NA
    number = f"{step_time_ms:,.{STEP_TIME_DECIMALS}f}"
    return f"{number} ms" if with_unit else number


def ratio_text(ratio: object) -> str:
    """ "2.00x"; a ratio many times below 1 keeps its digits ("0.0027x", not "0.00x")."""
    if not measured(ratio) or not ratio:
        return NA
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


def interval_text(low: object, high: object) -> str:
    """A ratio's 95 % interval: "1.21-1.34x"; "" when there is none (a baseline, too few
    steady steps): a blank, not "n/a", beside a ratio that says why."""
    if not (measured(low) and measured(high)):
        return ""
    return f"{low:.2f}-{high:.2f}x"


def loss_scale_text(scale: object) -> str:
    """A GradScaler scale: "512", "65536"; a power of two past 2^20 as "2^32" (the loss-scale
    chart's axis speaks in powers of two; "4.29497e+09" hides that)."""
    if not measured(scale):
        return NA
    if scale > 0 and float(scale).is_integer():
        exponent = int(scale).bit_length() - 1
        if 1 << exponent == int(scale) and exponent > 20:
            return f"2^{exponent}"
        return f"{int(scale)}"
    return f"{scale:g}"


def mfu_text(mfu: object) -> str:
    """MFU as a percentage: "42.0 %"; a small one keeps two digits ("0.34 %")."""
    if not measured(mfu):
        return NA
    return f"{mfu * 100:.1f} %" if mfu >= 0.01 else f"{mfu * 100:.2g} %"


def share_text(share: object, digits: int = 0) -> str:
    """A share as a percentage with `digits` decimals (sentences: 0, tables: 1), except that
    it never reads "100 %" or "0 %" when it is not exactly that: 0.99978 -> "99.98 %",
    0.0002 -> "0.02 %", 0.9999999 -> "> 99.9999 %". A verdict or a table that says
    100 % next to a listed fp32 matmul would be wrong."""
    if not measured(share):
        return NA
    if share >= 1.0 or share <= 0.0:
        return f"{share * 100:.{digits}f} %"
    for places in range(digits, max(digits, 4) + 1):
        text = f"{share * 100:.{places}f}"
        if float(text) not in (0.0, 100.0):
            return f"{text} %"
    if share > 0.5:
        return "> 99.9999 %"
    return "< 0.0001 %"
