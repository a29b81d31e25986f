"""Comparing runs: the summary table against a baseline (ratios, the unpaired throughput
interval, loss tolerance), display names, the config diff and the default selection.
The per-run statistics are engine.analysis.steady; the sentences engine.analysis.findings.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from engine.analysis.memory_peaks import memory_peaks
from engine.analysis.speedup import CONFIDENCE
from engine.analysis.steady import (
    LOSS_TAIL_ROWS,
    full_frame,
    paired_loss_noise_pct,
    paired_noise,
    run_stats,
    tail_series,
)
from engine.config import Precision, RunConfig
from engine.display import PROCESS_PEAK_NAME, TENSOR_PEAK_NAME
from engine.schema import FINISHED, throughput_column, throughput_unit
from engine.store import RunNotFound, RunRecord, Store

# The smallest relative loss difference ever called real. Above it, a difference must
# also exceed the runs' own step-to-step loss noise (see `steady.loss_stats`).
LOSS_NOISE_FLOOR_PCT = 0.1
LOSS_NOISE_SIGMAS = 2.0  # a loss difference is called real beyond 2 standard deviations
# Fields that decide which batches a run sees: equal -> the runs' losses pair step by step.
DATA_STREAM_FIELDS = ("model", "size", "seed", "batch_size", "seq_len", "image_size")


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
      peak_mem_bytes (the memory chart's peak), tensor_peak_bytes, process_peak_bytes,
      memory_by_kind, tensor_peak_note (engine.analysis.memory_peaks), mem_saved_pct
      (vs baseline, >0 = less memory; on mem_saved_basis: the tensor peaks where both
      have one, else the process peaks), final_loss,
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
    "tokens_per_s", "throughput_x", "step_time_ms", "peak_mem_bytes", "tensor_peak_bytes",
    "process_peak_bytes", "memory_by_kind", "tensor_peak_note", "mem_saved_pct",
    "mem_saved_basis",
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
        **memory_peaks(summary, run.device_key, run_stats.get("mem_peak_max_bytes")),
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
    # Memory saved: the tensor peaks where both runs have one (what a precision changes),
    # else the process peaks; the basis is named, never mixed within a pair.
    row["mem_saved_basis"] = None
    saved = None
    for key, basis in (("tensor_peak_bytes", TENSOR_PEAK_NAME),
                       ("process_peak_bytes", PROCESS_PEAK_NAME)):
        saved = _ratio(row[key], base[key])
        if saved is not None:
            row["mem_saved_basis"] = basis
            break
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
    key = (base.tobytes(), mode.tobytes())
    with _INTERVALS_LOCK:
        if key in _INTERVALS:
            _INTERVALS.move_to_end(key)
            return _INTERVALS[key]
    interval = _bootstrap_interval(base, mode)
    with _INTERVALS_LOCK:
        _INTERVALS[key] = interval
        while len(_INTERVALS) > _INTERVALS_KEPT:
            _INTERVALS.popitem(last=False)
    return interval


# The same two runs give the same interval (fixed seed), and Compare asks for it on every
# visit: 2000 resamples of 1000 steps cost ~50 ms a pair on a 2-core machine, about 1 s of
# Compare's script run with 20 runs (py-spy). Kept per process, keyed by the step times
# themselves (so a run still logging steps is a new key), the oldest dropped first.
_INTERVALS: OrderedDict[tuple[bytes, bytes], tuple[float, float]] = OrderedDict()
_INTERVALS_KEPT = 512  # at most ~16 KiB of step times per entry
_INTERVALS_LOCK = threading.Lock()  # the Streamlit server runs sessions in threads


def _bootstrap_interval(base: np.ndarray, mode: np.ndarray) -> tuple[float, float]:
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    base_medians = np.median(
        base[rng.integers(0, len(base), (UNPAIRED_RESAMPLES, len(base)))], axis=1
    )
    mode_medians = np.median(
        mode[rng.integers(0, len(mode), (UNPAIRED_RESAMPLES, len(mode)))], axis=1
    )
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
    run_tail, base_tail = tail_series(stats[run.id]), tail_series(stats[base_run.id])
    if len(run_tail) == LOSS_TAIL_ROWS and run_tail.index.equals(base_tail.index):
        return paired_noise(run_tail, base_tail)
    return paired_loss_noise_pct(full_frame(store, run.id), full_frame(store, base_run.id))


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
