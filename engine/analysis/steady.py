"""Per-run statistics for comparing runs: steady-state throughput and step time, loss and
its step-to-step noise, the statistics a finished run stores in its summary
(`compare_stats`, engine.run.finalize), smoothing and the metric frames the charts draw.

Every ratio comes from steady-state steps only (phase == "steady"): warm-up steps
include allocator growth and autotuning, profiler-window steps are slowed by the
profiler, and either would make a ratio lie.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from engine.schema import STEADY, WARMUP
from engine.store import RunRecord, Store

BASIS_STEADY = "steady"
BASIS_NON_WARMUP = "non-warmup"  # fallback when a run has no steady rows (flagged)
BASIS_NONE = "none"
LOSS_TAIL_ROWS = 20  # logged steps at the end of a run used to estimate loss noise

METRICS_FOR_COMPARE = ("step", "wall_time_s", "loss", "step_time_ms", "samples_per_s",
                       "tokens_per_s", "mem_peak_bytes", "rss_bytes", "mem_allocated_bytes",
                       "skipped_steps", "loss_scale", "mfu", "achieved_tflops", "phase")


# ---------------------------------------------------------------------------------------
# per-run statistics


def steady_stats(frame: pd.DataFrame) -> dict[str, Any]:
    """Median step time and throughputs over the steady-state rows of one run.

    Falls back to every non-warm-up row (profiler window included) when the run has no
    steady rows, e.g. a run stopped early; `basis` and `fallback` say which was used.
    """
    rows, basis = _steady_rows(frame)
    stats: dict[str, Any] = {"basis": basis, "fallback": basis != BASIS_STEADY,
                             "rows": int(len(rows))}
    for column in ("step_time_ms", "samples_per_s", "tokens_per_s", "mfu", "achieved_tflops"):
        values = (pd.to_numeric(rows[column], errors="coerce").dropna()
                  if column in rows else pd.Series(dtype=float))
        stats[column] = float(values.median()) if len(values) else None
    return stats


def _steady_rows(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    if frame.empty or "phase" not in frame:
        return frame.iloc[0:0], BASIS_NONE
    steady = frame[frame["phase"] == STEADY]
    if len(steady):
        return steady, BASIS_STEADY
    rest = frame[frame["phase"] != WARMUP]
    return rest, (BASIS_NON_WARMUP if len(rest) else BASIS_NONE)


def loss_stats(frame: pd.DataFrame, tail_rows: int = LOSS_TAIL_ROWS) -> dict[str, Any]:
    """Final logged loss and the step-to-step noise of the loss near the end.

    noise_pct estimates how far one logged value strays from its neighbours: the
    standard deviation of successive differences over the last `tail_rows` rows,
    divided by sqrt(2) (differences remove the slow downward trend), relative to the
    mean there. None with fewer than 3 finite values.
    """
    losses = _finite_losses(frame)
    final = float(losses.iloc[-1]) if len(losses) else None
    tail = losses.iloc[-tail_rows:]
    noise_pct = None
    if len(tail) >= 3 and tail.mean() != 0:
        noise = float(tail.diff().dropna().std(ddof=1)) / math.sqrt(2)
        noise_pct = 100.0 * noise / abs(float(tail.mean()))
    return {"final_loss": final, "loss_noise_pct": noise_pct}


def paired_loss_noise_pct(frame: pd.DataFrame, base_frame: pd.DataFrame,
                          tail_rows: int = LOSS_TAIL_ROWS) -> float | None:
    """Spread of the relative loss difference to the baseline, step by step, near the end.

    For runs that see the same batches (same model, seed and batch shape) the batch-to-
    batch noise is common to both and cancels in the difference; what is left is how
    much the difference itself wanders. None with fewer than 3 shared steps.
    """
    return paired_noise(_losses_by_step(frame), _losses_by_step(base_frame), tail_rows)


def _losses_by_step(frame: pd.DataFrame) -> pd.Series:
    losses = _finite_losses(frame)
    return losses.set_axis(frame.loc[losses.index, "step"]) if len(losses) else losses


def paired_noise(run: pd.Series, base: pd.Series, tail_rows: int = LOSS_TAIL_ROWS) -> float | None:
    shared = run.index.intersection(base.index)[-tail_rows:]
    if len(shared) < 3:
        return None
    relative = 100.0 * (run[shared] - base[shared]) / base[shared].abs()
    relative = relative[np.isfinite(relative.to_numpy(dtype=float))]
    return float(relative.std(ddof=1)) if len(relative) >= 3 else None


def _finite_losses(frame: pd.DataFrame) -> pd.Series:
    if "loss" not in frame:
        return pd.Series(dtype=float)
    losses = pd.to_numeric(frame["loss"], errors="coerce").astype(float)
    return losses[np.isfinite(losses.to_numpy(dtype=float))]


# What summary_table needs from a run's metric rows, small and JSON-safe. A finished
# run stores it in its summary at run end (engine.run.finalize), so comparing 20 long runs
# reads 20 summaries instead of millions of metric rows.
COMPARE_STATS_KEY = "compare_stats"
COMPARE_STATS_VERSION = 2  # 2: steady step-time sample for the throughput interval
STEP_SAMPLE_SIZE = 400  # steady step times kept per run (evenly spaced) for the interval


def frame_stats(frame: pd.DataFrame) -> dict[str, Any]:
    """Steady-state medians, final loss and noise, memory and skip maxima, loss tail."""
    tail = _losses_by_step(frame).iloc[-LOSS_TAIL_ROWS:]
    return {
        "version": COMPARE_STATS_VERSION,
        "steady": steady_stats(frame),
        "loss": loss_stats(frame),
        "mem_peak_max_bytes": _column_max(frame, "mem_peak_bytes"),
        "skipped_steps_max": _column_max(frame, "skipped_steps"),
        "loss_tail": [[int(step), float(loss)] for step, loss in tail.items()],
        "steady_step_ms": _steady_step_sample(frame),
    }


def _steady_step_sample(frame: pd.DataFrame) -> list[float]:
    """Up to STEP_SAMPLE_SIZE steady step times (ms), evenly spaced over the run."""
    rows, basis = _steady_rows(frame)
    if basis == BASIS_NONE or "step_time_ms" not in rows:
        return []
    values = pd.to_numeric(rows["step_time_ms"], errors="coerce").dropna().to_numpy(dtype=float)
    if len(values) > STEP_SAMPLE_SIZE:
        values = values[np.linspace(0, len(values) - 1, STEP_SAMPLE_SIZE).astype(int)]
    return [float(v) for v in values]


def run_stats(store: Store, run: RunRecord) -> dict[str, Any]:
    """The stored stats of a finished run, else computed from every metric row."""
    stored = run.summary.get(COMPARE_STATS_KEY)
    if (not run.is_active and isinstance(stored, dict)
            and stored.get("version") == COMPARE_STATS_VERSION):
        return stored
    return frame_stats(full_frame(store, run.id))


def full_frame(store: Store, run_id: str) -> pd.DataFrame:
    return store.read_metrics(run_id, max_points=None, columns=METRICS_FOR_COMPARE)


def _column_max(frame: pd.DataFrame, column: str) -> float | None:
    if column not in frame:
        return None
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    return float(values.max()) if len(values) else None


def tail_series(stats: Mapping[str, Any]) -> pd.Series:
    tail = stats.get("loss_tail") or []
    return pd.Series([loss for _step, loss in tail], index=[step for step, _loss in tail],
                     dtype=float)


def ema(series: Iterable[float] | pd.Series, alpha: float) -> pd.Series:
    """Exponential moving average with smoothing weight `alpha` in [0, 1).

    0 returns the values unchanged; 0.9 averages over roughly the last 10 points.
    Bias-corrected at the start (the first point is not pulled toward 0), and NaN
    positions stay NaN so gaps remain visible.
    """
    values = pd.Series(series, dtype=float).reset_index(drop=True)
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"alpha={alpha!r}: a smoothing weight in [0, 1), e.g. 0.6; 0 is off")
    if alpha == 0.0 or values.empty:
        return values.copy()
    smoothed = values.ewm(alpha=1.0 - alpha, adjust=True, ignore_na=True).mean()
    smoothed[values.isna()] = float("nan")
    return smoothed


# Points drawn per chart, split among the runs: 20 overlaid lines of 2000 points each
# show nothing 20 x 400 do not (a chart is ~1000 px wide), and cost 5x the render.
CHART_POINTS_BUDGET = 8000
CHART_POINTS_PER_RUN = (400, 2000)  # (fewest, most)


def chart_points_per_run(run_count: int) -> int:
    fewest, most = CHART_POINTS_PER_RUN
    return max(fewest, min(most, CHART_POINTS_BUDGET // max(1, run_count)))


def steady_medians(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """run id -> the summary table's steady-state samples/s and tokens/s (for charts)."""
    return {row["run_id"]: {"samples_per_s": row["samples_per_s"],
                            "tokens_per_s": row["tokens_per_s"]}
            for row in table.to_dict("records")}


# What the overlay charts draw (half of METRICS_FOR_COMPARE: half the read).
METRICS_FOR_CHARTS = ("step", "wall_time_s", "loss", "samples_per_s", "tokens_per_s",
                      "mem_peak_bytes", "phase")


def metrics_frames(store: Store, run_ids: Iterable[str],
                   max_points: int | None = 2000) -> dict[str, pd.DataFrame]:
    """Per run: the metric columns the comparison charts need (downsampled for plots)."""
    return {run_id: store.read_metrics(run_id, max_points=max_points,
                                       columns=METRICS_FOR_CHARTS) for run_id in run_ids}


