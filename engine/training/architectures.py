"""Known architectures built from library code with random weights (never a download).

torchvision and transformers are the optional extra `models` (pyproject; pinned for CI in
requirements-models.txt), imported
only inside the builders: a run of the home-made models never loads them. Every model
here returns one logits tensor, so the loop's loss, FLOP count and precision plan treat
them like the home-made ones. The table of names, tasks and parameter counts is
engine/architectures.py.
"""

from __future__ import annotations

import importlib.util
import sys

import torch
from torch import nn

from engine.architectures import ARCHITECTURES, missing_extra
from engine.config import ConfigError, RunConfig

# The small Llama (hf:llama-small): Llama's shape (RMSNorm, SwiGLU, rotary positions,
# grouped-query attention) at a size a single GPU trains fast and a CPU can still step.
LLAMA_SMALL = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                   num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                   max_position_embeddings=2048)


class LogitsOnly(nn.Module):
    """A transformers model called with token ids, returning just its logits tensor."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=input_ids).logits


def build_architecture(cfg: RunConfig) -> nn.Module:
    name = cfg.model.value
    problem = missing_extra(name)
    if problem:  # admission refuses these first; a config arriving another way still reads well
        raise ConfigError("model", name, problem)
    if ARCHITECTURES[name].library == "torchvision":
        return _torchvision_model(name.split(":", 1)[1], cfg.image_size)
    return LogitsOnly(_transformers_model(name))


def _torchvision_model(arch: str, image_size: int) -> nn.Module:
    models = import_torchvision().models
    if arch == "vit_b_16":
        return models.vit_b_16(weights=None, image_size=image_size)  # its position table
    return getattr(models, arch)(weights=None)


def _transformers_model(name: str) -> nn.Module:
    if importlib.util.find_spec("torchvision") is not None:
        import_torchvision()  # transformers imports it when installed: the same repair first
    import transformers  # the optional extra, loaded only by runs of these models

    transformers.logging.set_verbosity_error()  # no "you should train this model" banners
    if name == "hf:gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config())
    if name == "hf:llama-small":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_SMALL))
    return transformers.BertForMaskedLM(transformers.BertConfig())


def import_torchvision():
    """torchvision, also where its compiled ops cannot load.

    PyPI's Linux torchvision wheels are built against CUDA PyTorch: beside a CPU build of
    the same torch release their C++ ops do not load, and torchvision 0.28's import then
    fails registering a fake kernel for `torchvision::nms` (the one registration it does
    not guard). The models need none of those ops, so the two schemas are declared and
    the import retried; detection ops (nms) then raise if called, nothing here calls them.
    """
    try:
        import torchvision  # the optional extra, loaded only by runs of these models
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
        for module in [
            m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")
        ]:
            del sys.modules[module]  # the half-imported package, so the retry starts clean
        _declare_torchvision_op_schemas()
        import torchvision  # the retry, now that the fake kernels have schemas to attach to
    return torchvision


_SCHEMA_LIBRARY = None  # kept alive: dropping a torch.library.Library removes its schemas


def _declare_torchvision_op_schemas() -> None:
    global _SCHEMA_LIBRARY
    if _SCHEMA_LIBRARY is None:
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _SCHEMA_LIBRARY = library
