"""Speed at equal quality: each mode's loss drift from the baseline in a paired speedup
check, against a noise floor (a second baseline copy from the same weights trained on the
same batches in another order, and the tail's own sampling error); the words every surface
shows; and the floor's calibration by A/A checks."""

from __future__ import annotations

import math

import pytest

from engine.analysis.drift import (
    MIN_TAIL_BLOCKS,
    NOISE_FLOOR_FACTOR,
    drift_cell,
    drift_words,
    loss_drift,
    pct_text,
)
from engine.analysis.speedup import explain
from engine.config import RunConfig
from engine.training.speedup import BudgetError, measure_speedup


def test_a_mode_within_the_order_noise_is_the_same_quality():
    base = [2.0 - 0.01 * i for i in range(40)]
    mode = [b * 1.002 for b in base]           # 0.2 % above
    noise = [b * 1.005 for b in base]          # another batch order: 0.5 % above, per block
    drift = loss_drift(base, mode, noise, steps=400)
    assert drift["loss_drift_pct"] == pytest.approx(0.2, rel=1e-6)
    tail = base[-10:]
    rms = math.sqrt(sum((0.5 * b / (sum(tail) / 10)) ** 2 for b in tail) / 10)
    assert drift["order_noise_pct"] == pytest.approx(NOISE_FLOOR_FACTOR * rms, rel=1e-6)
    assert drift["within_noise"] and drift["tail_blocks"] == 10
    noise_words = pct_text(drift["noise_pct"])
    assert drift_words("bf16-amp", "fp32", drift, speed="1.9x faster") == (
        f"bf16-amp: 1.9x faster, loss within 0.2 % of fp32 after 400 steps (noise {noise_words} %)")
    assert drift_cell(drift) == f"+0.2 % (noise {noise_words} %)"
    big = loss_drift(base, [b * 2.2 for b in base], noise, steps=400)
    cell = drift_cell(big)  # never "1.2e+02"
    assert cell.startswith("+120 % (noise ") and cell.endswith(" %, beyond noise)"), cell


def test_the_floor_follows_the_copies_not_the_distance_between_two_initialisations():
    """Early in training two initialisations differ by tens of % (the old floor said "loss
    within 3.6 % of fp32 after 88 steps (noise 95 %)"); two copies from the same weights
    that differ only in batch order start together, part a little, and come together again
    as they converge: the floor follows them."""
    base = [4.0 * math.exp(-i / 10) + 1.0 for i in range(40)]
    parting = [b * (1 + 0.002 * math.sin(i) * math.exp(-i / 15)) for i, b in enumerate(base)]
    early = loss_drift(base[:12], base[:12], parting[:12], steps=120)
    late = loss_drift(base, base, parting, steps=400)
    assert late["noise_pct"] < early["noise_pct"] < 0.5
    assert late["noise_pct"] < 0.1


def test_a_mode_beyond_the_noise_says_it_is_not_the_same_quality():
    base = [1.0] * 20
    mode = [1.05 + 0.001 * (i % 2) for i in range(20)]
    drift = loss_drift(base, mode, [1.0005] * 20, steps=200)
    assert not drift["within_noise"] and drift["loss_drift_pct"] > 5
    words = drift_words("fp16-amp", "fp32", drift)
    assert (f"5.1 % above fp32's after 200 steps, beyond the noise "
            f"({pct_text(drift['noise_pct'])} %)") in words
    assert words.endswith("not the same quality")
    assert drift_cell(drift).endswith(", beyond noise)")


def test_the_noise_floor_is_taken_over_the_same_blocks_as_the_drift():
    """A NaN block of the mode drops that block for the noise copy too: the floor is never
    taken from other (earlier, higher-loss) blocks."""
    base = [3.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    mode = [3.0, 2.0, 1.0, 1.0, math.nan, math.nan]
    noise = [3.3, 2.2, 1.0, 1.0, 1.0, 1.0]
    drift = loss_drift(base, mode, noise, steps=60)
    assert drift["tail_blocks"] == 3  # blocks 1-3 of the 4 finite ones
    base_mean = (2.0 + 1.0 + 1.0) / 3  # per-block differences 0.2, 0, 0 of that mean
    assert drift["order_noise_pct"] == pytest.approx(
        NOISE_FLOOR_FACTOR * math.sqrt((100 * 0.2 / base_mean) ** 2 / 3))


def test_too_few_blocks_or_non_finite_losses_give_no_drift():
    assert loss_drift([1.0, 1.0], [1.0, 1.0], None, 4) is None
    assert loss_drift([1.0, math.nan, math.inf], [1.0, 1.0, 1.0], None, 6) is None
    assert drift_cell(None) == "n/a: fewer than 3 blocks with a finite loss"
    assert drift_cell(None, recorded=False) == "n/a: not recorded by this check"
    # with only the tail's own sampling error as the floor (no noise copy)
    drift = loss_drift([1.0, 1.1, 0.9, 1.0], [1.0, 1.2, 0.8, 1.0], None, 8)
    assert drift["order_noise_pct"] is None and drift["noise_pct"] == drift["sampling_noise_pct"]
    assert MIN_TAIL_BLOCKS == 3


@pytest.mark.timeout(300)
def test_a_real_check_reports_each_modes_drift_and_an_aa_copys_order_noise():
    import torch

    cfg = RunConfig(model="mlp", size="tiny", batch_size=16, device="cpu", profile=False,
                    speedup_modes="fp32,fp32,bf16-amp", speedup_budget_s=6.0,
                    speedup_target_pct=0.5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # four copies on 2 cores shared with other work
    try:
        for budget_s in (8.0, 20.0, 40.0):
            try:
                result = measure_speedup(cfg.replace(speedup_budget_s=budget_s), "cpu")
            except BudgetError:  # a busy machine: the next budget
                continue
            if result["rounds"] >= MIN_TAIL_BLOCKS:
                break
            # A busy machine fitted fewer rounds than a drift needs: n/a, never a figure.
            assert all(row["drift"] is None for row in result["modes"]), result["modes"]
    finally:
        torch.set_num_threads(threads)
    rows = {row["mode"]: row for row in result["modes"]}
    assert rows["fp32"]["drift"] is None  # the baseline itself
    aa = rows["fp32 (2)"]["drift"]
    # an A/A copy trains the baseline's batches in its own order: it drifts by order noise
    assert aa is not None and math.isfinite(aa["loss_drift_pct"])
    bf16 = rows["bf16-amp"]["drift"]
    assert bf16 is not None and math.isfinite(bf16["loss_drift_pct"])
    assert bf16["order_noise_pct"] is not None and bf16["order_noise_pct"] > 0
    # every step the mode trained: warm-up and calibration, then its timed blocks
    assert bf16["steps"] > rows["bf16-amp"]["blocks"] * result["block_steps"]
    assert result["noise_copy"] == "fp32 (another batch order)"
    losses = result["block_loss"]
    assert len(losses[result["noise_copy"]]) == result["rounds"] == len(losses["fp32"])
    assert losses["fp32"] != losses[result["noise_copy"]]  # another batch order
    findings = explain(result)
    # within the noise ("of fp32 after") or beyond it ("fp32's after"), as measured
    assert any(f.startswith("bf16-amp: ") and f"after {bf16['steps']} steps" in f
               for f in findings), findings
    # memory by kind, from the same check: autocast keeps fp32 weights, so every mode holds
    # the same parameters, gradients and optimizer state; the rest is what the step adds
    kinds = [rows[label]["memory_by_kind"] for label in ("fp32", "fp32 (2)", "bf16-amp")]
    for label, kind in zip(("fp32", "fp32 (2)", "bf16-amp"), kinds):
        assert kind["peak_bytes"] == rows[label]["peak_mem_bytes"]
        assert not kind["counted_exceeds_peak"] and kind["rest_bytes"] > 0  # activations
        assert kind["parameters_bytes"] == kind["gradients_bytes"] > 0
        assert kind["master_copies_bytes"] == 0
        assert kind["optimizer_state_bytes"] >= 2 * kind["parameters_bytes"]  # AdamW moments
    assert len({(k["parameters_bytes"], k["gradients_bytes"], k["optimizer_state_bytes"])
                for k in kinds}) == 1
    from engine.report.figures import memory_by_kind_figure

    figure = memory_by_kind_figure(result)
    assert [trace.name for trace in figure.data] == [
        "parameters", "gradients", "optimizer state", "fp32 master copies",
        "activations, autocast cache, workspace"]


def test_bf16_pure_holds_half_the_weights_gradients_and_optimizer_state():
    import torch

    from engine.training.loop import Trainer
    from engine.training.memory import memory_by_kind

    kinds = {}
    for precision in ("fp32", "bf16-pure"):
        cfg = RunConfig(model="mlp", size="tiny", batch_size=8, device="cpu", profile=False,
                        precision=precision)
        trainer = Trainer(cfg, torch.device("cpu"))
        trainer.step(1)  # the optimizer's state exists after its first step
        kinds[precision] = memory_by_kind(trainer, peak_bytes=2**30)
    for key in ("parameters_bytes", "gradients_bytes"):
        assert kinds["bf16-pure"][key] * 2 == kinds["fp32"][key]
    assert kinds["bf16-pure"]["optimizer_state_bytes"] < kinds["fp32"]["optimizer_state_bytes"]
    assert memory_by_kind(trainer, None) is None  # no measured peak: no split


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_aa_checks_drift_lies_inside_the_noise_floor_in_19_of_20_checks():
    """The floor's calibration: 20 A/A checks (fp32 twice, gpt tiny, 8 s each, another seed
    each), the A/A copy exchangeable with the noise copy (both train the baseline's batches
    in their own order): its drift inside the floor in at least 19. 165 s on the shared
    2-core EPYC at load average 5-7. The full acceptance, run once by hand (gpt tiny, 400
    steps per copy, 20 seeds): 20 of 20 inside, the floor 0.30-0.70 %, the largest A/A
    drift 0.14 % (docs/precision-reference.md#paired-speedup)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 3 copies on 2 cores: one thread is the trainer's setting here
    inside, drifts, seed = 0, [], 0
    try:
        while len(drifts) < 20 and seed < 30:
            cfg = RunConfig(model="gpt", size="tiny", device="cpu", profile=False, seed=seed,
                            speedup_modes="fp32,fp32", speedup_budget_s=8.0)
            seed += 1
            try:
                result = measure_speedup(cfg, "cpu")
            except BudgetError:  # a machine too busy to fit 6 rounds: no check, not a miss
                continue
            drift = result["modes"][1]["drift"]
            if drift is None:
                continue
            drifts.append(drift)
            inside += drift["within_noise"]
    finally:
        torch.set_num_threads(threads)
    assert len(drifts) == 20, f"only {len(drifts)} checks fitted their budget"
    summary = [(round(d["loss_drift_pct"], 3), round(d["noise_pct"], 3)) for d in drifts]
    assert inside >= 19, summary
    assert max(d["noise_pct"] for d in drifts) < 5.0, summary
