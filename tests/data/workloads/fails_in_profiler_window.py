"""A workload whose batches raise inside the profiler window: at its first step (on a CPU
the oneDNN verbose step, fd 1 sent to the oneDNN log) or, with FAIL_AT_WINDOW_STEP=N, the
window's step N after it (a traced step)."""
import os

import torch
from torch import nn

from engine.workloads import Workload

FAILURE = "the batches failed inside the profiler window on purpose"
FAIL_AT_WINDOW_STEP_ENV = "FAIL_AT_WINDOW_STEP"


def build(cfg):
    fail_at_step = cfg.warmup_steps + 1 + int(os.environ.get(FAIL_AT_WINDOW_STEP_ENV, "0"))

    def batches(step):
        if step == fail_at_step:
            raise RuntimeError(f"{FAILURE} (step {step})")
        return torch.randn(cfg.batch_size, 16), torch.randint(0, 4, (cfg.batch_size,))

    return Workload(model=nn.Linear(16, 4), batches=batches)
