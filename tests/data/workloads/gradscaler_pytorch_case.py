"""PyTorch's own GradScaler test case (test/test_cuda.py, _create_scaling_case and
_run_scaling_case): two Linear(8, 8), SGD, MSE loss, four batches, and an inf injected into
`1.weight`'s gradient on the third batch (PyTorch's skip_iter = 2, counted from 0). Run with
grad_scaler_init_scale=128 and grad_scaler_growth_interval=1: PyTorch's test expects the
scale to end at 128 * 2**3 * 0.5 = 512."""
import torch
from torch import nn

from engine.workloads import Workload

SKIP_STEP = 3  # PyTorch's skip_iter = 2, counted from 0; the run counts steps from 1


def build(cfg):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    batches = [(torch.randn(8, 8), torch.randn(8, 8)) for _ in range(4)]
    current = {"step": 0}

    def batch(step):
        current["step"] = step
        return batches[(step - 1) % len(batches)]

    def inject(grad):  # PyTorch fills model[1].weight.grad with inf after the backward
        return torch.full_like(grad, float("inf")) if current["step"] == SKIP_STEP else grad

    model[1].weight.register_hook(inject)
    return Workload(model=model, batches=batch,
                    loss=lambda outputs, targets: nn.functional.mse_loss(outputs.float(),
                                                                         targets))
