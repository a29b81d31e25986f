"""Capture oneDNN's verbose log of one small conv (forward + backward) and one linear layer
(forward + backward) in a dtype: python tests/data/onednn/capture.py fp32|bf16|fp16 > LOG

The second of two identical steps is logged (the first creates the primitives), the way a
run's profiler window is. Verbose is switched on with ONEDNN_VERBOSE=1 in the environment
(the header names oneDNN's version and the ISA it detected)."""

import sys

import torch

dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[sys.argv[1]]
torch.manual_seed(0)
conv = torch.nn.Conv2d(8, 8, 3, padding=1)
linear = torch.nn.Linear(32, 32)
images = torch.randn(2, 8, 8, 8, requires_grad=True)
rows = torch.randn(16, 32, requires_grad=True)


def step() -> None:
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        out = conv(images).float().sum() + linear(rows).float().sum()
    out.backward()


step()
print("# second step", flush=True)
step()
