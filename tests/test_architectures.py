"""Known architectures (torchvision, transformers) by name: each trains a few steps at a
tiny input size on the CPU with the loss falling and its FLOPs counted; the catalogue's
parameter counts are the built models'. Skipped, with the reason, without the optional
extra (requirements-models.txt; CI installs it through requirements-dev.txt).
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.architectures import ARCHITECTURES, IMAGE, missing_extra
from engine.config import ConfigError, ModelName, RunConfig, choices
from engine.schema import throughput_column
from engine.training.loop import train


def _skip_without_extra(name: str):
    reason = missing_extra(name)
    return pytest.mark.skipif(reason is not None, reason=f"{name}: {reason}")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # the losses below were measured on one thread (shared 2 cores)
    yield
    torch.set_num_threads(previous)


def tiny_config(name: str, **changes) -> RunConfig:
    """32 px images / 16-token sequences: a few seconds a step even for the 124M GPT-2.
    Sequence models read the stdlib text (its skewed byte frequencies are learnt within a
    few steps); image models the on-device synthetic classes."""
    image = ARCHITECTURES[name].task == IMAGE
    fields = dict(model=name, device="cpu", steps=8, warmup_steps=1, lr=1e-3,
                  batch_size=4 if image else 2, image_size=32, seq_len=16, profile=False,
                  data="synthetic" if image else "loader")
    return RunConfig(**{**fields, **changes})


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", [pytest.param(n, marks=_skip_without_extra(n))
                                  for n in ARCHITECTURES])
def test_each_architecture_trains_with_the_loss_falling_and_flops_counted(name, home):
    cfg = tiny_config(name, channels_last=ARCHITECTURES[name].task == IMAGE)
    rows: list[dict] = []
    result = train(cfg, "cpu", emit=rows.extend)
    losses = [row["loss"] for row in rows]
    assert result.status == "finished" and len(losses) == cfg.steps
    assert all(math.isfinite(loss) for loss in losses), losses
    # A noisy few steps at batch 2-4: the best of the last three against the first.
    assert min(losses[-3:]) < losses[0] - 0.5, losses
    assert result.flops_per_step and result.flops_per_step > 1e8
    assert all(row["achieved_tflops"] > 0 for row in rows)
    expected = ARCHITECTURES[name].param_count
    if name != "torchvision:vit_b_16":  # its position table is sized by image_size
        assert result.param_count == expected
    column = throughput_column(name)
    assert rows[-1][column] > 0
    assert result.extra["spec"] == {"architecture": name}


@_skip_without_extra("torchvision:vit_b_16")
def test_vit_parameter_count_at_224_px_is_the_catalogues():
    from engine.training.models import build_model, parameter_count

    model = build_model(RunConfig(model="torchvision:vit_b_16", image_size=224))
    assert parameter_count(model) == ARCHITECTURES["torchvision:vit_b_16"].param_count


@_skip_without_extra("hf:bert-base")
def test_bert_synthetic_batches_mask_some_positions_and_ignore_the_rest():
    from engine.training.data import SyntheticTask

    cfg = RunConfig(model="hf:bert-base", batch_size=4, seq_len=32, device="cpu")
    inputs, targets = SyntheticTask(cfg, torch.device("cpu")).batch()
    masked = targets != -100
    assert masked.any() and (~masked).any()
    assert (inputs[masked] == 103).all()  # [MASK]
    assert (inputs[~masked] >= 1000).all()  # bytes, clear of BERT's special ids


def test_every_architecture_is_a_model_choice_and_names_its_library():
    assert set(ARCHITECTURES) <= set(choices(ModelName))
    for arch in ARCHITECTURES.values():
        assert arch.library in ("torchvision", "transformers")
        assert arch.param_count > 1_000_000


def test_input_sizes_an_architecture_cannot_take_are_refused_naming_the_field():
    with pytest.raises(ConfigError) as info:
        RunConfig(model="torchvision:vit_b_16", image_size=40)
    assert info.value.field == "image_size" and "multiple of 16" in info.value.fix
    with pytest.raises(ConfigError) as info:
        RunConfig(model="hf:gpt2", seq_len=2048)
    assert info.value.field == "seq_len" and "1024" in info.value.fix


def test_a_missing_extra_is_refused_with_the_install_command(monkeypatch):
    import importlib.util

    from engine.admission import check_runnable

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torchvision" else real(name, *a))
    assert 'pip install "precision-lab[models]"' in missing_extra("torchvision:resnet50")
    with pytest.raises(ConfigError) as info:
        check_runnable(RunConfig(model="torchvision:resnet50", device="cpu"))
    assert info.value.field == "model" and 'pip install "precision-lab[models]"' in info.value.fix
