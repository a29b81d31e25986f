"""The step meter on its own: asked once per step whether the step is logged, handed the
step's figures once at a sync point, its state declared on the class, and built from what
it reads (no trainer)."""

from __future__ import annotations

import pytest
import torch

from engine.config import RunConfig
from engine.schema import STEADY, WARMUP
from engine.training.input_pipeline import builtin_source
from engine.training.step_meter import StepMeter

CPU = torch.device("cpu")


def _meter(log_interval_steps: int = 2, total_steps: int = 5) -> StepMeter:
    cfg = RunConfig(model="mlp", size="tiny", batch_size=8, steps=total_steps, device="cpu")
    return StepMeter(source=builtin_source(cfg, CPU), scaler=None, device=CPU,
                     samples_per_step=8, tokens_per_sample=None, flops_per_step=2e6,
                     peak_flops=None, log_interval_steps=log_interval_steps,
                     total_steps=total_steps)


def test_every_log_interval_and_the_last_step_are_logged():
    meter = _meter(log_interval_steps=2, total_steps=5)
    assert [meter.should_log(step) for step in range(1, 6)] == [False, True, False, True, True]


def test_one_call_per_sync_point_closes_the_interval_and_makes_the_row_of_a_log_step():
    meter = _meter()
    meter.step_done(None)
    assert meter.log(1, WARMUP, 3.0, None, lr=0.01) is None  # a phase change, not logged
    for _ in range(2):
        meter.step_done(None)
    row = meter.log(2, STEADY, 2.5, torch.tensor(1.25), lr=0.02)
    assert row is not None and (row["step"], row["loss"], row["lr"]) == (2, 2.5, 0.02)
    assert row["grad_norm"] == pytest.approx(1.25) and row["phase"] == STEADY
    assert row["step_time_ms"] > 0 and row["samples_per_s"] == pytest.approx(
        8 * 1000.0 / row["step_time_ms"])
    assert meter.interval.steps == 0  # the next interval has begun
    figures = meter.steady_figures()
    # only the steady interval counts (two steps); the warm-up one is left out
    assert meter.steady_steps == 2 and figures["first_loss"] == figures["final_loss"] == 2.5
    assert figures["skipped_steps"] == 0 and figures["loss_scale_final"] is None


def test_its_state_is_declared_on_the_class_and_it_takes_no_trainer():
    meter = _meter()
    undeclared = set(vars(meter)) - set(StepMeter.__annotations__)
    assert undeclared == set(), f"declare these on StepMeter: {sorted(undeclared)}"
    assert not any("trainer" in name for name in vars(meter))
