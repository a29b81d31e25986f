"""Comparing runs: steady-state statistics, the summary table against a baseline, the
config diff, plain-language findings and the default selection. Pure: no streamlit.

Every ratio comes from steady-state steps only (phase == "steady"): warm-up steps
include allocator growth and autotuning, profiler-window steps are slowed by the
profiler, and either would make a ratio lie.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from engine.analysis.numerics import numerics_findings
from engine.analysis.speedup import CONFIDENCE
from engine.analysis.traces import share_text
from engine.config import Precision, RunConfig
from engine.schema import FINISHED, STEADY, WARMUP, throughput_column, throughput_unit
from engine.store import RunNotFound, RunRecord, Store

BASIS_STEADY = "steady"
BASIS_NON_WARMUP = "non-warmup"  # fallback when a run has no steady rows (flagged)
BASIS_NONE = "none"

# Below these differences the findings say "about the same": a busy machine moves step
# times by a few per cent from run to run, and a process's peak RSS by a little.
SPEED_TOLERANCE = 0.05  # |throughput_x - 1| <= 5 %
MEMORY_TOLERANCE_PCT = 2.0
# The smallest relative loss difference ever called real. Above it, a difference must
# also exceed the runs' own step-to-step loss noise (see `loss_stats`).
LOSS_NOISE_FLOOR_PCT = 0.1
LOSS_TAIL_ROWS = 20  # logged steps at the end of a run used to estimate loss noise
LOSS_NOISE_SIGMAS = 2.0  # a loss difference is called real beyond 2 standard deviations
# Fields that decide which batches a run sees: equal -> the runs' losses pair step by step.
DATA_STREAM_FIELDS = ("model", "size", "seed", "batch_size", "seq_len", "image_size")

METRICS_FOR_COMPARE = ("step", "wall_time_s", "loss", "step_time_ms", "samples_per_s",
                       "tokens_per_s", "mem_peak_bytes", "rss_bytes", "mem_allocated_bytes",
                       "skipped_steps", "loss_scale", "mfu", "achieved_tflops", "phase")
# Config fields that change the work a step does: when they differ, throughput and
# memory ratios compare different workloads, and the findings say so first.
# nprocs multiplies the global batch; sharding and comm_hook are choices to compare.
WORKLOAD_FIELDS = ("model", "size", "batch_size", "seq_len", "image_size", "device",
                   "channels_last", "compile", "nprocs")
TRAINING_FIELDS = ("steps", "lr", "optimizer", "weight_decay", "seed", "warmup_steps")


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
    return _paired_noise(_losses_by_step(frame), _losses_by_step(base_frame), tail_rows)


def _losses_by_step(frame: pd.DataFrame) -> pd.Series:
    losses = _finite_losses(frame)
    return losses.set_axis(frame.loc[losses.index, "step"]) if len(losses) else losses


def _paired_noise(run: pd.Series, base: pd.Series, tail_rows: int = LOSS_TAIL_ROWS) -> float | None:
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
    return frame_stats(_full_frame(store, run.id))


def _full_frame(store: Store, run_id: str) -> pd.DataFrame:
    return store.read_metrics(run_id, max_points=None, columns=METRICS_FOR_COMPARE)


def _column_max(frame: pd.DataFrame, column: str) -> float | None:
    if column not in frame:
        return None
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    return float(values.max()) if len(values) else None


def _tail_series(stats: Mapping[str, Any]) -> pd.Series:
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


# ---------------------------------------------------------------------------------------
# names and baseline


def variant_name(cfg: RunConfig) -> str:
    """The precision as a person would say it; fp16-amp without its scaler is named so,
    and a multi-process run adds how it shards and communicates its gradients."""
    name = cfg.precision
    if cfg.precision == Precision.FP16_AMP.value and not cfg.loss_scaling:
        name = "fp16-amp without loss scaling"
    if cfg.nprocs > 1:
        comm = "" if cfg.comm_hook == "none" else f", {cfg.comm_hook} gradients"
        name += f" ({cfg.nprocs}x {cfg.sharding}{comm})"
    return name


def display_names(runs: Iterable[RunRecord]) -> dict[str, str]:
    """Short unique names: the precision where that tells runs apart, else the label,
    else the label plus the end of the run id."""
    runs = list(runs)
    for naming in (lambda r: variant_name(r.config), lambda r: r.config.label,
                   lambda r: f"{r.config.label} ({r.id[-6:]})", lambda r: r.id):
        names = {r.id: naming(r) for r in runs}
        if len(set(names.values())) == len(names):
            return names
    return {r.id: r.id for r in runs}


def default_baseline(runs: Iterable[RunRecord]) -> str | None:
    """The first fp32 run, else the first run."""
    runs = list(runs)
    for run in runs:
        if run.config.precision == Precision.FP32.value:
            return run.id
    return runs[0].id if runs else None


# ---------------------------------------------------------------------------------------
# the summary table


def summary_table(store: Store, run_ids: Iterable[str],
                  baseline_id: str | None = None) -> pd.DataFrame:
    """One row per run, in the given order, with ratios against `baseline_id`.

    Columns (units in the names; fractions are 0..1):
      run_id, name, precision, status, reason, device, is_baseline,
      steady_basis, steady_rows, throughput_per_s, throughput_unit, samples_per_s,
      tokens_per_s, throughput_x (vs baseline, >1 = faster), step_time_ms,
      peak_mem_bytes, mem_saved_pct (vs baseline, >0 = less memory), final_loss,
      final_loss_diff_pct (vs baseline, >0 = higher), loss_noise_pct (the run's own
      step-to-step noise), loss_tolerance_pct (|diff| up to this is "within noise"),
      loss_noise_basis ("paired" | "step-to-step"), max_batch_fit,
      oom_batch_size, skipped_steps, loss_scale_final, tensor_core_share,
      matrix_tensor_core_share, mfu, achieved_tflops, cpu_verdict.
    Unknown values are None (e.g. Tensor-Core share on a CPU run).
    """
    run_ids = list(dict.fromkeys(run_ids))
    runs = [store.get_run(run_id) for run_id in run_ids]  # RunNotFound names the id
    if not runs:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    baseline_id = baseline_id or default_baseline(runs)
    if baseline_id not in run_ids:
        raise ValueError(f"baseline_id={baseline_id!r}: not among the selected runs; "
                         f"choose one of {', '.join(run_ids)}")
    names = display_names(runs)
    stats = {run.id: run_stats(store, run) for run in runs}  # ratios from every row
    rows = [_run_row(run, names[run.id], stats[run.id]) for run in runs]
    index = run_ids.index(baseline_id)
    base, base_run = rows[index], runs[index]
    for row, run in zip(rows, runs):
        row["is_baseline"] = row["run_id"] == baseline_id
        _add_ratios(row, base)
        _add_interval(row, base, stats[run.id], stats[base_run.id])
        row.update(_loss_tolerance(row, base, run, base_run, stats, store))
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    # Missing numbers are None everywhere (pandas would make NaN of some of them).
    return table.astype(object).where(table.notna(), None)


TABLE_COLUMNS = [
    "run_id", "name", "precision", "status", "reason", "device", "is_baseline",
    "steady_basis", "steady_rows", "throughput_per_s", "throughput_unit", "samples_per_s",
    "tokens_per_s", "throughput_x", "step_time_ms", "peak_mem_bytes", "mem_saved_pct",
    "final_loss", "final_loss_diff_pct", "loss_noise_pct", "loss_tolerance_pct",
    "loss_noise_basis", "max_batch_fit", "oom_batch_size",
    "skipped_steps", "loss_scale_final", "tensor_core_share", "matrix_tensor_core_share",
    "mfu", "achieved_tflops", "cpu_verdict",
    "throughput_x_low", "throughput_x_high", "throughput_significant", "busy",
    "contention_words",
]


def _run_row(run: RunRecord, name: str, run_stats: Mapping[str, Any]) -> dict[str, Any]:
    summary = run.summary
    stats = run_stats["steady"]
    losses = run_stats["loss"]
    kernels = summary.get("kernels") or {}
    throughput = stats[throughput_column(run.config.model)]
    final_loss = _finite(summary.get("final_loss"))
    if final_loss is None:
        final_loss = losses["final_loss"]
    return {
        "run_id": run.id, "name": name, "precision": run.config.precision,
        "status": run.status, "reason": run.reason, "device": run.device_key,
        "steady_basis": stats["basis"], "steady_rows": stats["rows"],
        "throughput_per_s": throughput,
        "throughput_unit": throughput_unit(run.config.model),
        "samples_per_s": stats["samples_per_s"], "tokens_per_s": stats["tokens_per_s"],
        "step_time_ms": stats["step_time_ms"],
        "peak_mem_bytes": _peak_mem(summary, run_stats),
        "final_loss": final_loss, "loss_noise_pct": losses["loss_noise_pct"],
        "max_batch_fit": _int_or_none(summary.get("max_batch_fit")),
        "oom_batch_size": _int_or_none(summary.get("oom_batch_size")),
        "skipped_steps": _skipped_steps(run, run_stats),
        "loss_scale_final": (_finite(summary.get("loss_scale_final"))
                             if run.config.uses_grad_scaler else None),
        "tensor_core_share": _finite(kernels.get("tensor_core_share")),
        "matrix_tensor_core_share": _finite(kernels.get("matrix_tensor_core_share")),
        "mfu": stats["mfu"] if stats["mfu"] is not None else _finite(summary.get("mfu")),
        "achieved_tflops": stats["achieved_tflops"] or _finite(summary.get("achieved_tflops")),
        "cpu_verdict": (summary.get("cpu_evidence") or {}).get("verdict"),
        "busy": (summary.get("contention") or {}).get("busy"),
        "contention_words": (summary.get("contention") or {}).get("words"),
    }


def _add_ratios(row: dict[str, Any], base: dict[str, Any]) -> None:
    # Compare tokens/s only when both runs have them (gpt vs gpt), else samples/s.
    column = "tokens_per_s" if row["tokens_per_s"] and base["tokens_per_s"] else "samples_per_s"
    row["throughput_x"] = _ratio(row[column], base[column])
    saved = _ratio(row["peak_mem_bytes"], base["peak_mem_bytes"])
    row["mem_saved_pct"] = None if saved is None else 100.0 * (1.0 - saved)
    if row["final_loss"] is not None and base["final_loss"]:
        row["final_loss_diff_pct"] = (100.0 * (row["final_loss"] - base["final_loss"])
                                      / abs(base["final_loss"]))
    else:
        row["final_loss_diff_pct"] = None


UNPAIRED_RESAMPLES = 2000
UNPAIRED_MIN_STEPS = 5  # steady steps per run below which no interval is given
BOOTSTRAP_SEED = 20261201  # fixed: the same runs give the same interval on every surface


def unpaired_ratio_interval(base_ms: Iterable[float], mode_ms: Iterable[float]
                            ) -> tuple[float, float] | None:
    """95 % bootstrap interval of median(base) / median(mode) for two separate runs (each
    run's steady step times resampled on its own, fixed seed). It covers the runs' own
    step-to-step spread, not the machine's drift between the two runs: that takes the
    paired speedup check. None with fewer than UNPAIRED_MIN_STEPS values in either run."""
    base = np.asarray([v for v in base_ms if v and v > 0], dtype=float)
    mode = np.asarray([v for v in mode_ms if v and v > 0], dtype=float)
    if len(base) < UNPAIRED_MIN_STEPS or len(mode) < UNPAIRED_MIN_STEPS:
        return None
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    base_medians = np.median(base[rng.integers(0, len(base), (UNPAIRED_RESAMPLES, len(base)))], axis=1)
    mode_medians = np.median(mode[rng.integers(0, len(mode), (UNPAIRED_RESAMPLES, len(mode)))], axis=1)
    alpha = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(base_medians / mode_medians, [alpha, 100.0 - alpha])
    return float(low), float(high)


def _add_interval(row: dict[str, Any], base: dict[str, Any], stats: Mapping[str, Any],
                  base_stats: Mapping[str, Any]) -> None:
    """throughput_x's 95 % interval from both runs' steady step times, and whether it
    excludes 1.0 (only then is a difference stated)."""
    row.update(throughput_x_low=None, throughput_x_high=None, throughput_significant=False)
    x = row["throughput_x"]
    if row["is_baseline"] or x is None or not row["step_time_ms"] or not base["step_time_ms"]:
        return
    interval = unpaired_ratio_interval(base_stats.get("steady_step_ms") or [],
                                       stats.get("steady_step_ms") or [])
    if interval is None:
        return
    # The interval is of the step-time ratio; scaled to throughput (a batch that differs
    # between the runs changes work per step, not the relative spread).
    scale = x / (base["step_time_ms"] / row["step_time_ms"])
    low, high = interval[0] * scale, interval[1] * scale
    row.update(throughput_x_low=low, throughput_x_high=high,
               throughput_significant=low > 1.0 or high < 1.0)


def _loss_tolerance(row: dict[str, Any], base: dict[str, Any], run: RunRecord,
                    base_run: RunRecord, stats: Mapping[str, Mapping[str, Any]],
                    store: Store) -> dict[str, Any]:
    """How large a final-loss difference to the baseline must be to be called real.

    Runs that see the same batches pair step by step (`paired_loss_noise_pct`); other
    runs fall back to both runs' step-to-step noise (two independent values: sqrt(2)).
    """
    if row["is_baseline"]:
        return {"loss_tolerance_pct": None, "loss_noise_basis": None}
    noise, basis = None, None
    if all(getattr(run.config, f) == getattr(base_run.config, f) for f in DATA_STREAM_FIELDS):
        noise = _paired_noise_of(run, base_run, stats, store)
        basis = "paired" if noise is not None else None
    if noise is None:
        own = [n for n in (row["loss_noise_pct"], base["loss_noise_pct"]) if n is not None]
        noise = max(own) * math.sqrt(2) if own else None
        basis = "step-to-step" if own else None
    tolerance = max(LOSS_NOISE_SIGMAS * noise, LOSS_NOISE_FLOOR_PCT) if noise is not None \
        else LOSS_NOISE_FLOOR_PCT
    return {"loss_tolerance_pct": tolerance, "loss_noise_basis": basis}


def _paired_noise_of(run: RunRecord, base_run: RunRecord,
                     stats: Mapping[str, Mapping[str, Any]], store: Store) -> float | None:
    """Paired noise from the stored loss tails when both end on the same steps (then the
    tails are exactly the last shared steps), else from every row of both runs."""
    run_tail, base_tail = _tail_series(stats[run.id]), _tail_series(stats[base_run.id])
    if len(run_tail) == LOSS_TAIL_ROWS and run_tail.index.equals(base_tail.index):
        return _paired_noise(run_tail, base_tail)
    return paired_loss_noise_pct(_full_frame(store, run.id), _full_frame(store, base_run.id))


def _peak_mem(summary: dict[str, Any], run_stats: Mapping[str, Any]) -> int | None:
    value = _finite(summary.get("peak_mem_bytes"))
    if value is None:
        value = _finite(run_stats.get("mem_peak_max_bytes"))
    return None if value is None else int(value)


def _skipped_steps(run: RunRecord, run_stats: Mapping[str, Any]) -> int:
    value = run.summary.get("skipped_steps")
    if value is None:
        value = run_stats.get("skipped_steps_max")
    return int(value or 0)


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or not base:
        return None
    return float(value) / float(base)


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def _int_or_none(value: Any) -> int | None:
    number = _finite(value)
    return None if number is None else int(number)


# ---------------------------------------------------------------------------------------
# config diff


def config_diff(configs: Mapping[str, RunConfig]) -> pd.DataFrame:
    """Only the RunConfig fields whose values differ between the runs.

    One row per differing field (column "field"), one column per run id; values are
    shown as text because a column holds fields of different types.
    """
    run_ids = list(configs)
    rows = []
    for fld in dataclasses.fields(RunConfig):
        values = [getattr(configs[run_id], fld.name) for run_id in run_ids]
        if len(set(map(repr, values))) > 1:
            rows.append({"field": fld.name, **{run_id: _as_text(value)
                                               for run_id, value in zip(run_ids, values)}})
    return pd.DataFrame(rows, columns=["field", *run_ids])


def _as_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# ---------------------------------------------------------------------------------------
# findings


def findings(table: pd.DataFrame, runs: Mapping[str, RunRecord] | Iterable[RunRecord],
             run_dir=None) -> list[str]:
    """Plain-language statements, each backed by a number in `table`.

    Nothing is claimed that the table does not show: slower runs are called slower,
    Tensor Cores are mentioned only where a kernel breakdown measured them, and a loss
    difference is called real only beyond the runs' own step-to-step noise.
    """
    if table.empty:
        return []
    runs = dict(runs) if isinstance(runs, Mapping) else {r.id: r for r in runs}
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in table.to_dict("records")]
    base = next((r for r in rows if r["is_baseline"]), rows[0])
    underflow = numerics_findings([runs[r["run_id"]] for r in rows if r["run_id"] in runs],
                                  run_dir) if run_dir is not None else []
    if underflow and all(runs[r["run_id"]].config.numerics for r in rows if r["run_id"] in runs):
        # The numerics demo: its point is underflow with and without the loss scale. Its
        # runs do the same matmuls at sampled, deliberately slowed steps: no speed claims.
        return underflow + ["Speed is not compared here: these runs sample gradient "
                            "numerics, and their point is underflow. For what a precision "
                            "buys in speed, run a Speedup check (Launch page)."]
    statements = _comparability_notes(rows, runs)
    statements.append(_baseline_sentence(base, runs.get(base["run_id"])))
    for row in rows:
        if row["run_id"] != base["run_id"]:
            statements.append(_run_sentence(row, base, runs.get(row["run_id"])))
    statements += _closing_notes(rows, runs) + underflow
    return [s for s in statements if s]


def _comparability_notes(rows: list[dict[str, Any]], runs: Mapping[str, RunRecord]) -> list[str]:
    configs = {r["run_id"]: runs[r["run_id"]].config for r in rows if r["run_id"] in runs}
    if len(configs) < 2:
        return []
    diff = config_diff(configs)
    notes = []
    differing = [f for f in WORKLOAD_FIELDS if f in set(diff["field"])]
    if differing:
        detail = ", ".join(f"{f} ({', '.join(dict.fromkeys(diff.loc[diff['field'] == f].iloc[0, 1:]))})"
                           for f in differing)
        notes.append(f"Caution: the runs differ in {detail}, so throughput and memory "
                     "compare different work, not only precisions.")
    training = [f for f in TRAINING_FIELDS if f in set(diff["field"])]
    if training:
        notes.append(f"The runs differ in {', '.join(training)}: their final losses compare "
                     "different training, not only precisions.")
    return notes


def _baseline_sentence(base: dict[str, Any], run: RunRecord | None) -> str:
    parts = []
    if base["throughput_per_s"] is not None:
        parts.append(f"{base['throughput_per_s']:,.1f} {base['throughput_unit']}")
    if base["step_time_ms"] is not None:
        parts.append(f"{base['step_time_ms']:,.1f} ms per step")
    if base["peak_mem_bytes"] is not None:
        parts.append(f"peak memory {_fmt_bytes(base['peak_mem_bytes'])}")
    if base["final_loss"] is not None:
        parts.append(f"final loss {base['final_loss']:.4g}")
    if base["skipped_steps"]:
        parts.append(_skipped_text(base))
    text = f"Baseline {base['name']}: " + (", ".join(parts) if parts else "no steady-state numbers")
    return text + _status_suffix(base) + _basis_suffix(base) + "."


def _run_sentence(row: dict[str, Any], base: dict[str, Any], run: RunRecord | None) -> str:
    parts = [_speed_text(row, base), _memory_text(row, base), _loss_text(row, base)]
    if row["skipped_steps"]:
        parts.append(_skipped_text(row))
    if row["max_batch_fit"] and base["max_batch_fit"]:
        parts.append(f"largest batch that fitted {row['max_batch_fit']} "
                     f"(vs {base['max_batch_fit']})")
    if row["tensor_core_share"] is not None:  # only where a kernel breakdown measured it
        parts.append(f"{share_text(row['tensor_core_share'])} of GPU kernel time on Tensor Cores")
    if row["mfu"] is not None:
        parts.append(f"MFU {mfu_text(row['mfu'])}")
    text = f"{row['name']}: " + ", ".join(p for p in parts if p)
    text += _status_suffix(row) + _basis_suffix(row) + "."
    return text + _why_slower(row, run)


def peak_words(summary: Mapping[str, Any]) -> str:
    """What a run's MFU is relative to, in words every surface shows: the datasheet row or
    the measured peak with when and under what load (engine.hardware.peaks)."""
    label = summary.get("peak_label")
    if label:
        return label
    source = summary.get("peak_source")
    return f"{source} peak for this precision" if source else "peak: not known"


def mfu_text(mfu: float) -> str:
    """MFU as every surface writes it: "42.0 %"; a small one keeps two digits ("0.34 %")."""
    return f"{mfu * 100:.1f} %" if mfu >= 0.01 else f"{mfu * 100:.2g} %"


def _speed_text(row: dict[str, Any], base: dict[str, Any]) -> str:
    """A speedup is stated only when its interval excludes 1.0 and neither run was
    measured on a busy machine; otherwise the sentence says why it is not."""
    x = row["throughput_x"]
    if x is None:
        return "no steady-state throughput to compare"
    busy = next((r for r in (row, base) if r.get("busy")), None)
    if busy is not None:
        return (f"throughput {x:.2f}x {base['name']}'s, not a speedup figure: "
                f"{busy['name']} was {busy['contention_words']}")
    low, high = row.get("throughput_x_low"), row.get("throughput_x_high")
    if low is None or high is None:
        return (f"throughput {x:.2f}x {base['name']}'s (too few steady steps for an "
                "interval: no speedup is stated)")
    interval = f"95 % interval {low:.2f}-{high:.2f}x"
    if not row.get("throughput_significant"):
        return f"no measurable difference in speed from {base['name']} ({low:.2f}-{high:.2f}x)"
    if x > 1.0:
        return f"{_fmt_x(x)} faster than {base['name']} ({interval})"
    return f"{_fmt_x(1.0 / x)} slower than {base['name']} ({x:.2f}x its throughput; {interval})"


def _memory_text(row: dict[str, Any], base: dict[str, Any]) -> str:
    saved = row["mem_saved_pct"]
    if saved is None:
        return ""
    if abs(saved) < MEMORY_TOLERANCE_PCT:
        return f"about the same peak memory ({_fmt_pct(-saved, signed=True)} %)"
    if saved > 0:
        return f"{saved:.0f} % less memory"
    return f"{-saved:.0f} % more memory"


def _loss_text(row: dict[str, Any], base: dict[str, Any]) -> str:
    diff = row["final_loss_diff_pct"]
    if diff is None:
        return "no final loss to compare"
    tolerance = row["loss_tolerance_pct"] or LOSS_NOISE_FLOOR_PCT
    if tolerance <= LOSS_NOISE_FLOOR_PCT:
        noise = f"±{_fmt_pct(tolerance)} % minimum tolerance; the measured noise is smaller"
    else:
        noise = f"±{_fmt_pct(tolerance)} % {_NOISE_WORDS.get(row['loss_noise_basis'], 'tolerance')}"
    if abs(diff) <= tolerance:
        return f"final loss within noise ({_fmt_pct(diff, signed=True)} %; {noise})"
    direction = "higher (worse)" if diff > 0 else "lower (better)"
    return (f"final loss {_fmt_pct(abs(diff))} % {direction} than {base['name']}, beyond the "
            f"{noise}")


_NOISE_WORDS = {"paired": "paired step-to-step noise, 2 sigma",
                "step-to-step": "step-to-step noise, 2 sigma"}


def _fmt_pct(value: float, signed: bool = False) -> str:
    """Two significant digits (0.0038, 0.31, 4.2, 12), optionally with a sign."""
    text = f"{abs(value):.2g}" if abs(value) < 10 else f"{abs(value):.0f}"
    if "e" in text:
        text = f"{abs(value):.1e}"
    sign = ("+" if value >= 0 else "-") if signed else ("-" if value < 0 else "")
    return sign + text


def _skipped_text(row: dict[str, Any]) -> str:
    count = row["skipped_steps"]
    text = f"skipped {count} step{'s' if count != 1 else ''} to overflow (inf/NaN gradients)"
    if row["loss_scale_final"] is not None:
        text += f"; final loss scale {row['loss_scale_final']:g}"
    return text


def _status_suffix(row: dict[str, Any]) -> str:
    if row["status"] == FINISHED:
        return ""
    reason = f": {row['reason']}" if row.get("reason") else ""
    return f" (run {row['status']}{reason})"


def _basis_suffix(row: dict[str, Any]) -> str:
    if row["steady_basis"] == BASIS_NON_WARMUP:
        return " (timing from non-warm-up steps: the run recorded no steady-state steps)"
    return ""


def _why_slower(row: dict[str, Any], run: RunRecord | None) -> str:
    """Explain a slowdown only with recorded evidence (the CPU's oneDNN verdict)."""
    x = row["throughput_x"]
    if x is None or x > 1.0 - SPEED_TOLERANCE or run is None:
        return ""
    evidence = run.summary.get("cpu_evidence") or {}
    verdict, headline = evidence.get("verdict"), evidence.get("headline")
    if not headline:
        # "cpu@10.0.0.5": a sweep run a Ray cluster placed on that node's CPU
        on_cpu = run.device_key.split("@")[0] == "cpu"
        if on_cpu and run.config.precision != Precision.FP32.value:
            return (" No CPU evidence was recorded for this run (it was not profiled), so the "
                    "cause is not shown here.")
        return ""
    if verdict and "emulated" in verdict:
        return f" Why, from the CPU evidence of its profiler window: {headline}."
    return f" CPU evidence for this run: {headline}."


def _closing_notes(rows: list[dict[str, Any]], runs: Mapping[str, RunRecord]) -> list[str]:
    notes = []
    timed = [r for r in rows if r["throughput_x"] is not None]
    trusted = [r for r in timed if not r.get("busy")]  # a busy run ranks nothing
    if len(timed) >= 3 and len(trusted) < len(timed):
        notes.append("No fastest run is named: some of these runs were measured while the "
                     "machine was busy.")
    elif len(timed) >= 3:
        fastest = max(timed, key=lambda r: r["throughput_x"])
        notes.append(f"Fastest: {fastest['name']}" + (
            " (the baseline)." if fastest["is_baseline"]
            else f" ({fastest['throughput_x']:.2f}x the baseline's throughput)."))
    if any(r["device"] == "cpu" for r in rows):
        notes.append("Memory of CPU runs is the peak resident set size of the whole training "
                     "process (PyTorch itself included), so precision changes move it less "
                     "than they move the tensors.")
    if rows and all(r["tensor_core_share"] is None for r in rows) and any(
            r["device"].startswith("cuda") for r in rows):
        notes.append("Tensor-Core use is unknown for these runs (no kernel breakdown recorded).")
    return notes


def _fmt_x(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.1f}x" if x >= 1.995 else f"{x:.2f}x"


def _fmt_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:,.0f} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GiB"


# ---------------------------------------------------------------------------------------
# default selection


def default_selection(store: Store, preset_ids: Iterable[str] | None = None) -> list[str]:
    """What the Compare page shows first.

    The latest comparison preset when its runs still exist; otherwise the newest group
    of finished runs that share model, size, batch size and device but differ in
    precision (newest run per precision variant, oldest first); otherwise the newest
    finished run; otherwise nothing.
    """
    if preset_ids:
        existing = [run_id for run_id in dict.fromkeys(preset_ids) if _exists(store, run_id)]
        if existing:
            return existing
    finished = store.list_runs(statuses=[FINISHED])  # newest first
    for newest in finished:
        key = _group_key(newest)
        variants: dict[tuple, RunRecord] = {}
        for run in finished:
            if _group_key(run) == key:
                variants.setdefault(_variant_key(run), run)  # newest per variant wins
        if len(variants) >= 2:
            return [r.id for r in sorted(variants.values(), key=lambda r: r.created_at)]
    return [finished[0].id] if finished else []


def _group_key(run: RunRecord) -> tuple:
    cfg = run.config
    return (cfg.model, cfg.size, cfg.batch_size, cfg.nprocs, run.device_key)


def _variant_key(run: RunRecord) -> tuple:
    cfg = run.config
    return (cfg.precision, cfg.uses_grad_scaler, cfg.sharding, cfg.comm_hook)


def _exists(store: Store, run_id: str) -> bool:
    try:
        store.get_run(run_id)
        return True
    except (RunNotFound, ValueError):
        return False
