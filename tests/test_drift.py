"""Speed at equal quality: each mode's loss drift from the baseline in a paired speedup
check, against a noise floor (a second baseline copy from another seed, and the tail's own
sampling error); the words every surface shows."""

from __future__ import annotations

import math

import pytest

from engine.analysis.drift import MIN_TAIL_BLOCKS, drift_cell, drift_words, loss_drift
from engine.analysis.speedup import explain
from engine.config import RunConfig
from engine.training.speedup import measure_speedup


def test_a_mode_within_the_seed_noise_is_the_same_quality():
    base = [2.0 - 0.01 * i for i in range(40)]
    mode = [b * 1.002 for b in base]           # 0.2 % above
    noise = [b * 1.01 for b in base]           # another seed: 1 % above
    drift = loss_drift(base, mode, noise, steps=400)
    assert drift["loss_drift_pct"] == pytest.approx(0.2, rel=1e-6)
    assert drift["seed_noise_pct"] == pytest.approx(1.0, rel=1e-6)
    assert drift["within_noise"] and drift["tail_blocks"] == 10
    assert drift_words("bf16-amp", "fp32", drift, speed="1.9x faster") == (
        "bf16-amp: 1.9x faster, loss within 0.2 % of fp32 after 400 steps (noise 1 %)")
    assert drift_cell(drift) == "+0.2 % (noise 1 %)"
    big = loss_drift(base, [b * 2.2 for b in base], noise, steps=400)
    cell = drift_cell(big)  # never "1.2e+02"
    assert cell.startswith("+120 % (noise ") and cell.endswith(" %, beyond noise)"), cell


def test_a_mode_beyond_the_noise_says_it_is_not_the_same_quality():
    base = [1.0] * 20
    mode = [1.05 + 0.001 * (i % 2) for i in range(20)]
    drift = loss_drift(base, mode, [1.001] * 20, steps=200)
    assert not drift["within_noise"] and drift["loss_drift_pct"] > 5
    words = drift_words("fp16-amp", "fp32", drift)
    assert "5.1 % above fp32's after 200 steps, beyond the noise (0.1 %)" in words
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
    assert drift["seed_noise_pct"] == pytest.approx(100 * (2.2 + 1 + 1 - 4) / 4)


def test_too_few_blocks_or_non_finite_losses_give_no_drift():
    assert loss_drift([1.0, 1.0], [1.0, 1.0], None, 4) is None
    assert loss_drift([1.0, math.nan, math.inf], [1.0, 1.0, 1.0], None, 6) is None
    assert drift_cell(None) == "n/a: fewer than 3 blocks with a finite loss"
    assert drift_cell(None, recorded=False) == "n/a: not recorded by this check"
    # with only the tail's own sampling error as the floor (no noise copy)
    drift = loss_drift([1.0, 1.1, 0.9, 1.0], [1.0, 1.2, 0.8, 1.0], None, 8)
    assert drift["seed_noise_pct"] is None and drift["noise_pct"] == drift["sampling_noise_pct"]
    assert MIN_TAIL_BLOCKS == 3


@pytest.mark.timeout(300)
def test_a_real_check_reports_each_modes_drift_and_an_aa_copy_drifts_by_nothing():
    cfg = RunConfig(model="mlp", size="tiny", batch_size=16, device="cpu", profile=False,
                    speedup_modes="fp32,fp32,bf16-amp", speedup_budget_s=6.0,
                    speedup_target_pct=0.5)
    for budget_s in (6.0, 18.0):
        result = measure_speedup(cfg.replace(speedup_budget_s=budget_s), "cpu")
        if result["rounds"] >= MIN_TAIL_BLOCKS:
            break
        # A busy machine fitted fewer rounds than a drift needs: n/a, never a figure.
        assert all(row["drift"] is None for row in result["modes"]), result["modes"]
    rows = {row["mode"]: row for row in result["modes"]}
    assert rows["fp32"]["drift"] is None  # the baseline itself
    aa = rows["fp32 (2)"]["drift"]
    # the same weights, batches and arithmetic: an A/A copy's loss is the baseline's
    assert aa["loss_drift_pct"] == 0.0 and aa["within_noise"]
    bf16 = rows["bf16-amp"]["drift"]
    assert bf16 is not None and math.isfinite(bf16["loss_drift_pct"])
    assert bf16["seed_noise_pct"] is not None and bf16["seed_noise_pct"] > 0
    # every step the mode trained: warm-up and calibration, then its timed blocks
    assert bf16["steps"] > rows["bf16-amp"]["blocks"] * result["block_steps"]
    losses = result["block_loss"]
    assert len(losses[result["noise_copy"]]) == result["rounds"] == len(losses["fp32"])
    assert losses["fp32"] != losses[result["noise_copy"]]  # another initialisation
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
    from engine.training.speedup import memory_by_kind

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
