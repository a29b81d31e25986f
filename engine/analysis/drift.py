"""Speed at equal quality: how far each mode's loss drifts from the baseline's in a paired
speedup check, against a noise floor.

Every mode of a check trains its own copy from the same weights on the same batches, in
blocks of the same steps (engine.training.speedup), so block r of every mode saw the same
data: the per-block mean losses pair up. The drift is the relative difference of the mean
loss over the last quarter of the blocks (at least MIN_TAIL_BLOCKS), mode against
baseline. What counts as "the same quality" is set by a noise floor, the larger of:

- the seed noise: a second copy of the baseline, initialised from another seed and trained
  on the same batches (untimed; it never enters a speed figure), differs from the baseline
  by this much, so a precision mode within it is as close as another run would be;
- the sampling error of the tail mean: twice the standard error of the paired per-block
  differences over the tail (a short check's tail is noisy by itself).

No torch: called by the trainer between rounds and by every surface that reads a check.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

TAIL_SHARE = 0.25
MIN_TAIL_BLOCKS = 3
NOISE_SEED_OFFSET = 1009  # the noise copy's initialisation seed, apart from the baseline's


def _tail(values: Sequence[float]) -> list[float]:
    count = max(MIN_TAIL_BLOCKS, math.ceil(len(values) * TAIL_SHARE))
    return [float(v) for v in values[-count:]]


def loss_drift(baseline: Sequence[float], mode: Sequence[float],
               noise: Sequence[float] | None, steps: int) -> dict[str, Any] | None:
    """The drift of `mode`'s per-block losses from `baseline`'s, with its noise floor;
    None until there are MIN_TAIL_BLOCKS finite pairs."""
    pairs = [(b, m) for b, m in zip(baseline, mode) if math.isfinite(b) and math.isfinite(m)]
    if len(pairs) < MIN_TAIL_BLOCKS:
        return None
    tail = list(zip(_tail([b for b, _ in pairs]), _tail([m for _, m in pairs])))
    base_mean = statistics.fmean(b for b, _ in tail)
    if base_mean == 0:
        return None
    drift_pct = 100.0 * (statistics.fmean(m for _, m in tail) - base_mean) / abs(base_mean)
    differences = [100.0 * (m - b) / abs(base_mean) for b, m in tail]
    sampling_pct = 2.0 * statistics.stdev(differences) / math.sqrt(len(differences))
    seed_pct = None
    if noise:
        noise_tail = _tail([n for n in noise[:len(pairs)] if math.isfinite(n)])
        if len(noise_tail) >= MIN_TAIL_BLOCKS:
            seed_pct = abs(100.0 * (statistics.fmean(noise_tail) - base_mean) / abs(base_mean))
    noise_pct = max(sampling_pct, seed_pct or 0.0)
    return {"loss_drift_pct": drift_pct, "noise_pct": noise_pct, "seed_noise_pct": seed_pct,
            "sampling_noise_pct": sampling_pct, "within_noise": abs(drift_pct) <= noise_pct,
            "steps": steps, "tail_blocks": len(tail),
            "baseline_loss": base_mean, "mode_loss": base_mean * (1 + drift_pct / 100.0)}


def drift_words(mode: str, baseline: str, drift: dict[str, Any] | None,
                speed: str | None = None) -> str | None:
    """"bf16-amp: 1.9x faster, loss within 0.3 % of fp32 after 400 steps (noise 0.5 %)";
    `speed` is the mode's speed verdict words, when they are to lead."""
    if not drift:
        return None
    pct, noise = drift["loss_drift_pct"], drift["noise_pct"]
    where = f"of {baseline} after {drift['steps']} steps"
    if drift["within_noise"]:
        quality = f"loss within {abs(pct):.2g} % {where} (noise {noise:.2g} %)"
    else:
        side = "above" if pct > 0 else "below"
        quality = (f"loss {abs(pct):.2g} % {side} {baseline}'s after {drift['steps']} steps, "
                   f"beyond the noise ({noise:.2g} %)"
                   + (": not the same quality" if pct > 0 else ": it trains better here"))
    return f"{mode}: {speed + ', ' if speed else ''}{quality}"


def drift_cell(drift: dict[str, Any] | None) -> str:
    """The short table cell: "+0.31 % (noise 0.52 %)", or "n/a: too few blocks"."""
    if not drift:
        return "n/a: fewer than 3 blocks"
    mark = "" if drift["within_noise"] else ", beyond noise"
    return f"{drift['loss_drift_pct']:+.2g} % (noise {drift['noise_pct']:.2g} %{mark})"
