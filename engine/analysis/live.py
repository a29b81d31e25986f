"""The Live page's headline figures of one run, from its summary (a finished run) or its
logged rows so far (a running run): the page draws them and computes nothing.

Steady-state steps only (phase "steady": warm-up and the profiler window excluded);
before the first steady step, the latest three rows, so the tiles are never empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from engine.analysis.contention import BUSY_SHARE, UNRELIABLE
from engine.analysis.memory_peaks import is_gpu_device, memory_peaks, memory_words
from engine.display import PROCESS_PEAK_NAME, TENSOR_PEAK_NAME, loss_scale_text
from engine.schema import STEADY, throughput_column, throughput_unit


@dataclass(frozen=True)
class LiveHeadline:
    throughput: float | None       # steady median, in throughput_unit
    throughput_unit: str           # tokens/s | samples/s
    step_time_ms: float | None     # steady median
    peak_mem_bytes: float | None   # the tile's peak: peak_name says which of the two
    peak_name: str                 # TENSOR_PEAK_NAME on a GPU, PROCESS_PEAK_NAME on a CPU
    memory_words: str              # both peaks by name, the tensor peak's split (the caption)
    mfu: float | None              # fraction of the device's peak, None when unknown
    achieved_tflops: float | None


def steady_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The steady-state rows, or the latest three before there are any."""
    if not len(frame):
        return frame
    steady = frame[frame["phase"] == STEADY]
    return steady if len(steady) else frame.tail(3)


def steady_median(frame: pd.DataFrame, column: str) -> float | None:
    """Median of `column` over steady-state rows only; None when there are none."""
    if "phase" not in frame or column not in frame:
        return None
    values = frame.loc[frame["phase"] == STEADY, column].dropna()
    return float(values.median()) if len(values) else None


def _median(rows: pd.DataFrame, column: str) -> float | None:
    if not len(rows) or column not in rows or not rows[column].notna().any():
        return None
    return float(rows[column].median())


def live_headline(summary: dict[str, Any], model: str, frame: pd.DataFrame,
                  device_key: str | None = None) -> LiveHeadline:
    """The summary's figures where the run has ended, else medians of the rows so far.
    The memory tile's peak is the one the memory chart draws while the run goes on (a
    GPU's tensor peak, a CPU's process peak), so it never changes kind at the end."""
    rows = steady_rows(frame)
    column = throughput_column(model)
    logged = (float(frame["mem_peak_bytes"].max())
              if len(frame) and "mem_peak_bytes" in frame else None)
    peaks = memory_peaks(summary, device_key, logged)
    on_gpu = is_gpu_device(device_key)
    peak = peaks["tensor_peak_bytes"] if on_gpu else peaks["process_peak_bytes"]
    return LiveHeadline(
        throughput=summary.get(column) or _median(rows, column),
        throughput_unit=throughput_unit(model),
        step_time_ms=summary.get("step_time_ms") or _median(rows, "step_time_ms"),
        peak_mem_bytes=peak,
        peak_name=TENSOR_PEAK_NAME if on_gpu else PROCESS_PEAK_NAME,
        memory_words=memory_words(peaks, device_key),
        mfu=summary.get("mfu") or _median(rows, "mfu"),
        achieved_tflops=summary.get("achieved_tflops") or _median(rows, "achieved_tflops"))


def eta_s(frame: pd.DataFrame, steps_done: int, total_steps: int) -> float | None:
    """Seconds left at the steady median step time (all rows before steady ones exist)."""
    step_ms = steady_median(frame, "step_time_ms")
    if step_ms is None and len(frame):
        step_ms = _median(frame, "step_time_ms")
    return None if step_ms is None else (total_steps - steps_done) * step_ms / 1000.0


def data_wait_share(summary: dict[str, Any], frame: pd.DataFrame) -> float | None:
    """The share of the step the loop spent waiting for its next batch: the summary's
    (a finished run), else steady rows' data_wait_ms / step_time_ms so far. None for
    runs logged before the column existed."""
    if summary.get("data_wait_share") is not None:
        return float(summary["data_wait_share"])
    rows = steady_rows(frame)
    if not len(rows) or "data_wait_ms" not in rows or not rows["data_wait_ms"].notna().any():
        return None
    both = rows[["data_wait_ms", "step_time_ms"]].dropna()
    total_ms = float(both["step_time_ms"].sum())
    return float(both["data_wait_ms"].sum()) / total_ms if total_ms > 0 else None


def busy_words(summary: dict[str, Any], frame: pd.DataFrame) -> str | None:
    """The busy-machine warning for a run, or None: the stored verdict of an ended run,
    else the share of its steady steps logged so far while the machine was busy."""
    contention = summary.get("contention")
    if contention:
        return contention.get("words") if contention.get("busy") else None
    if "host_busy" not in frame or "phase" not in frame:
        return None
    marks = pd.to_numeric(
        frame.loc[frame["phase"] == STEADY, "host_busy"], errors="coerce"
    ).dropna()
    if not len(marks) or marks.mean() < BUSY_SHARE:
        return None
    return (f"measured while the machine was busy (other work competed for it during "
            f"{100 * marks.mean():.0f} % of the steady steps so far): {UNRELIABLE}")


def _origin_words(entry: dict[str, Any]) -> str:
    """The parameters whose gradients overflowed first ("1.weight"), else their layer."""
    if not entry["origin"]:
        return "(no layer: the loss itself)"
    return ", ".join(entry.get("origin_parameters") or []) or entry["origin"]


def ledger_rows(ledger: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The skipped-step ledger (engine.training.skip_ledger) as table rows: one per kept
    skip, with the layer where the overflow entered (nearest the loss)."""
    rows = []
    for entry in (ledger or {}).get("entries", []):
        largest = next((layer for layer in entry["layers"] if not layer["nonfinite"]
                        and layer["max_abs_grad_scaled"] is not None), None)
        rows.append({
            "step": "0 (FLOP count)" if entry["step"] == 0 else str(entry["step"]),
            "loss scale": f"{loss_scale_text(entry['scale_before'])} -> "
                          f"{loss_scale_text(entry['scale_after'])}"
            if entry["scale_after"] is not None else loss_scale_text(entry["scale_before"]),
            "overflow entered at": _origin_words(entry),
            "non-finite layers": f"{entry['nonfinite_layer_count']} of {entry['layer_count']}",
            "loss": "finite" if entry["loss_finite"] else "inf/NaN",
            "largest finite gradient (scaled)":
                f"{largest['max_abs_grad_scaled']:.3g} in {largest['layer']}" if largest else "n/a",
        })
    return rows


def ledger_sentence(ledger: dict[str, Any] | None, skipped_steps: int | None) -> str | None:
    """One line over the ledger: how many of the run's steps were skipped (the run's own
    figure), where the overflows entered."""
    entries = (ledger or {}).get("entries", [])
    if not entries:
        return None
    origins: dict[str, int] = {}
    for entry in entries:
        origin = _origin_words(entry) if entry["origin"] else "the loss itself"
        origins[origin] = origins.get(origin, 0) + 1
    where = ", ".join(f"{name} ({count}x)" for name, count in
                      sorted(origins.items(), key=lambda item: -item[1])[:3])
    before = " and the FLOP-count step before step 1" if entries[0]["step"] == 0 else ""
    kept = ("" if ledger["entries_kept"] == ledger["entries_total"] else
            f"; the first {ledger['entries_kept']} are recorded")
    return (f"The GradScaler skipped {skipped_steps or 0} step(s) of the run{before}{kept}: "
            "gradients overflowed fp16 and the scale was halved each time. Where the "
            f"overflow entered (the non-finite layer nearest the loss): {where}. A layer "
            "that keeps appearing here is the one to keep in fp32 or to rescale.")
