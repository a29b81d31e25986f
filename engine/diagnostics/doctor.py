"""`python -m engine doctor`: what this machine has and what each precision mode means on
each device (native, emulated or unsupported, with the reason)."""

from __future__ import annotations

from typing import Any

from engine.hardware.devices import list_devices
from engine.hardware.nvml import nvml_unavailable_reason
from engine.support import optional_parts, torch_support


def doctor_report() -> dict[str, Any]:
    """Everything `doctor --json` prints: torch build and whether it is a supported one,
    the optional parts installed, NVML, and each device's modes."""
    import torch  # the build is part of the answer

    nvml_reason = nvml_unavailable_reason()
    return {
        "torch_version": torch.__version__,
        "torch_cuda": bool(torch.cuda.is_available()),
        "torch_cuda_build": torch.version.cuda,
        "torch_support": torch_support().to_dict(),
        "optional": [part.to_dict() for part in optional_parts()],
        "nvml_available": nvml_reason is None,
        "nvml_reason": nvml_reason,
        "devices": [dev.to_dict() for dev in list_devices()],
    }
