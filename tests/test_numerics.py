"""engine.training.numerics: exact histogram and fp16-fraction counts on hand-built tensors, and
the probe on a real tiny model (the step mirrors the wiring proposed for
engine/training/loop.py)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from engine.analysis.numerics import FP16_MAX, fractions_rows, load, sampled_steps
from engine.config import RunConfig
from engine.schema import NUMERICS_FILENAME
from engine.training.numerics import (
    NumericsProbe,
    default_sample_steps,
    fp16_fractions,
    log2_histogram,
)


def test_log2_histogram_counts_each_power_of_two_bucket():
    values = torch.tensor([1e-9, 1e-6, 1.0, 1e5, 0.0, float("inf"), float("nan"), -3.0, 1.5])
    hist = log2_histogram(values)
    # 1e-9 = 2**-29.9 -> bucket -30; 1e-6 -> -20; 1.0 and 1.5 -> 0; |-3| -> 1; 1e5 -> 16
    assert hist["exponents"] == [-30, -20, 0, 1, 16]
    assert hist["counts"] == [1, 1, 2, 1, 1]
    assert (hist["zero"], hist["nonfinite"], hist["total"]) == (1, 2, 9)


def test_log2_histogram_bucket_edges_and_float32_extremes():
    values = torch.tensor([2.0 ** -24, 2.0 ** -24 * 0.999, 2.0 ** -149, 3.0e38, 65504.0])
    hist = log2_histogram(values)
    assert dict(zip(hist["exponents"], hist["counts"])) == {-25: 1, -24: 1, -149: 1, 127: 1, 15: 1}


def test_log2_histogram_of_low_precision_tensors():
    hist = log2_histogram(torch.tensor([0.25, 0.5, 0.0], dtype=torch.float16))
    assert (hist["exponents"], hist["counts"], hist["zero"]) == ([-2, -1], [1, 1], 1)
    hist = log2_histogram(torch.tensor([[1e-30, 4.0]], dtype=torch.bfloat16))
    assert hist["exponents"][-1] == 2 and hist["counts"] == [1, 1]


def test_fp16_fractions_underflow_subnormal_normal_overflow():
    values = torch.tensor([1e-9, 1e-6, 1.0, 1e5])
    plain = fp16_fractions(values)
    assert plain["underflow_frac_fp16"] == 0.25  # 1e-9 rounds to 0
    assert plain["subnormal_frac_fp16"] == 0.25  # 1e-6 < 6.1e-5
    assert plain["overflow_frac_fp16"] == 0.25  # 1e5 > 65504
    assert plain["underflow_frac_bf16"] == 0.0
    scaled = fp16_fractions(values, loss_scale=1024.0)
    assert scaled["underflow_frac_fp16"] == 0.25  # unscaled numbers unchanged
    assert scaled["underflow_frac_fp16_scaled"] == 0.0  # 1.02e-6: subnormal, not zero
    assert scaled["subnormal_frac_fp16_scaled"] == 0.25
    assert scaled["overflow_frac_fp16_scaled"] == 0.25  # 1.02e8
    assert scaled["loss_scale"] == 1024.0


def test_fp16_fractions_use_real_rounding_at_the_edges():
    # fp16 rounds to nearest even: 2**-25 (a tie) goes to 0, anything above to 2**-24;
    # 65519 rounds down to 65504, 65520 rounds up to inf.
    values = torch.tensor([2.0 ** -25, 2.0 ** -25 * 1.01, 65519.0, 65520.0, FP16_MAX])
    result = fp16_fractions(values)
    assert result["underflow_frac_fp16"] == pytest.approx(1 / 5)
    assert result["subnormal_frac_fp16"] == pytest.approx(1 / 5)
    assert result["overflow_frac_fp16"] == pytest.approx(1 / 5)


def test_zero_and_nonfinite_values_are_not_counted_as_underflow():
    result = fp16_fractions(torch.tensor([0.0, 0.0, float("nan"), 1e-30]))
    assert result["zero_frac"] == 0.5 and result["nonfinite_frac"] == 0.25
    assert result["underflow_frac_fp16"] == 0.25
    assert fp16_fractions(torch.tensor([1e-42]))["underflow_frac_bf16"] == 1.0


def test_default_sample_steps():
    assert default_sample_steps(60) == [1, 30, 60]
    assert default_sample_steps(2) == [1, 2]
    assert default_sample_steps(100, count=4) == [1, 34, 67, 100]


# ---------------------------------------------------------------------------------------
# the probe


class _Scaled(nn.Module):
    """y = x @ W.T with W = 1: the gradient reaching y is exactly what the loss sends."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4, bias=False)
        nn.init.eye_(self.linear.weight)

    def forward(self, x):
        return self.linear(x)


def test_probe_unscales_output_gradients_and_counts_what_fp16_would_lose():
    model = _Scaled()
    probe = NumericsProbe({1}).register(model)
    scale = 2.0 ** 16
    grad_value = 1e-8  # below fp16's range; 1e-8 * 65536 = 6.6e-4 is a normal fp16
    assert probe.begin_step(1, loss_scale=scale)
    out = model(torch.full((2, 4), 2.0))
    # What scaler.scale(loss).backward() does: every output gradient times the scale.
    (out.sum() * grad_value * scale).backward()
    for param in model.parameters():
        param.grad /= scale  # scaler.unscale_
    probe.capture_gradients(1, model)
    by_kind = {r["kind"]: r for r in probe.records()}
    assert set(by_kind) == {"activation", "output_grad", "grad"}

    act = by_kind["activation"]
    assert act["hist"]["exponents"] == [1] and act["hist"]["counts"] == [8]  # |2.0|
    assert act["underflow_frac_fp16_scaled"] is None and act["loss_scale"] is None

    out_grad = by_kind["output_grad"]
    assert out_grad["hist"]["exponents"] == [math.floor(math.log2(grad_value))]  # unscaled
    assert out_grad["underflow_frac_fp16"] == 1.0  # 1e-8 rounds to 0 in fp16
    assert out_grad["underflow_frac_fp16_scaled"] == 0.0  # the scale rescues all of it
    assert out_grad["loss_scale"] == scale

    weight_grad = by_kind["grad"]  # dW = sum over 2 rows of 2.0 * 1e-8 = 4e-8
    assert weight_grad["hist"]["exponents"] == [math.floor(math.log2(4e-8))]
    assert weight_grad["numel"] == 16 and weight_grad["underflow_frac_fp16"] == 0.0
    assert weight_grad["subnormal_frac_fp16"] == 1.0  # 4e-8 -> 2**-24 (subnormal)


def test_probe_records_nothing_on_steps_that_are_not_sampled():
    model = _Scaled()
    probe = NumericsProbe({2}).register(model)
    assert not probe.begin_step(1)
    model(torch.ones(1, 4)).sum().backward()
    probe.capture_gradients(1, model)
    assert probe.records() == []
    probe.remove()
    assert probe.begin_step(2)
    model(torch.ones(1, 4)).sum().backward()  # hooks removed: no activations recorded
    probe.capture_gradients(2, model)
    assert {r["kind"] for r in probe.records()} == {"grad"}


def _probed_step(trainer, step: int, probe: NumericsProbe) -> float:
    """Trainer.step plus the probe calls proposed for engine/training/loop.py."""
    from engine.training.loop import compute_loss
    from engine.training.precision import cast_inputs

    inputs, targets = trainer.task.batch()
    scaler = trainer.plan.scaler
    if probe.wants(step):
        probe.begin_step(step, loss_scale=float(scaler.get_scale()) if scaler else 1.0)
    with trainer.plan.autocast():
        logits = trainer.model(cast_inputs(inputs, trainer.plan))
    loss = compute_loss(trainer.cfg, logits, targets)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(trainer.optimizer)
    else:
        loss.backward()
    if probe.wants(step):
        probe.capture_gradients(step, trainer.model)
    if scaler is not None:
        scaler.step(trainer.optimizer)
        scaler.update()
    else:
        trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


@pytest.mark.parametrize("precision", ["fp32", "fp16-amp"])
def test_probe_on_a_real_tiny_model_for_two_sampled_steps(tmp_path, precision):
    from engine.training.loop import Trainer

    cfg = RunConfig(model="mlp", precision=precision, batch_size=32, steps=4, profile=False,
                    device="cpu")
    trainer = Trainer(cfg, torch.device("cpu"))
    probe = NumericsProbe({1, 3}).register(trainer.model)
    for step in range(1, 5):
        _probed_step(trainer, step, probe)
    records = probe.records()
    layers = ["net.0", "net.2", "net.4"]  # the MLP's three Linear layers
    assert sampled_steps(records) == [1, 3]
    assert [(r["step"], r["layer"], r["kind"]) for r in records] == [
        (step, layer, kind) for step in (1, 3) for layer in layers
        for kind in ("activation", "output_grad", "grad")]
    for record in records:
        hist = record["hist"]
        assert sum(hist["counts"]) + hist["zero"] + hist["nonfinite"] == hist["total"]
        assert hist["total"] == record["numel"] > 0
        assert 0.0 <= record["underflow_frac_fp16"] <= 1.0
    activation = next(r for r in records if r["kind"] == "activation")
    assert activation["dtype"] == ("float16" if precision == "fp16-amp" else "float32")
    if precision == "fp16-amp":
        grads = [r for r in records if r["kind"] != "activation"]
        assert all(r["loss_scale"] == 65536.0 for r in grads)
    # The tiny model's output gradients at batch 32 sit low in fp16's subnormal range.
    output_grads = [r for r in records if r["kind"] == "output_grad"]
    assert max(r["subnormal_frac_fp16"] for r in output_grads) > 0.2

    path = probe.save(tmp_path / NUMERICS_FILENAME)
    assert load(path) == json.loads(json.dumps(records))
    table = fractions_rows(load(path), 3)
    assert len(table) == 9 and {"underflow_fp16_pct", "underflow_fp16_scaled_pct"} <= set(table[0])


def test_load_rejects_other_files(tmp_path):
    other = tmp_path / "x.json"
    other.write_text('{"records": []}')
    with pytest.raises(ValueError, match="not a numerics file"):
        load(other)
    with pytest.raises(ValueError, match="cannot read"):
        load(tmp_path / "missing.json")


@pytest.mark.skipif(
    "numerics" not in {f.name for f in dataclasses.fields(RunConfig)},
    reason="RunConfig has no `numerics` field yet: the lead wires the probe "
    "into engine/training/loop.py (see engine/training/numerics.py docstring)",
)
def test_train_writes_numerics_json_when_enabled(tmp_path):
    from engine.training.loop import train

    cfg = RunConfig(model="mlp", steps=4, batch_size=8, profile=False, device="cpu",
                    numerics=True)
    train(cfg, "cpu", emit=lambda rows: None, run_dir=tmp_path)
    records = load(tmp_path / NUMERICS_FILENAME)
    assert sampled_steps(records) == default_sample_steps(cfg.steps)


@pytest.mark.parametrize("scale", [1.0, 1024.0, 65536.0])
def test_threshold_counts_agree_with_real_casts(scale):
    """The counts compare |x| with exact thresholds instead of casting; check them
    against real fp16/bf16 casts on values spread over every range, edges included."""
    gen = torch.Generator().manual_seed(0)
    magnitudes = torch.exp2(torch.empty(200_000).uniform_(-45, 20, generator=gen))
    signs = torch.randint(0, 2, (200_000,), generator=gen) * 2 - 1
    edges = torch.tensor([2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -14 - 2.0 ** -25,
                          2.0 ** -14 - 2.0 ** -24, 65520.0, 65519.996, 2.0 ** -134, 2.0 ** -133])
    values = torch.cat([magnitudes * signs, edges / scale])
    half = (values * scale).half()
    total = values.numel()
    result = fp16_fractions(values, loss_scale=scale)
    nonzero = values != 0  # (an edge / 65536 can itself round to 0 in float32)
    assert result["underflow_frac_fp16_scaled"] == ((half == 0) & nonzero).sum().item() / total
    assert result["subnormal_frac_fp16_scaled"] == (
        (half != 0) & (half.abs() < 2.0 ** -14)).sum().item() / total
    assert result["overflow_frac_fp16_scaled"] == torch.isinf(half).sum().item() / total
    assert result["underflow_frac_bf16"] == (
        (values.to(torch.bfloat16) == 0) & nonzero).sum().item() / total


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_probe_hooks_do_not_synchronise_the_gpu():
    """Only capture_gradients may wait for the GPU (its one transfer): the hooks that run
    inside forward and backward must not, or a sampled step would stall the pipeline."""
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8)).cuda()
    probe = NumericsProbe({1}).register(model)
    inputs = torch.randn(32, 64, device="cuda")
    probe.begin_step(1, loss_scale=1024.0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(inputs)
        (out.float().square().mean() * 1024.0).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    probe.capture_gradients(1, model, grads_scaled=True)
    assert {r["kind"] for r in probe.records()} == {"activation", "output_grad", "grad"}
