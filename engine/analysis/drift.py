"""Speed at equal quality: how far each mode's loss drifts from the baseline's in a paired
speedup check, against a noise floor.

Every mode of a check trains its own copy from the same weights on the same batches (the
built-in sources' seeded streams; a workload's own batches may differ per mode), in blocks
of the same steps (engine.training.speedup), so block r of every mode saw the same data:
the per-block mean losses pair up. The drift is the relative difference of the mean
loss over the last quarter of the blocks (at least MIN_TAIL_BLOCKS), mode against
baseline. What counts as "the same quality" is set by a noise floor, the larger of:

- the order noise: a second copy of the baseline from the same weights, trained on the
  same batches in another order inside each block (untimed; it never enters a speed
  figure), differs from the baseline block by block; NOISE_FLOOR_FACTOR times the root
  mean square of those per-block differences over the tail is the floor. It is what
  training again with nothing changed but incidental order moves the loss by, so it
  starts at 0, follows the two copies as they part and shrinks as they converge (a copy
  from another seed differed by 35-95 % early in training: the floor then said nothing);
- the sampling error of the tail mean: twice the standard error of the paired per-block
  differences over the tail (a short check's tail is noisy by itself).

Calibrated by A/A checks: an A/A copy (the baseline's mode again) also trains in its own
order, so it is exchangeable with the noise copy, and its drift must fall inside the floor
in at least 95 % of checks (tests/test_drift.py, docs/precision-reference.md).

No torch: called by the trainer between rounds and by every surface that reads a check.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

TAIL_SHARE = 0.25
MIN_TAIL_BLOCKS = 3
# How many root-mean-square per-block order differences the floor spans. Calibrated on 44
# A/A checks (gpt tiny, 8 s each, 2-core EPYC): with 4, 43 drifted inside the floor; with
# 2, 38 (the order noise of one copy is one draw: its parting from the baseline varies).
NOISE_FLOOR_FACTOR = 4.0


def _tail(values: Sequence) -> list:
    count = max(MIN_TAIL_BLOCKS, math.ceil(len(values) * TAIL_SHARE))
    return list(values[-count:])


def loss_drift(baseline: Sequence[float], mode: Sequence[float],
               noise: Sequence[float] | None, steps: int) -> dict[str, Any] | None:
    """The drift of `mode`'s per-block losses from `baseline`'s, with its noise floor;
    None until there are MIN_TAIL_BLOCKS finite pairs."""
    # blocks where baseline and mode are finite, with the noise copy's block beside them
    noise = list(noise or [])
    blocks = [(b, m, noise[i] if i < len(noise) else math.nan)
              for i, (b, m) in enumerate(zip(baseline, mode))
              if math.isfinite(b) and math.isfinite(m)]
    if len(blocks) < MIN_TAIL_BLOCKS:
        return None
    tail_blocks = _tail(blocks)
    tail = [(b, m) for b, m, _n in tail_blocks]
    base_mean = statistics.fmean(b for b, _ in tail)
    if base_mean == 0:
        return None
    drift_pct = 100.0 * (statistics.fmean(m for _, m in tail) - base_mean) / abs(base_mean)
    differences = [100.0 * (m - b) / abs(base_mean) for b, m in tail]
    sampling_pct = 2.0 * statistics.stdev(differences) / math.sqrt(len(differences))
    order_pct = None
    noise_tail = [(b, n) for b, _m, n in tail_blocks if math.isfinite(n)]
    if len(noise_tail) >= MIN_TAIL_BLOCKS:  # the same blocks as the pair it is the floor of
        order_differences = [100.0 * (n - b) / abs(base_mean) for b, n in noise_tail]
        order_pct = NOISE_FLOOR_FACTOR * math.sqrt(statistics.fmean(
            difference * difference for difference in order_differences))
    noise_pct = max(sampling_pct, order_pct or 0.0)
    return {"loss_drift_pct": drift_pct, "noise_pct": noise_pct, "order_noise_pct": order_pct,
            "sampling_noise_pct": sampling_pct, "within_noise": abs(drift_pct) <= noise_pct,
            "steps": steps, "tail_blocks": len(tail),
            "baseline_loss": base_mean, "mode_loss": base_mean * (1 + drift_pct / 100.0)}


def pct_text(value: float) -> str:
    """A percentage to the digits that matter, never in e-notation: 0.0061, 0.31, 4.2, 120."""
    size = abs(value)
    return f"{value:.0f}" if size >= 10 else f"{value:.2g}" if size >= 1e-4 else "0"


def drift_words(mode: str, baseline: str, drift: dict[str, Any] | None,
                speed: str | None = None) -> str | None:
    """"bf16-amp: 1.9x faster, loss within 0.3 % of fp32 after 400 steps (noise 0.5 %)";
    `speed` is the mode's speed verdict words, when they are to lead."""
    if not drift:
        return None
    pct, noise = drift["loss_drift_pct"], drift["noise_pct"]
    where = f"of {baseline} after {drift['steps']} steps"
    if drift["within_noise"]:
        quality = f"loss within {pct_text(abs(pct))} % {where} (noise {pct_text(noise)} %)"
    else:
        side = "above" if pct > 0 else "below"
        quality = (f"loss {pct_text(abs(pct))} % {side} {baseline}'s after {drift['steps']} "
                   f"steps, beyond the noise ({pct_text(noise)} %)"
                   + (": not the same quality" if pct > 0 else ": it trains better here"))
    return f"{mode}: {speed + ', ' if speed else ''}{quality}"


def drift_cell(drift: dict[str, Any] | None, recorded: bool = True) -> str:
    """The short table cell: "+0.31 % (noise 0.52 %)", or n/a with the reason."""
    if not drift:
        return (f"n/a: fewer than {MIN_TAIL_BLOCKS} blocks with a finite loss" if recorded
                else "n/a: not recorded by this check")
    mark = "" if drift["within_noise"] else ", beyond noise"
    sign = "+" if drift["loss_drift_pct"] > 0 else ""
    return (f"{sign}{pct_text(drift['loss_drift_pct'])} % "
            f"(noise {pct_text(drift['noise_pct'])} %{mark})")
