"""From a RunConfig and a device: the autocast context, the GradScaler, TF32 switches,
dtype casts and fp8 conversion. Everything precision-specific lives here, so the
training loop reads the same for every mode. What each mode does and how GradScaler
behaves: docs/precision-reference.md#precision-modes and #gradscaler.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from engine.config import Precision, RunConfig
from engine.hardware.dtypes import set_tf32

_AUTOCAST_DTYPE = {
    Precision.FP16_AMP: torch.float16,
    Precision.BF16_AMP: torch.bfloat16,
    Precision.FP8: torch.bfloat16,  # non-fp8 ops of an fp8 run run in bf16 (torchao's recipe)
}


@dataclass
class PrecisionPlan:
    mode: Precision
    device_type: str  # "cpu" | "cuda"
    autocast_dtype: torch.dtype | None
    param_dtype: torch.dtype
    scaler: torch.amp.GradScaler | None
    tf32_enabled: bool

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    @property
    def compute_dtype_name(self) -> str:
        """The dtype the matrix work is meant to run in; keys the MFU peak table. The
        plan's autocast/param dtypes and TF32 switch follow the mode (make_plan), so this
        is the mode's compute dtype (engine.config.COMPUTE_DTYPES)."""
        return self.mode.compute_dtype


def make_plan(cfg: RunConfig, device: torch.device) -> PrecisionPlan:
    mode = cfg.precision_mode
    tf32 = mode == Precision.TF32
    if device.type == "cuda":
        set_tf32(tf32)
    scaler = None
    if cfg.uses_grad_scaler:
        scaler = torch.amp.GradScaler(device.type, init_scale=cfg.grad_scaler_init_scale,
                                      growth_interval=cfg.grad_scaler_growth_interval)
    param_dtype = torch.bfloat16 if mode == Precision.BF16_PURE else torch.float32
    return PrecisionPlan(mode=mode, device_type=device.type,
                         autocast_dtype=_AUTOCAST_DTYPE.get(mode), param_dtype=param_dtype,
                         scaler=scaler, tf32_enabled=tf32)


def prepare_model(model: nn.Module, plan: PrecisionPlan, device: torch.device,
                  channels_last: bool = False) -> nn.Module:
    model = model.to(device=device, dtype=plan.param_dtype)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if plan.mode == Precision.FP8:
        model = convert_to_fp8(model)
    return model


def convert_to_fp8(model: nn.Module) -> nn.Module:
    """Swap eligible nn.Linear layers for torchao's float8 training linears.

    torchao is optional and imported lazily; device checks (sm89+) happen before this.
    Layers whose dimensions are not multiples of 16 stay in bf16: torch._scaled_mm
    refuses them.
    """
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError as exc:  # pragma: no cover - needs torchao
        raise RuntimeError("fp8 needs the optional package torchao (pip install torchao)") from exc

    def eligible(module: nn.Module, _fqn: str) -> bool:
        return (isinstance(module, nn.Linear) and module.in_features % 16 == 0
                and module.out_features % 16 == 0)

    return convert_to_float8_training(model, module_filter_fn=eligible)


def cast_inputs(inputs: torch.Tensor, plan: PrecisionPlan) -> torch.Tensor:
    # bf16-pure: float inputs must match the bf16 weights; token ids stay integers.
    if plan.param_dtype != torch.float32 and inputs.is_floating_point():
        return inputs.to(plan.param_dtype)
    return inputs
