"""Paired speedup statistics: what a precision mode buys, with its 95 % interval.

The measurement (engine.training.speedup) runs the modes of one workload interleaved in
one process: a *round* is one block of steps of every mode, back to back, so load that
comes and goes hits every mode of a round alike. Here, per mode and round, the input is
the block's mean step time in ms. Method (docs/precision-reference.md#paired-speedup):

- per round r and mode m, the paired ratio baseline_ms[r] / mode_ms[r] (> 1: m faster);
- the speedup is the geometric mean of those ratios over rounds, trimmed 10 % at each end
  so one block stalled by a burst of other work cannot move it;
- the 95 % interval is a percentile bootstrap over rounds (rounds resampled with
  replacement, the pairing kept), 2000 resamples, fixed seed: the same rounds give the same
  interval on every surface;
- a difference is claimed only when the interval excludes 1.0.

No torch, no numpy: called by the trainer between rounds, by pages and by the report.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any, Iterable, Sequence

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261201
TRIM_FRACTION = 0.10
MIN_ROUNDS = 5  # below this the bootstrap interval is too coarse to report


def trimmed_mean(values: Sequence[float], trim: float = TRIM_FRACTION) -> float:
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    kept = ordered[cut:len(ordered) - cut] or ordered
    return sum(kept) / len(kept)


def paired_speedup(baseline_ms: Sequence[float], mode_ms: Sequence[float],
                   resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
                   ) -> dict[str, float | int | None]:
    """Speedup of a mode over the baseline from paired per-round step times (ms).

    Returns speedup, ci_low, ci_high (None below MIN_ROUNDS rounds) and rounds.
    """
    pairs = [(b, m) for b, m in zip(baseline_ms, mode_ms) if b > 0 and m > 0]
    if not pairs:
        return {"speedup": None, "ci_low": None, "ci_high": None, "rounds": 0}
    log_ratios = [math.log(b / m) for b, m in pairs]
    estimate = math.exp(trimmed_mean(log_ratios))
    if len(log_ratios) < MIN_ROUNDS:
        return {"speedup": estimate, "ci_low": None, "ci_high": None, "rounds": len(pairs)}
    rng = random.Random(seed)
    count = len(log_ratios)
    boot = sorted(
        trimmed_mean([log_ratios[rng.randrange(count)] for _ in range(count)])
        for _ in range(resamples))
    alpha = (1.0 - CONFIDENCE) / 2.0
    low = boot[int(alpha * (resamples - 1))]
    high = boot[int(math.ceil((1.0 - alpha) * (resamples - 1)))]
    return {"speedup": estimate, "ci_low": math.exp(low), "ci_high": math.exp(high),
            "rounds": count}


def half_width_pct(entry: dict[str, Any]) -> float | None:
    """Half the interval's width as a percentage of the speedup (the stopping target)."""
    low, high, speedup = entry.get("ci_low"), entry.get("ci_high"), entry.get("speedup")
    if low is None or high is None or not speedup:
        return None
    return (high - low) / 2.0 / speedup * 100.0


def is_significant(entry: dict[str, Any]) -> bool:
    """True when the interval excludes 1.0: only then is a difference claimed."""
    low, high = entry.get("ci_low"), entry.get("ci_high")
    return low is not None and high is not None and (low > 1.0 or high < 1.0)


def speedup_words(entry: dict[str, Any], baseline: str) -> str:
    """The one sentence every surface uses for one mode's result against the baseline."""
    speedup, low, high = entry.get("speedup"), entry.get("ci_low"), entry.get("ci_high")
    if speedup is None:
        return "not measured"
    if low is None or high is None:
        return f"{speedup:.2f}x vs {baseline}, too few rounds for an interval"
    interval = f"95 % CI {low:.2f}-{high:.2f}x"
    if not is_significant(entry):
        return f"no measurable difference vs {baseline} ({low:.2f}-{high:.2f}x)"
    if speedup >= 1.0:
        return f"{speedup:.2f}x faster than {baseline} ({interval})"
    return f"{1.0 / speedup:.2f}x slower than {baseline} ({interval}; speedup {speedup:.2f}x)"


def summarise(labels: Sequence[str], block_ms: dict[str, list[float]], batch_size: int,
              tokens_per_sample: int | None, baseline: str,
              resamples: int = BOOTSTRAP_RESAMPLES) -> list[dict[str, Any]]:
    """Per mode: median step time, throughput, blocks, and the paired speedup vs baseline."""
    rows = []
    base = block_ms[baseline]
    for label in labels:
        times = block_ms[label]
        median_ms = statistics.median(times) if times else None
        samples_per_s = batch_size * 1000.0 / median_ms if median_ms else None
        row: dict[str, Any] = {
            "mode": label, "median_step_ms": median_ms, "samples_per_s": samples_per_s,
            "tokens_per_s": samples_per_s * tokens_per_sample
            if samples_per_s and tokens_per_sample else None,
            "blocks": len(times)}
        if label == baseline:
            row.update(speedup=1.0, ci_low=1.0, ci_high=1.0, significant=False)
        else:
            stats = paired_speedup(base, times, resamples=resamples)
            row.update(speedup=stats["speedup"], ci_low=stats["ci_low"],
                       ci_high=stats["ci_high"], significant=is_significant(stats))
        row["words"] = speedup_words(row, baseline) if label != baseline else "baseline"
        rows.append(row)
    return rows


def widest_half_width_pct(rows: Iterable[dict[str, Any]], baseline: str) -> float | None:
    """The widest interval among the non-baseline modes (None until all have one)."""
    widths = [half_width_pct(row) for row in rows if row["mode"] != baseline]
    if not widths or any(width is None for width in widths):
        return None
    return max(widths)


SMALL_MATMUL_SHARE = 0.10  # below this share of the measured matmul rate: too small to pay


def _rate(flops_per_s: float) -> str:
    if flops_per_s >= 1e12:
        return f"{flops_per_s / 1e12:.2f} TFLOP/s"
    return f"{flops_per_s / 1e9:.1f} GFLOP/s"


def _shape_words(gemm_shapes: list | None) -> str:
    if not gemm_shapes:
        return "its matmuls"
    _layer, m, k, n = max(gemm_shapes, key=lambda shape: shape[1] * shape[2] * shape[3])
    return f"its largest matmuls are {m}x{k}x{n} (MxKxN)"


def explain(result: dict[str, Any]) -> list[str]:
    """Findings that say why, from measurements: for each mode that is not measurably
    faster than the baseline, the rate its matmuls reached against the measured (or
    datasheet) matmul rate of its dtype on this device; and a busy machine first."""
    findings = []
    contention = result.get("contention") or {}
    if contention.get("busy"):
        findings.append(contention["words"])
    baseline = result.get("baseline")
    for row in result.get("modes", []):
        if row.get("mode") == baseline or row.get("speedup") is None:
            continue
        if row.get("significant") and row["speedup"] > 1.0:
            continue
        findings.append(_why_not_faster(row, result))
    return findings


def _why_not_faster(row: dict[str, Any], result: dict[str, Any]) -> str:
    mode, peak = row["mode"], row.get("peak") or {}
    head = (f"{mode} is slower than {result.get('baseline')}" if row.get("significant")
            else f"{mode} is not measurably faster than {result.get('baseline')}")
    achieved, peak_rate = row.get("achieved_flops_per_s"), peak.get("flops_per_s")
    if not achieved or not peak_rate:
        return f"{head}; no matmul rate for its dtype is known here, so no cause is stated."
    share = achieved / peak_rate
    source = "measured" if "measured" in str(peak.get("source", "")) else "datasheet"
    rate = (f"the model ran at {_rate(achieved)} in {mode}: {share:.1%} of the {source} "
            f"{peak.get('dtype')} matmul rate on this device ({_rate(peak_rate)})")
    if share < SMALL_MATMUL_SHARE:
        return (f"{head}: {rate}; {_shape_words(result.get('gemm_shapes'))}: too small for "
                f"the {peak.get('dtype')} units to pay. Try size small or medium, or a larger "
                "batch.")
    return (f"{head}: {rate}, so the matmuls are not what limits the step; the rest "
            "(elementwise ops, casts, the optimizer) is. The Kernels page's breakdown shows "
            "which part.")

