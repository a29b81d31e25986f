"""Synthetic but learnable batches, generated on the training device (no downloads).

Each task has a hidden rule drawn once from the seed, so the loss falls visibly within
a few dozen steps and runs with the same seed see the same data at every precision:
  - mlp: labels are the argmax of a fixed random linear "teacher" of the input;
  - resnet: each class is a smooth random image template plus noise;
  - gpt: sequences follow a fixed random permutation of the vocabulary (an affine map
    mod V), restarting at a random token with probability `RESTART_PROB` per position.
"""

from __future__ import annotations

import math

import torch

from engine.config import ModelName, RunConfig
from engine.training.models import model_spec

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
        self.spec = model_spec(cfg)
        # The hidden rule is drawn on the CPU so it is identical on every device.
        self.rule_gen = torch.Generator().manual_seed(cfg.seed)
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(cfg.seed + 1 + _STREAM_SEED_STRIDE * stream)
        self.model_name = ModelName(cfg.model)
        {ModelName.MLP: self._init_mlp, ModelName.RESNET: self._init_resnet,
         ModelName.GPT: self._init_gpt}[self.model_name]()

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.model_name == ModelName.MLP:
            return self._mlp_batch()
        if self.model_name == ModelName.RESNET:
            return self._resnet_batch()
        return self._gpt_batch()

    # -- mlp ------------------------------------------------------------------------------
    def _init_mlp(self) -> None:
        teacher = torch.randn(self.spec.input_dim, self.spec.num_classes, generator=self.rule_gen)
        self.teacher = teacher.to(self.device)

    def _mlp_batch(self):
        x = torch.randn(self.cfg.batch_size, self.spec.input_dim, generator=self.gen,
                        device=self.device)
        return x, (x @ self.teacher).argmax(dim=1)

    # -- resnet ---------------------------------------------------------------------------
    def _init_resnet(self) -> None:
        side = self.cfg.image_size
        coarse = torch.randn(self.spec.num_classes, 3, 4, 4, generator=self.rule_gen)
        # Upsampled 4x4 noise: smooth templates a small CNN separates quickly.
        templates = torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear",
                                                    align_corners=False)
        self.templates = templates.to(self.device)

    def _resnet_batch(self):
        labels = torch.randint(0, self.spec.num_classes, (self.cfg.batch_size,),
                               generator=self.gen, device=self.device)
        noise = torch.randn(self.cfg.batch_size, 3, self.cfg.image_size, self.cfg.image_size,
                            generator=self.gen, device=self.device)
        images = self.templates[labels] + 0.5 * noise
        if self.cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels

    # -- gpt ------------------------------------------------------------------------------
    def _init_gpt(self) -> None:
        vocab = self.spec.vocab_size
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
        vocab, length = self.spec.vocab_size, self.cfg.seq_len + 1
        shape = (self.cfg.batch_size, length)
        restarts = torch.rand(shape, generator=self.gen, device=self.device) < RESTART_PROB
        restarts[:, 0] = True
        fresh = torch.randint(0, vocab, shape, generator=self.gen, device=self.device)
        # Position of the latest restart at or before each position (vectorised, no loop).
        last_restart = torch.cummax(torch.where(restarts, self.positions, 0), dim=1).values
        distance = self.positions - last_restart
        start_token = torch.gather(fresh, 1, last_restart)
        tokens = (self.powers[distance] * start_token + self.constants[distance]) % vocab
        return tokens[:, :-1], tokens[:, 1:]


def _coprime_multiplier(vocab: int, gen: torch.Generator) -> int:
    while True:
        candidate = int(torch.randint(2, max(3, vocab), (1,), generator=gen))
        if math.gcd(candidate, vocab) == 1:
            return candidate
