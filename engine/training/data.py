"""Synthetic but learnable batches, generated on the training device (no downloads).

Each task has a hidden rule drawn once from the seed, so the loss falls visibly within
a few dozen steps and runs with the same seed see the same data at every precision:
  - mlp: labels are the argmax of a fixed random linear "teacher" of the input;
  - resnet: each class is a smooth random image template plus noise;
  - gpt: sequences follow a fixed random permutation of the vocabulary (an affine map
    mod V), restarting at a random token with probability `RESTART_PROB` per position;
  - the known architectures: the same image and sequence rules (engine.training.models
    .task_shape: 10 classes, 256 token values), and for BERT the sequences with 15 % of
    the positions masked (loss on those only).
Real data through a DataLoader (RunConfig.data = loader) is engine/training/input_pipeline.py.
"""

from __future__ import annotations

import math

import torch

from engine.architectures import CAUSAL_LM, IMAGE, MASKED_LM, VECTOR
from engine.config import RunConfig
from engine.training.models import MASK_PROB, task_shape

RESTART_PROB = 0.1  # gpt: fraction of positions that start a new random chain
_STREAM_SEED_STRIDE = 1_000_003  # rank r's batches: seed + 1 + r * stride (no overlap)


class SyntheticTask:
    """`batch(step)` returns (inputs, targets) on `device`; deterministic in (seed, step).

    `stream`: the rank of a multi-process run. Every rank learns the same hidden rule from
    its own batches (stream 0 is what a single-process run sees).
    """

    def __init__(self, cfg: RunConfig, device: torch.device, stream: int = 0):
        self.cfg = cfg
        self.device = device
        self.shape = task_shape(cfg)
        # The hidden rule is drawn on the CPU so it is identical on every device.
        self.rule_gen = torch.Generator().manual_seed(cfg.seed)
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(cfg.seed + 1 + _STREAM_SEED_STRIDE * stream)
        kind = self.shape.kind
        {VECTOR: self._init_mlp, IMAGE: self._init_resnet, CAUSAL_LM: self._init_gpt,
         MASKED_LM: self._init_gpt}[kind]()
        self._next = {VECTOR: self._mlp_batch, IMAGE: self._resnet_batch,
                      CAUSAL_LM: self._gpt_batch, MASKED_LM: self._masked_batch}[kind]

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._next()

    # -- mlp ------------------------------------------------------------------------------
    def _init_mlp(self) -> None:
        teacher = torch.randn(self.shape.input_dim, self.shape.classes, generator=self.rule_gen)
        self.teacher = teacher.to(self.device)

    def _mlp_batch(self):
        x = torch.randn(self.cfg.batch_size, self.shape.input_dim, generator=self.gen,
                        device=self.device)
        return x, (x @ self.teacher).argmax(dim=1)

    # -- resnet ---------------------------------------------------------------------------
    def _init_resnet(self) -> None:
        side = self.cfg.image_size
        coarse = torch.randn(self.shape.classes, 3, 4, 4, generator=self.rule_gen)
        # Upsampled 4x4 noise: smooth templates a small CNN separates quickly.
        templates = torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear",
                                                    align_corners=False)
        self.templates = templates.to(self.device)

    def _resnet_batch(self):
        labels = torch.randint(0, self.shape.classes, (self.cfg.batch_size,),
                               generator=self.gen, device=self.device)
        noise = torch.randn(self.cfg.batch_size, 3, self.cfg.image_size, self.cfg.image_size,
                            generator=self.gen, device=self.device)
        images = self.templates[labels] + 0.5 * noise
        if self.cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels

    # -- gpt ------------------------------------------------------------------------------
    def _init_gpt(self) -> None:
        vocab = self.shape.vocab
        multiplier = _coprime_multiplier(vocab, self.rule_gen)
        offset = int(torch.randint(0, vocab, (1,), generator=self.rule_gen))
        # x_{t+k} = A[k] * x_t + C[k]  (mod V): powers of the affine map, one per distance.
        powers, constants = [1], [0]
        for _ in range(self.cfg.seq_len):
            powers.append(powers[-1] * multiplier % vocab)
            constants.append((constants[-1] * multiplier + offset) % vocab)
        self.powers = torch.tensor(powers, dtype=torch.long, device=self.device)
        self.constants = torch.tensor(constants, dtype=torch.long, device=self.device)
        self.positions = torch.arange(self.cfg.seq_len + 1, device=self.device)

    def _gpt_batch(self):
        tokens = self._chains() + self.shape.token_offset
        return tokens[:, :-1], tokens[:, 1:]

    def _masked_batch(self):
        """BERT's task: the chains with MASK_PROB of the positions replaced by [MASK];
        targets are the original ids there and -100 (ignored by the loss) elsewhere."""
        tokens = self._chains()[:, :-1] + self.shape.token_offset
        masked = torch.rand(tokens.shape, generator=self.gen, device=self.device) < MASK_PROB
        masked[:, 0] = True  # never a batch without a masked position
        inputs = torch.where(masked, self.shape.mask_id, tokens)
        return inputs, torch.where(masked, tokens, -100)

    def _chains(self) -> torch.Tensor:
        vocab, length = self.shape.vocab, self.cfg.seq_len + 1
        shape = (self.cfg.batch_size, length)
        restarts = torch.rand(shape, generator=self.gen, device=self.device) < RESTART_PROB
        restarts[:, 0] = True
        fresh = torch.randint(0, vocab, shape, generator=self.gen, device=self.device)
        # Position of the latest restart at or before each position (vectorised, no loop).
        last_restart = torch.cummax(torch.where(restarts, self.positions, 0), dim=1).values
        distance = self.positions - last_restart
        start_token = torch.gather(fresh, 1, last_restart)
        return (self.powers[distance] * start_token + self.constants[distance]) % vocab


def _coprime_multiplier(vocab: int, gen: torch.Generator) -> int:
    while True:
        candidate = int(torch.randint(2, max(3, vocab), (1,), generator=gen))
        if math.gcd(candidate, vocab) == 1:
            return candidate
