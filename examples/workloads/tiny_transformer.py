"""A tiny causal transformer on counting sequences: the example of your own workload.

Run it:  python -m engine run --model-file examples/workloads/tiny_transformer.py --device cpu
or, from the app, point PRECISION_LAB_WORKLOADS at examples/workloads and pick it on Launch.
The contract (what build() receives and returns): docs/workloads.md.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.workloads import Workload

VOCAB = 64     # token ids 0..63
D_MODEL = 64   # multiples of 8/16 keep fp16/bf16 matmuls on Tensor Cores


class TinyCausalTransformer(nn.Module):
    def __init__(self, seq_len: int):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.position = nn.Parameter(torch.zeros(seq_len, D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, nhead=4, dim_feedforward=4 * D_MODEL,
                                           batch_first=True, norm_first=True, dropout=0.0)
        self.blocks = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(seq, device=tokens.device)
        x = self.embed(tokens) + self.position[:seq]
        return self.head(self.blocks(x, mask=causal, is_causal=True))  # (batch, seq, vocab)


def build(cfg):
    """cfg is the run's engine.config.RunConfig: batch_size, seq_len and seed are yours to use."""
    generator = torch.Generator().manual_seed(cfg.seed)

    def batches(step: int):
        # Sequences that count up by a per-sequence stride (mod VOCAB): learnable in a
        # few dozen steps. Made on the CPU; the engine moves them to the device.
        start = torch.randint(0, VOCAB, (cfg.batch_size, 1), generator=generator)
        stride = torch.randint(1, 4, (cfg.batch_size, 1), generator=generator)
        tokens = (start + stride * torch.arange(cfg.seq_len + 1)) % VOCAB
        return tokens[:, :-1], tokens[:, 1:]

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))

    return Workload(model=TinyCausalTransformer(cfg.seq_len), batches=batches, loss=loss,
                    tokens_per_sample=cfg.seq_len)
