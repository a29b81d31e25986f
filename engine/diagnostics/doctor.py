"""`python -m engine doctor`: what this machine has and what each precision mode means on
each device (native, emulated or unsupported, with the reason).

On a CPU the reason keeps what the ISA flags say (known before anything ran) apart from
what this machine's oneDNN probe measured (engine.diagnostics.onednn_probe: which
implementation ran a small matmul and convolution per dtype, and how fast against fp32),
worded by engine.analysis.cpu_evidence.cpu_mode_words. The probe is run when none is
stored for this CPU and torch build, like a missing peak; the device check replaces it.
"""

from __future__ import annotations

from typing import Any

from engine.analysis.cpu_evidence import device_mode_words
from engine.diagnostics.onednn_probe import cached_or_probe
from engine.hardware.devices import list_devices
from engine.hardware.nvml import nvml_unavailable_reason
from engine.proc import run_cgroup_parent
from engine.support import optional_parts, torch_support


def doctor_report(probe: bool = True) -> dict[str, Any]:
    """Everything `doctor --json` prints: torch build and whether it is a supported one,
    the optional parts installed, NVML, and each device's modes. `probe`: run the oneDNN
    probe on a CPU that has none stored (a second or two)."""
    import torch  # the build is part of the answer

    nvml_reason = nvml_unavailable_reason()
    devices = []
    for dev in list_devices():
        info = dev.to_dict()
        if dev.kind == "cpu":
            info["probe_error"] = _probe(dev) if probe else None
            info["cpu_modes"] = {mode: device_mode_words(dev, mode) for mode in info["modes"]}
            for mode, words in info["cpu_modes"].items():
                info["modes"][mode]["reason"] = words["words"]
        devices.append(info)
    return {
        "torch_version": torch.__version__,
        "torch_cuda": bool(torch.cuda.is_available()),
        "torch_cuda_build": torch.version.cuda,
        "torch_support": torch_support().to_dict(),
        "optional": [part.to_dict() for part in optional_parts()],
        "nvml_available": nvml_reason is None,
        "nvml_reason": nvml_reason,
        "run_cgroup": run_cgroup_report(),
        "devices": devices,
    }


def run_cgroup_report() -> dict[str, Any]:
    """Whether each run gets its own cgroup here (engine.proc.make_run_cgroup), and if not
    what a run's processes can then escape: one line for `doctor`."""
    parent, kind = run_cgroup_parent()
    if parent is not None:
        line = (f"run cgroups: yes ({kind}, {parent}): every process a run starts is ended "
                "with it, also after its supervisor and trainer are killed")
        return {"available": True, "kind": kind, "where": str(parent), "line": line}
    line = (f"run cgroups: no ({kind}). A run's processes are found by the subreaper and "
            "their environment marks only: a daemon that double-forks and clears its "
            "environment outlives a run whose supervisor and trainer are both killed")
    return {"available": False, "kind": None, "where": None, "reason": kind, "line": line}


def _probe(dev) -> str | None:
    try:
        cached_or_probe(dev.key, dev.name, source="doctor")
    except Exception as exc:  # noqa: BLE001 - the report stands without the measurement
        return f"oneDNN probe failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return None
