"""The runs' summary table (engine.analysis.compare.summary_table) as the strings a person
reads: one definition of the columns, their headers and their formats for Compare and the
HTML report, so both print the same figure the same way (engine.display's formatters).

Compare shows MAIN_COLUMNS at a laptop's width (1280 px) and the rest behind an expander;
the report prints every column.
"""

from __future__ import annotations

from typing import Any, Callable

import pandas as pd

from engine.analysis.drift import drift_cell
from engine.analysis.speedup import stored_verdict
from engine.display import (
    NA,
    PROCESS_PEAK_NAME,
    TENSOR_PEAK_NAME,
    interval_text,
    loss_text,
    measured,
    memory_text,
    memory_unit,
    mfu_text,
    ratio_text,
    share_text,
    step_time_text,
    throughput_text,
)


def _signed(digits: int) -> Callable[[Any], str]:
    return lambda v: f"{v:+.{digits}f}" if measured(v) else NA


def _count(value: Any) -> str:
    return str(int(value)) if measured(value) else NA


def _text(value: Any) -> str:
    return NA if value is None or (isinstance(value, float) and value != value) else str(value)


def machine_word(busy: Any) -> str:
    """Whether the run's timing can be trusted: the contention verdict in two words."""
    return "busy: unreliable" if busy is True else "quiet" if busy is False else "not measured"


# (key, header, formatter); a memory peak takes its unit from its column's largest value.
COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("name", "run", _text),
    ("run_id", "run id", _text),
    ("status", "status", _text),
    ("throughput_per_s", "throughput (/s)", throughput_text),
    ("throughput_unit", "unit", _text),
    ("throughput_x", "throughput x", ratio_text),
    ("throughput_interval", "95 % interval", _text),
    ("machine", "machine", _text),
    ("step_time_ms", "step time (ms)", lambda v: step_time_text(v, with_unit=False)),
    # the two peaks by name (engine.analysis.memory_peaks), each column in its own unit
    ("tensor_peak_bytes", TENSOR_PEAK_NAME, _text),
    ("process_peak_bytes", PROCESS_PEAK_NAME, _text),
    ("mem_saved_pct", "memory saved (%)", _signed(1)),
    ("mem_saved_basis", "memory saved on", _text),
    ("final_loss", "final loss", loss_text),
    ("final_loss_diff_pct", "loss diff (%)", _signed(2)),
    ("loss_tolerance_pct", "loss tolerance (±%)", lambda v: f"{v:.2g}" if measured(v) else NA),
    ("max_batch_fit", "max batch fit", _count),
    ("skipped_steps", "skipped steps", _count),
    ("tensor_core_share", "Tensor-Core share", lambda v: share_text(v, 1)),
    ("mfu", "MFU", mfu_text),
    ("steady_basis", "timing basis", _text),
]
# What a person needs to read the comparison at 1280 px: which run, how fast against the
# baseline and how sure, whether the machine was quiet, memory, loss, matrix units, MFU
# (step time is the inverse of throughput x: in the expander).
# Columns of words (names, verdicts), left-aligned where a table right-aligns figures.
TEXT_KEYS = frozenset({"name", "run_id", "status", "throughput_unit", "throughput_interval",
                       "machine", "steady_basis", "mem_saved_basis"})
MEMORY_KEYS = ("tensor_peak_bytes", "process_peak_bytes")
MAIN_COLUMNS = ["name", "throughput_x", "throughput_interval", "machine", "tensor_peak_bytes",
                "final_loss", "final_loss_diff_pct", "tensor_core_share", "mfu"]
NOTE = ("n/a: not measured for that run (Tensor-Core share needs a GPU kernel breakdown; "
        "max batch fit needs a batch-size search).")


def _with_derived(table: pd.DataFrame) -> pd.DataFrame:
    return table.assign(
        throughput_interval=[interval_text(low, high) for low, high in
                             zip(table["throughput_x_low"], table["throughput_x_high"])],
        machine=[machine_word(busy) for busy in table["busy"]])


def summary_strings(table: pd.DataFrame, keys: list[str] | None = None) -> pd.DataFrame:
    """`table`'s rows as strings, headers as a person reads them, in COLUMNS order (or
    `keys`' order). Each memory peak's column has one unit, named in its header (each its
    own: a tensor peak of a few MiB beside a process peak over 1 GiB must not read 0.00)."""
    keys = keys or [key for key, _h, _f in COLUMNS]
    spec = {key: (header, fmt) for key, header, fmt in COLUMNS}
    derived = _with_derived(table)
    out = {}
    for key in keys:
        header, fmt = spec[key]
        if key in MEMORY_KEYS:
            unit = memory_unit(derived[key])
            out[f"{header} ({unit})"] = [memory_text(v, unit, with_unit=False)
                                         for v in derived[key]]
        else:
            out[header] = [fmt(v) for v in derived[key]]
    return pd.DataFrame(out, index=table.index)


def speedup_rows(result: dict[str, Any]) -> pd.DataFrame:
    """A paired speedup check's modes as strings (Live, the report): step time, throughput,
    speedup and its interval, peak memory in one unit for the column, loss drift, verdict."""
    baseline = result.get("baseline")
    modes = result.get("modes", [])
    unit = memory_unit(row.get("peak_mem_bytes") for row in modes)
    rows = []  # a check's peak per mode is its tensor peak (engine.training.speedup)
    for row in modes:
        _verdict, verdict = stored_verdict(row, result)  # one rule: busy -> inconclusive
        is_base = row["mode"] == baseline
        rows.append(
            {
                "mode": row["mode"],
                "median step (ms)": step_time_text(row.get("median_step_ms"), with_unit=False),
                "throughput (samples/s)": throughput_text(row.get("samples_per_s")),
                "speedup": ratio_text(row.get("speedup")),
                "95 % interval": ""
                if is_base
                else interval_text(row.get("ci_low"), row.get("ci_high")),
                f"{TENSOR_PEAK_NAME} ({unit})": memory_text(
                    row.get("peak_mem_bytes"), unit, with_unit=False
                ),
                "blocks": _count(row.get("blocks")),
                "loss vs baseline": "" if is_base else drift_cell(row.get("drift"), "drift" in row),
                "verdict": verdict,
            }
        )
    return pd.DataFrame(rows)
