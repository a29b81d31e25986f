"""The known architectures, by name: library code with random weights, never a download.

No torch here: RunConfig (input limits), admission (is the library installed?), the CLI's
`models` listing and the Launch page read this table; engine/training/architectures.py
builds the models. A new architecture is one entry here, one member of
engine.config.ModelName and one builder there (tests/test_architectures.py checks the
three agree and that each parameter count below is what the built model has).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

# The optional extra these need (a range, so a GPU node keeps its own PyTorch; the pinned
# set CI uses is requirements-models.txt).
EXTRA_INSTALL = 'pip install "precision-lab[models]" (from a checkout: pip install -e ".[models]")'

# What a model's batches are, which decides its inputs, targets and loss:
VECTOR = "vector"        # float vectors -> class logits (the mlp)
IMAGE = "image"          # (B, 3, H, W) images -> class logits, cross-entropy
CAUSAL_LM = "causal_lm"  # token ids -> next-token logits, cross-entropy on every position
MASKED_LM = "masked_lm"  # token ids with 15 % masked -> logits, cross-entropy on the masked
TOKEN_TASKS = (CAUSAL_LM, MASKED_LM)


@dataclass(frozen=True)
class Architecture:
    name: str               # the RunConfig.model value, e.g. "torchvision:resnet50"
    library: str            # the import name of the package that defines it
    task: str               # IMAGE | CAUSAL_LM | MASKED_LM
    param_count: int        # of the built model (ViT: at 224 px; its position table grows)
    description: str
    image_multiple: int = 1      # image_size must be a multiple of this (ViT's patch side)
    max_seq_len: int | None = None  # the model's position table


ARCHITECTURES: dict[str, Architecture] = {arch.name: arch for arch in (
    Architecture("torchvision:resnet50", "torchvision", IMAGE, 25_557_032,
                 "ResNet-50 (torchvision), 1000 classes"),
    Architecture("torchvision:vit_b_16", "torchvision", IMAGE, 86_567_656,
                 "ViT-B/16 (torchvision), 1000 classes", image_multiple=16),
    Architecture("torchvision:mobilenet_v3_large", "torchvision", IMAGE, 5_483_032,
                 "MobileNetV3-Large (torchvision), 1000 classes"),
    Architecture("torchvision:convnext_tiny", "torchvision", IMAGE, 28_589_128,
                 "ConvNeXt-Tiny (torchvision), 1000 classes"),
    Architecture("hf:gpt2", "transformers", CAUSAL_LM, 124_439_808,
                 "GPT-2 small, 124M (transformers GPT2LMHeadModel)", max_seq_len=1024),
    Architecture("hf:llama-small", "transformers", CAUSAL_LM, 57_942_528,
                 "a small Llama (transformers LlamaForCausalLM: 8 layers, d 512, GQA 8/4 "
                 "heads, vocab 32000)", max_seq_len=2048),
    Architecture("hf:bert-base", "transformers", MASKED_LM, 109_514_298,
                 "BERT-base masked LM (transformers BertForMaskedLM)", max_seq_len=512),
)}

# The home-made models' tasks (engine/training/models.py).
HOME_MADE_TASKS = {"mlp": VECTOR, "resnet": IMAGE, "gpt": CAUSAL_LM}
CUSTOM = "custom"  # your own workload (RunConfig.workload; docs/workloads.md)


def task_of(model: str) -> str | None:
    """The task of a model name; None for a custom workload (its own batches and loss)."""
    if model in HOME_MADE_TASKS:
        return HOME_MADE_TASKS[model]
    arch = ARCHITECTURES.get(model)
    return arch.task if arch else None


def is_token_model(model: str) -> bool:
    """Sequence models, whose natural throughput is tokens/s."""
    return task_of(model) in TOKEN_TASKS


def missing_extra(model: str) -> str | None:
    """Why `model` cannot be built here (its library is not installed), or None."""
    arch = ARCHITECTURES.get(model)
    if arch is None or importlib.util.find_spec(arch.library) is not None:
        return None
    return (f"needs the optional package {arch.library}, not installed here: "
            f"{EXTRA_INSTALL}")
