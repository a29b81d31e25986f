"""`python -m engine doctor`: what this machine has and what each precision mode means on
each device (native, emulated or unsupported, with the reason)."""

from __future__ import annotations

from typing import Any

from engine.hardware.devices import list_devices
from engine.hardware.nvml import nvml_unavailable_reason


def doctor_report() -> dict[str, Any]:
    """Everything `doctor --json` prints: torch build, NVML, and each device's modes."""
    import torch  # the build is part of the answer


    nvml_reason = nvml_unavailable_reason()
    return {
        "torch_version": torch.__version__,
        "torch_cuda": bool(torch.cuda.is_available()),
        "torch_cuda_build": torch.version.cuda,
        "nvml_available": nvml_reason is None,
        "nvml_reason": nvml_reason,
        "devices": [dev.to_dict() for dev in list_devices()],
    }
