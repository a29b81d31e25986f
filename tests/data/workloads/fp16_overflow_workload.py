"""A workload whose middle layer multiplies its incoming gradient by 1e4: under fp16-amp
with a loss scale of 65536 the gradient below it overflows fp16's 65504."""
import torch
from torch import nn

from engine.workloads import Workload


class _Amplify(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 1e4


class Amplifier(nn.Module):
    def forward(self, x):
        return _Amplify.apply(x)


def build(cfg):
    model = nn.Sequential()
    model.add_module("encoder", nn.Linear(16, 32))
    model.add_module("amplifier", Amplifier())
    model.add_module("head", nn.Linear(32, 4))
    return Workload(model=model,
                    batches=lambda step: (torch.randn(cfg.batch_size, 16),
                                          torch.randint(0, 4, (cfg.batch_size,))))
