"""The model zoo: an MLP, a ResNet-style CNN and a GPT-style decoder, tiny to ~124M.

Sizes are chosen so `tiny` trains in seconds on two CPU cores and `medium` is about
GPT-2 small. Matrix dimensions are multiples of 8 wherever the user does not choose
them, because Tensor Cores need that for fp16/bf16 (a model that is too odd-shaped
would blame the hardware for our choice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.architectures import ARCHITECTURES, CAUSAL_LM, IMAGE, MASKED_LM, VECTOR
from engine.config import ConfigError, ModelName, ModelSize, RunConfig
from engine.training.architectures import build_architecture


@dataclass(frozen=True)
class MLPSpec:
    input_dim: int
    hidden_dim: int
    depth: int
    num_classes: int


@dataclass(frozen=True)
class ResNetSpec:
    widths: tuple[int, ...]
    blocks_per_stage: int
    num_classes: int


@dataclass(frozen=True)
class GPTSpec:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int


MLP_SPECS = {
    ModelSize.TINY: MLPSpec(input_dim=32, hidden_dim=256, depth=3, num_classes=10),
    ModelSize.SMALL: MLPSpec(input_dim=512, hidden_dim=1024, depth=4, num_classes=64),
    ModelSize.MEDIUM: MLPSpec(input_dim=1024, hidden_dim=4096, depth=6, num_classes=128),
}
RESNET_SPECS = {
    ModelSize.TINY: ResNetSpec(widths=(16, 32), blocks_per_stage=1, num_classes=10),
    ModelSize.SMALL: ResNetSpec(widths=(32, 64, 128), blocks_per_stage=2, num_classes=10),
    ModelSize.MEDIUM: ResNetSpec(widths=(64, 128, 256, 512), blocks_per_stage=2, num_classes=100),
}
GPT_SPECS = {
    ModelSize.TINY: GPTSpec(vocab_size=256, d_model=64, n_layers=2, n_heads=4),
    ModelSize.SMALL: GPTSpec(vocab_size=4096, d_model=256, n_layers=4, n_heads=4),
    # GPT-2 small: 124M parameters with the vocabulary padded to a multiple of 64.
    ModelSize.MEDIUM: GPTSpec(vocab_size=50304, d_model=768, n_layers=12, n_heads=12),
}


_SPECS = {ModelName.MLP: MLP_SPECS, ModelName.RESNET: RESNET_SPECS, ModelName.GPT: GPT_SPECS}


def model_spec(cfg: RunConfig):
    """The home-made model's spec at cfg.size (mlp, resnet, gpt only)."""
    if ModelName(cfg.model) not in _SPECS:
        raise ConfigError("model", cfg.model, "only mlp, resnet and gpt have a size spec; "
                                              "known architectures have their own fixed size")
    return _SPECS[ModelName(cfg.model)][ModelSize(cfg.size)]


# Batches for the known architectures: labels from 10 classes (the head keeps its 1000),
# token ids from 256 values (bytes; the vocabulary keeps its size). A random model first
# learns which outputs occur at all, so the loss falls within a few steps on any of them.
ARCH_TASK_CLASSES = 10
BYTE_VOCAB = 256
# BERT's ids below ~1000 are special ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102,
# [MASK] 103): byte b is id 1000 + b, so no byte reads as a special token.
BERT_BYTE_OFFSET, BERT_MASK_ID = 1000, 103
MASK_PROB = 0.15  # BERT's share of masked positions


@dataclass(frozen=True)
class TaskShape:
    """What one model's batches are (engine.architectures task kinds)."""
    kind: str               # VECTOR | IMAGE | CAUSAL_LM | MASKED_LM
    classes: int = 0        # VECTOR, IMAGE: labels are drawn from range(classes)
    input_dim: int = 0      # VECTOR
    vocab: int = 0          # token tasks: ids come from range(vocab), plus token_offset
    token_offset: int = 0
    mask_id: int | None = None  # MASKED_LM


def task_shape(cfg: RunConfig) -> TaskShape:
    """The batches `cfg.model` trains on (not for custom workloads: they bring their own)."""
    arch = ARCHITECTURES.get(cfg.model.value)
    if arch is not None:
        if arch.task == IMAGE:
            return TaskShape(IMAGE, classes=ARCH_TASK_CLASSES)
        if arch.task == MASKED_LM:
            return TaskShape(MASKED_LM, vocab=BYTE_VOCAB, token_offset=BERT_BYTE_OFFSET,
                             mask_id=BERT_MASK_ID)
        return TaskShape(CAUSAL_LM, vocab=BYTE_VOCAB)
    spec = model_spec(cfg)
    if cfg.model == ModelName.MLP.value:
        return TaskShape(VECTOR, classes=spec.num_classes, input_dim=spec.input_dim)
    if cfg.model == ModelName.RESNET.value:
        return TaskShape(IMAGE, classes=spec.num_classes)
    return TaskShape(CAUSAL_LM, vocab=spec.vocab_size)


# ---------------------------------------------------------------------------------------
# MLP


class MLP(nn.Module):
    def __init__(self, spec: MLPSpec):
        super().__init__()
        layers: list[nn.Module] = []
        width_in = spec.input_dim
        for _ in range(spec.depth - 1):
            layers += [nn.Linear(width_in, spec.hidden_dim), nn.GELU()]
            width_in = spec.hidden_dim
        layers.append(nn.Linear(width_in, spec.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# ---------------------------------------------------------------------------------------
# ResNet-style CNN


class BasicBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                nn.BatchNorm2d(channels_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, spec: ResNetSpec):
        super().__init__()
        first = spec.widths[0]
        self.stem = nn.Sequential(nn.Conv2d(3, first, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(first), nn.ReLU())
        blocks: list[nn.Module] = []
        channels = first
        for stage, width in enumerate(spec.widths):
            for index in range(spec.blocks_per_stage):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(BasicBlock(channels, width, stride))
                channels = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(features, 1), 1))


# ---------------------------------------------------------------------------------------
# GPT-style decoder


class CausalSelfAttention(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        self.n_heads = spec.n_heads
        self.qkv = nn.Linear(spec.d_model, 3 * spec.d_model)
        self.proj = nn.Linear(spec.d_model, spec.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim) for scaled_dot_product_attention, which
        # picks FlashAttention / memory-efficient kernels on GPUs that have them.
        q, k, v = (t.view(batch, seq, self.n_heads, width // self.n_heads).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class DecoderBlock(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        self.ln1 = nn.LayerNorm(spec.d_model)
        self.attn = CausalSelfAttention(spec)
        self.ln2 = nn.LayerNorm(spec.d_model)
        self.mlp = nn.Sequential(nn.Linear(spec.d_model, 4 * spec.d_model), nn.GELU(),
                                 nn.Linear(4 * spec.d_model, spec.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, spec: GPTSpec, max_seq_len: int):
        super().__init__()
        self.token_emb = nn.Embedding(spec.vocab_size, spec.d_model)
        self.pos_emb = nn.Embedding(max_seq_len, spec.d_model)
        self.blocks = nn.Sequential(*[DecoderBlock(spec) for _ in range(spec.n_layers)])
        self.ln_f = nn.LayerNorm(spec.d_model)
        self.lm_head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        self.lm_head.weight = self.token_emb.weight  # weight tying, as in GPT-2
        self.apply(_gpt_init)
        # GPT-2's scaled init of residual projections keeps early activations tame.
        for name, param in self.named_parameters():
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(param, 0.0, 0.02 / math.sqrt(2 * spec.n_layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_emb(tokens) + self.pos_emb(positions)
        return self.lm_head(self.ln_f(self.blocks(x)))


def _gpt_init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, 0.02)


def build_model(cfg: RunConfig) -> nn.Module:
    """The model of a home-made or known architecture (custom workloads build their own)."""
    if cfg.model.value in ARCHITECTURES:
        return build_architecture(cfg)
    spec = model_spec(cfg)
    if cfg.model == ModelName.MLP.value:
        return MLP(spec)
    if cfg.model == ModelName.RESNET.value:
        return ResNet(spec)
    return GPT(spec, max_seq_len=cfg.seq_len)


def parameter_count(model: nn.Module) -> int:
    # Tied weights are one tensor: count each storage once.
    seen, total = set(), 0
    for param in model.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            total += param.numel()
    return total
