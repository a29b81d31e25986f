"""Paired speedup statistics: what a precision mode buys, with its 95 % interval.

The measurement (engine.training.speedup) runs the modes of one workload interleaved in
one process: a *round* is one block of steps of every mode, back to back, in an order
drawn at random for each round. Here, per mode and round, the input is the block's mean
step time in ms. Method (docs/precision-reference.md#paired-speedup):

- per round r and mode m, the paired ratio baseline_ms[r] / mode_ms[r] (> 1: m faster);
- the speedup is the Hodges-Lehmann estimate of the log ratios (the median of all their
  pairwise means): a burst that stalls a few blocks cannot move it much;
- the 95 % interval is the Wilcoxon signed-rank interval: the k-th smallest and k-th
  largest pairwise mean, k from the exact distribution of the signed-rank statistic. Its
  coverage is 95 % whenever each round's log ratio is as likely to be +x as -x around the
  true value. The random order within each round makes that exactly true for an A/A
  check under any load: which copy a burst of other work lands on is a coin flip, so
  each round's sign is a fair coin whatever the burst pattern, the randomisation
  argument of a permutation test. (A bootstrap over rounds with a fixed rotation
  assumed the rounds independent; periodic and bursty load broke both.)
- a difference is claimed only when the interval excludes 1.0 *and* the machine was
  quiet: `mode_verdict` is the one rule every surface reads.

No torch, no numpy: called by the trainer between rounds, by pages and by the report.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, Sequence

from engine.analysis.drift import drift_words

CONFIDENCE = 0.95
# The fewest rounds whose signed-rank interval reaches 95 %: with 6 rounds the widest
# interval covers 1 - 2 / 2**6 = 96.9 %; with 5 only 93.8 %.
MIN_ROUNDS = 6

# The verdicts of one mode against the baseline, the same words on every surface.
FASTER = "faster"
SLOWER = "slower"
NO_DIFFERENCE = "no difference"
INCONCLUSIVE = "inconclusive"
BASELINE = "baseline"
CLAIMS = (FASTER, SLOWER)
BUSY_REASON = "the machine was busy during the check"


METHOD = ("Hodges-Lehmann estimate of the per-round paired log ratios, Wilcoxon signed-rank "
          "95 % interval, modes in a random order every round")


def method_words(result: Mapping[str, Any]) -> str:
    """How a check's figures were made, in the words Live, Compare and the report print."""
    return (f"{result.get('rounds')} rounds of {result.get('block_steps')} steps per mode, "
            f"interleaved in one process; speedup = {METHOD}; tensor peak per mode from the "
            f"{result.get('memory_method')}. A difference is claimed only when its interval "
            "excludes 1.0 and the machine was quiet.")


def setup_words(result: Mapping[str, Any]) -> str | None:
    """While a check is in its set-up (phase "setup"): which stage of which mode, every
    mode's state and the budget spent, e.g. "warming up bf16-amp (fp32: ready, bf16-amp:
    warming up, fp16-amp: waiting) · 14 / 60 s of the budget, set-up included"; None once
    the rounds run. What Live, the CLI and `engine show` say instead of a stall."""
    if result.get("phase") != "setup":
        return None
    setup = result.get("setup") or {}
    states = ", ".join(f"{label}: {state}" for label, state in (setup.get("modes") or {}).items())
    modes = setup.get("modes") or {}
    doing = (f"{setup['stage']} {setup['mode']}" if setup.get("stage") and setup.get("mode")
             else "set-up done, round 1 running" if modes and all(
                 state in ("ready", "dropped") for state in modes.values())
             else "setting up")
    budget = result.get("budget_s")
    spent = (f" · {result.get('elapsed_s') or 0:.0f} / {budget:.0f} s of the budget, set-up "
             "included" if isinstance(budget, (int, float)) else "")
    return f"{doing} ({states}){spent}" if states else f"{doing}{spent}"


def dropped_words(result: Mapping[str, Any]) -> list[str]:
    """Why each mode left out of the check was left out (its step cannot fit the budget)."""
    return [entry["reason"] for entry in result.get("dropped") or [] if entry.get("reason")]


EXACT_MAX_ROUNDS = 80  # the signed-rank distribution counted exactly up to here, normal above
_Z_975 = 1.959963984540054


def mode_row(result: Mapping[str, Any], label: str | None) -> dict[str, Any]:
    """The row of mode `label` in a check's result (stored, `show --json` or
    `speedup --json`: `modes` is a list, baseline first, each row naming its `mode`);
    {} when the check has no such mode."""
    return next((dict(row) for row in result.get("modes") or []
                 if isinstance(row, Mapping) and row.get("mode") == label), {})


def mode_labels(modes: list[str]) -> list[str]:
    """Unique labels; a mode listed twice (an A/A check of the method) gets ' (2)'."""
    labels, seen = [], {}
    for mode in modes:
        seen[mode] = seen.get(mode, 0) + 1
        labels.append(mode if seen[mode] == 1 else f"{mode} ({seen[mode]})")
    return labels


def _signed_rank_counts(n: int) -> list[int]:
    """counts[w] = how many of the 2**n sign patterns of ranks 1..n give W+ = w."""
    counts = [1]
    for rank in range(1, n + 1):
        grown = counts + [0] * rank
        for w, ways in enumerate(counts):
            grown[w + rank] += ways
        counts = grown
    return counts


_CDF_CACHE: dict[int, list[float]] = {}


def _signed_rank_cdf(n: int) -> list[float]:
    """cdf[w] = P(W+ <= w) for n ranks under the null (every sign pattern equally likely)."""
    if n not in _CDF_CACHE:
        counts, total, running, cdf = _signed_rank_counts(n), 2.0 ** n, 0, []
        for ways in counts:
            running += ways
            cdf.append(running / total)
        _CDF_CACHE[n] = cdf
    return _CDF_CACHE[n]


def signed_rank_interval_rank(n: int, confidence: float = CONFIDENCE) -> int | None:
    """The 1-based rank k such that [w_(k), w_(N+1-k)] of the N = n(n+1)/2 sorted Walsh
    averages covers the centre with probability >= `confidence` (the largest such k);
    None when n is too small for any. Exact up to EXACT_MAX_ROUNDS, normal beyond. Pure;
    tested against the published critical values."""
    alpha = 1.0 - confidence
    if n > EXACT_MAX_ROUNDS:
        mean = n * (n + 1) / 4.0
        sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
        return max(1, int(math.floor(mean - _Z_975 * sd)))
    cdf = _signed_rank_cdf(n)
    best = None
    for k in range(1, len(cdf) + 1):
        if 2.0 * cdf[k - 1] <= alpha:  # P(W+ <= k-1) on each side
            best = k
        else:
            break
    return best


def interval_coverage(n: int, k: int) -> float:
    """The coverage of the signed-rank interval [w_(k), w_(N+1-k)] of n rounds."""
    if n > EXACT_MAX_ROUNDS:
        mean = n * (n + 1) / 4.0
        sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
        z = (mean - (k - 1) - 0.5) / sd
        return math.erf(z / math.sqrt(2.0))
    return 1.0 - 2.0 * _signed_rank_cdf(n)[k - 1]


def walsh_averages(values: Sequence[float]) -> list[float]:
    """Every (x_i + x_j) / 2 with i <= j, sorted: what the signed-rank interval ranks."""
    return sorted((values[i] + values[j]) / 2.0
                  for i in range(len(values)) for j in range(i, len(values)))


def paired_speedup(baseline_ms: Sequence[float], mode_ms: Sequence[float],
                   confidence: float = CONFIDENCE) -> dict[str, float | int | None]:
    """Speedup of a mode over the baseline from paired per-round step times (ms).

    Returns speedup (the Hodges-Lehmann centre of the paired log ratios), ci_low, ci_high
    (None below MIN_ROUNDS rounds), coverage (the interval's exact coverage) and rounds.
    """
    pairs = [(b, m) for b, m in zip(baseline_ms, mode_ms) if b > 0 and m > 0]
    if not pairs:
        return {"speedup": None, "ci_low": None, "ci_high": None, "coverage": None,
                "rounds": 0}
    log_ratios = [math.log(b / m) for b, m in pairs]
    walsh = walsh_averages(log_ratios)
    estimate = math.exp(statistics.median(walsh))
    count = len(log_ratios)
    rank = signed_rank_interval_rank(count, confidence)
    if count < MIN_ROUNDS or rank is None:
        return {"speedup": estimate, "ci_low": None, "ci_high": None, "coverage": None,
                "rounds": count}
    return {"speedup": estimate, "ci_low": math.exp(walsh[rank - 1]),
            "ci_high": math.exp(walsh[len(walsh) - rank]),
            "coverage": interval_coverage(count, rank), "rounds": count}


def half_width_pct(entry: Mapping[str, Any]) -> float | None:
    """Half the interval's width as a percentage of the speedup (the stopping target)."""
    low, high, speedup = entry.get("ci_low"), entry.get("ci_high"), entry.get("speedup")
    if low is None or high is None or not speedup:
        return None
    return (high - low) / 2.0 / speedup * 100.0


def excludes_one(entry: Mapping[str, Any]) -> bool:
    """True when the interval excludes 1.0: the statistics alone would claim a
    difference. Whether a surface may say so is `mode_verdict`'s decision."""
    low, high = entry.get("ci_low"), entry.get("ci_high")
    return low is not None and high is not None and (low > 1.0 or high < 1.0)


def is_significant(entry: Mapping[str, Any]) -> bool:
    """True when the stored row's verdict claims a difference (faster or slower)."""
    verdict = entry.get("verdict")
    if verdict is not None:
        return verdict in CLAIMS
    return excludes_one(entry)


def mode_verdict(row: Mapping[str, Any], baseline: str,
                 contention: Mapping[str, Any] | None) -> tuple[str, str]:
    """(verdict, reason) for one mode of a check: THE rule every surface reads.

    faster / slower: the interval excludes 1.0 on a quiet machine; no difference: it
    includes 1.0; inconclusive: the machine was busy (no difference is stated, whatever
    the interval), or too few rounds for an interval; baseline for the baseline itself.
    """
    if row.get("mode") == baseline:
        return BASELINE, ""
    if row.get("speedup") is None:
        return INCONCLUSIVE, "not measured"
    if contention and contention.get("busy"):  # first: the more important fact
        return INCONCLUSIVE, BUSY_REASON
    if row.get("ci_low") is None or row.get("ci_high") is None:
        return INCONCLUSIVE, f"too few rounds for an interval (needs {MIN_ROUNDS})"
    if excludes_one(row):
        return (FASTER if row["speedup"] >= 1.0 else SLOWER), ""
    return NO_DIFFERENCE, ""


def speedup_words(entry: Mapping[str, Any], baseline: str, verdict: str | None = None,
                  reason: str = "") -> str:
    """The one sentence every surface uses for one mode's result against the baseline.

    `verdict` from `mode_verdict`; without it (a bare statistics entry) the interval
    alone decides, as on a quiet machine."""
    speedup, low, high = entry.get("speedup"), entry.get("ci_low"), entry.get("ci_high")
    if verdict is None:
        verdict, reason = mode_verdict({"mode": None, **entry}, baseline, None)
    if verdict == BASELINE:
        return "baseline"
    if speedup is None:
        return "not measured"
    has_interval = low is not None and high is not None
    span = f"{low:.2f}-{high:.2f}x" if has_interval else ""
    if verdict == INCONCLUSIVE and reason == BUSY_REASON:  # no figure to quote, not even 1.00x
        return (f"inconclusive: {reason}, so no difference vs {baseline} is stated"
                + (f" ({span})" if has_interval else ""))
    if not has_interval:
        return f"inconclusive: {speedup:.2f}x vs {baseline}, {reason or 'too few rounds'}"
    if verdict == NO_DIFFERENCE:
        return f"no measurable difference vs {baseline} ({span})"
    interval = f"95 % CI {span}"
    if verdict == FASTER:
        return f"{speedup:.2f}x faster than {baseline} ({interval})"
    return f"{1.0 / speedup:.2f}x slower than {baseline} ({interval}; speedup {speedup:.2f}x)"


def apply_verdicts(result: dict[str, Any]) -> dict[str, Any]:
    """`result` with each mode's verdict, reason, significant (= a claim is made) and
    words set from its interval and `result["contention"]`. Called whenever the
    contention verdict changes, so no stored row can disagree with it."""
    baseline = result.get("baseline")
    contention = result.get("contention")
    modes = []
    for row in result.get("modes", []):
        verdict, reason = mode_verdict(row, baseline, contention)
        modes.append({**row, "verdict": verdict, "verdict_reason": reason,
                      "significant": verdict in CLAIMS,
                      "interval_excludes_1": excludes_one(row) if verdict != BASELINE else False,
                      "words": speedup_words(row, baseline, verdict, reason)})
    return {**result, "modes": modes}


def judge(row: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, str]:
    """A stored row judged now: verdict, reason and words. A row stored before verdicts
    existed gets the same rule, so an old check cannot say more than a new one."""
    verdict, reason = mode_verdict(row, result.get("baseline"), result.get("contention"))
    return {"verdict": verdict, "verdict_reason": reason,
            "words": speedup_words(row, result.get("baseline"), verdict, reason)}


def stored_verdict(row: Mapping[str, Any], result: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, words) of a stored row, by `judge`."""
    judged = judge(row, result)
    return judged["verdict"], judged["words"]


def summarise(labels: Sequence[str], block_ms: dict[str, list[float]], batch_size: int,
              tokens_per_sample: int | None, baseline: str,
              contention: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
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
            row.update(speedup=1.0, ci_low=1.0, ci_high=1.0, coverage=None)
        else:
            stats = paired_speedup(base, times)
            row.update(speedup=stats["speedup"], ci_low=stats["ci_low"],
                       ci_high=stats["ci_high"], coverage=stats["coverage"])
        rows.append(row)
    judged = apply_verdicts({"baseline": baseline, "modes": rows, "contention": contention})
    return judged["modes"]


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
    """Findings that say why, from measurements: a busy machine first; then for each mode
    its speed at equal quality (drift_words: the speed verdict and the loss drift), and
    for a mode not claimed faster, the part that limits its step (`why_words`)."""
    findings = []
    contention = result.get("contention") or {}
    if contention.get("busy"):
        findings.append(contention["words"])
    findings.extend(dropped_words(result))
    baseline = result.get("baseline")
    for row in result.get("modes", []):
        if row.get("mode") == baseline or row.get("speedup") is None:
            continue
        verdict, _ = mode_verdict(row, baseline, contention)
        quality = drift_words(row["mode"], baseline, row.get("drift"),
                              speed=_speed_short(row, verdict))
        if quality:  # speed at equal quality: the two halves of the answer together
            findings.append(quality)
        if verdict == FASTER:
            continue
        sentence = why_words(row, baseline, verdict, result.get("gemm_shapes"))
        if sentence:
            findings.append(sentence)
    return findings


def _speed_short(row: Mapping[str, Any], verdict: str) -> str:
    """The speed half of a drift sentence, as the table writes the ratio: "1.92x faster",
    "0.93x: slower", "no measurable difference (1.02x)", "speed inconclusive"."""
    if verdict in CLAIMS:
        return f"{row['speedup']:.2f}x: {verdict}" if verdict == SLOWER else \
            f"{row['speedup']:.2f}x {verdict}"
    if verdict == NO_DIFFERENCE:
        return f"no measurable difference ({row['speedup']:.2f}x)"
    return "speed inconclusive"


# At this share of the dtype's measured matmul rate the matmuls alone take at least this
# share of the step (the step cannot run its FLOPs faster than the matmul rate): they are
# the limit.
MATMUL_LIMIT_SHARE = 0.5


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"


def _head(mode: str, baseline: str, verdict: str) -> str:
    if verdict == SLOWER:
        return f"{mode} is slower than {baseline}"
    if verdict == INCONCLUSIVE:
        return f"{mode} vs {baseline}: no difference is stated (inconclusive)"
    return f"{mode} is not measurably faster than {baseline}"


def why_words(row: Mapping[str, Any], baseline: str, verdict: str,
              gemm_shapes: list | None = None) -> str | None:
    """Which part limits a mode's step, decided from the rate its model FLOPs reached
    against the measured (or datasheet) matmul rate of its dtype. The one function every
    "why" sentence comes from.

    The model's FLOPs are matmul FLOPs and cannot run faster than the matmul rate, so
    achieved / matmul rate is a lower bound on the matmuls' share of the step:
    - an emulated dtype says so first (no unit for it here: that is the cause);
    - share >= MATMUL_LIMIT_SHARE: the matmuls are the limit;
    - share < SMALL_MATMUL_SHARE: the matmuls are too small for the dtype's units to pay;
    - in between the rate alone cannot tell; the profiler's breakdown can.
    """
    mode, peak = row["mode"], row.get("peak") or {}
    head = _head(mode, baseline, verdict)
    dtype = peak.get("dtype") or "its dtype"
    emulated = peak.get("emulated")
    achieved, peak_rate = row.get("achieved_flops_per_s"), peak.get("flops_per_s")
    if emulated:
        rate = f" (its model FLOPs ran at {_rate(achieved)})" if achieved else ""
        return (f"{head}: {dtype} is emulated on this device ({peak.get('emulated_reason')}), "
                f"so its matmuls run through conversion code{rate}; that, not the model, "
                f"is why. Native {dtype} needs a CPU or GPU with a {dtype} unit.")
    if verdict == INCONCLUSIVE:
        return None  # a busy check: no cause stated for a difference that is not stated
    if not achieved or not peak_rate:
        return f"{head}; no matmul rate for its dtype is known here, so no cause is stated."
    share = achieved / peak_rate
    source = "measured" if "measured" in str(peak.get("source", "")) else "datasheet"
    rate = (f"its model FLOPs ran at {_rate(achieved)}: {_pct(share)} of the {source} "
            f"{dtype} matmul rate on this device ({_rate(peak_rate)})")
    if share >= MATMUL_LIMIT_SHARE:
        return (f"{head}: {rate}, so the matmuls alone take at least {_pct(min(share, 1.0))} "
                f"of the step: the {dtype} matmul rate of this device is what limits it, and "
                f"{dtype} matmuls here are no faster than the baseline's. Only a faster "
                f"{dtype} matmul unit would change that.")
    if share < SMALL_MATMUL_SHARE:
        return (f"{head}: {rate}; {_shape_words(gemm_shapes)}: too small for "
                f"the {dtype} units to pay. Try size small or medium, or a larger batch.")
    return (f"{head}: {rate}, so the matmuls take between {_pct(share)} and 100 % of the step; "
            "the rate alone cannot say which part limits it. A profiled run's time breakdown "
            "on the Kernels page does.")
