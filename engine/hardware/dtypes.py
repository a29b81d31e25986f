"""Compute-dtype names as torch dtypes, and the TF32 switches: the one map and the one
switch, shared by the trainer (engine.training) and the peak benchmark (hardware.peaks).

torch is imported inside the functions: this wing loads no torch at module level (the
server and the supervisor import hardware), and only a caller that trains or benchmarks
asks for a torch dtype.
"""

from __future__ import annotations

from typing import Any

# Compute-dtype names (engine.config.COMPUTE_DTYPES' values) -> torch dtype attribute names.
# tf32 is fp32 storage with TF32 matmuls; fp8 is e4m3, the forward format of torchao's recipe.
_TORCH_DTYPE_NAMES = {"fp32": "float32", "tf32": "float32", "fp16": "float16",
                      "bf16": "bfloat16", "fp8": "float8_e4m3fn"}


def torch_dtype(name: str | None) -> Any:
    """The torch dtype of a compute-dtype name; None stays None (keep the stored dtype)."""
    if name is None:
        return None
    import torch  # only a caller that trains or benchmarks asks

    return getattr(torch, _TORCH_DTYPE_NAMES[name])


def set_tf32(enabled: bool) -> None:
    """Switch TF32 for matmuls and cuDNN convs explicitly; never rely on the defaults.

    PyTorch 2.9 introduced `fp32_precision` ("ieee" | "tf32") and warns when the legacy
    `allow_tf32` flags are mixed with it, so use the new API when it is there.
    """
    import torch  # only a caller that trains or benchmarks switches TF32

    value = "tf32" if enabled else "ieee"
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = value
        torch.backends.cudnn.conv.fp32_precision = value
    else:  # torch < 2.9
        matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def tf32_flags() -> tuple:
    """The current TF32 switches, for restore_tf32_flags."""
    import torch  # see set_tf32

    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return ("precision", matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    return ("allow", matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


def restore_tf32_flags(saved: tuple) -> None:
    import torch  # see set_tf32

    kind, matmul_value, conv_value = saved
    if kind == "precision":
        torch.backends.cuda.matmul.fp32_precision = matmul_value
        torch.backends.cudnn.conv.fp32_precision = conv_value
    else:
        torch.backends.cuda.matmul.allow_tf32 = matmul_value
        torch.backends.cudnn.allow_tf32 = conv_value
