"""What devices this machine has, and what each precision mode means on each of them.

Decisions come from evidence the machine gives (CPU ISA flags, CUDA compute
capability), never from a product name (docs/precision-reference.md#hardware-matrix). GPU discovery
goes through NVML first so a
long-lived process (the Streamlit server) does not create a CUDA context just to draw
the sidebar; torch.cuda is the fallback.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field

from engine.config import COMPUTE_DTYPES, ConfigError, Precision, choices
from engine.hardware.cpu_units import EMULATED, NATIVE, UNSUPPORTED, cpu_matrix_unit
from engine.hardware.gpus import arch_name
from engine.hardware.nvml import nvml_call, nvml_library


@dataclass(frozen=True)
class ModeSupport:
    status: str  # native | emulated | unsupported
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"status": self.status, "reason": self.reason}


@dataclass(frozen=True)
class DeviceInfo:
    key: str  # "cpu" or "cuda:N": the queueing key, one run per key at a time
    kind: str  # "cpu" | "cuda"
    name: str
    capability: str  # "sm90" for CUDA; best CPU ISA (e.g. "AVX2", "AVX512_BF16") for CPUs
    memory_bytes: int | None
    driver_version: str | None = None
    cuda_version: str | None = None
    compute_capability: tuple[int, int] | None = None
    cpu_flags: frozenset[str] = field(default_factory=frozenset, repr=False)
    torch_usable: bool = True  # False: NVML sees the GPU but this PyTorch build cannot use it

    @property
    def modes(self) -> dict[str, ModeSupport]:
        return {mode: mode_support(self, Precision(mode)) for mode in choices(Precision)}

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "name": self.name,
            "kind": self.kind,
            "capability": self.capability,
            "memory_bytes": self.memory_bytes,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "modes": {mode: support.to_dict() for mode, support in self.modes.items()},
        }


# ---------------------------------------------------------------------------------------
# CPU


def read_cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> frozenset[str]:
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def read_cpu_name(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    # not platform.processor(): on Linux it starts `uname -p`, which mostly says "unknown"
    return platform.machine() or "CPU"


def cpu_isa_label(flags: frozenset[str]) -> str:
    """The most capable matrix-relevant ISA the flags show, in oneDNN's vocabulary."""
    if "amx_bf16" in flags or "amx_fp16" in flags:
        return "AVX512_CORE_AMX" + ("_FP16" if "amx_fp16" in flags else "")
    if "avx512_fp16" in flags:
        return "AVX512_CORE_FP16"
    if "avx512_bf16" in flags:
        return "AVX512_CORE_BF16"
    if "avx512f" in flags:
        return "AVX512_CORE"
    if "avx2" in flags:
        return "AVX2"
    if "asimd" in flags:
        return "NEON"
    return "baseline"


def cpu_device(flags: frozenset[str] | None = None, name: str | None = None) -> DeviceInfo:
    flags = read_cpu_flags() if flags is None else flags
    try:
        import psutil

        memory_bytes = int(psutil.virtual_memory().total)
    except Exception:  # psutil missing or restricted: memory is informational only
        memory_bytes = None
    return DeviceInfo(key="cpu", kind="cpu", name=name or read_cpu_name(),
                      capability=cpu_isa_label(flags), memory_bytes=memory_bytes,
                      cpu_flags=flags)


def _cpu_mode_support(dev: DeviceInfo, mode: Precision) -> ModeSupport:
    """From the one CPU decision (engine.hardware.cpu_units), so every surface agrees."""
    unit = cpu_matrix_unit(dev.cpu_flags, COMPUTE_DTYPES[Precision(mode)])
    return ModeSupport(unit.status, unit.words)


# ---------------------------------------------------------------------------------------
# CUDA


def _cuda_mode_support(dev: DeviceInfo, mode: Precision) -> ModeSupport:
    if not dev.torch_usable:
        return ModeSupport(UNSUPPORTED, "this PyTorch build has no CUDA support; install a "
                                        "CUDA build of torch to use this GPU")
    cc = dev.compute_capability or (0, 0)
    sm = f"sm{cc[0]}{cc[1]}"
    who = f"{dev.name} ({sm}, {arch_name(cc)})"
    if mode == Precision.FP32:
        return ModeSupport(NATIVE, f"fp32 on CUDA cores of {who}; TF32 disabled")
    if mode == Precision.TF32:
        if cc >= (8, 0):
            return ModeSupport(NATIVE, f"{who} has TF32 Tensor Cores")
        return ModeSupport(UNSUPPORTED, f"{who} has no TF32 Tensor Cores: TF32 needs sm80+ "
                                        "(Ampere or newer). Use fp32 or fp16-amp.")
    if mode == Precision.FP16_AMP:
        if cc >= (7, 0):
            return ModeSupport(NATIVE, f"{who} has fp16 Tensor Cores")
        return ModeSupport(EMULATED, f"{who} has no Tensor Cores: fp16 runs on CUDA cores, "
                                     "little or no speed-up over fp32")
    if mode in (Precision.BF16_AMP, Precision.BF16_PURE):
        if cc >= (8, 0):
            return ModeSupport(NATIVE, f"{who} has bf16 Tensor Cores")
        if cc >= (7, 0):
            return ModeSupport(EMULATED, f"{who} has fp16 Tensor Cores but no bf16: bf16 is "
                                         "emulated (slow); use fp16-amp on this GPU")
        return ModeSupport(EMULATED, f"{who} has no Tensor Cores and no bf16 units: bf16 is "
                                     "emulated (slow)")
    # fp8
    if cc < (8, 9):
        return ModeSupport(UNSUPPORTED, f"{who} cannot run fp8 matmuls: torch._scaled_mm "
                                        "needs sm89+ (Ada, Hopper, Blackwell)")
    if not _torchao_available():
        return ModeSupport(UNSUPPORTED, f"{who} supports fp8, but the optional package "
                                        "torchao is not installed (pip install torchao)")
    return ModeSupport(NATIVE, f"{who} has fp8 Tensor Cores (e4m3/e5m2)")


@functools.lru_cache(maxsize=1)
def torch_build() -> tuple[str, str | None]:
    """(torch version, CUDA version of the build or None for a CPU-only build), read from
    torch's generated version.py without importing torch (a long-lived process such as
    the Streamlit server must not load it just to say which build is installed)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("torch")  # locates the package; does not run it
    folder = os.path.dirname(spec.origin) if spec and spec.origin else None
    try:
        with open(os.path.join(folder, "version.py"), encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, TypeError):
        return "not installed", None
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return (version.group(1) if version else "unknown"), (cuda.group(1) if cuda else None)


@functools.lru_cache(maxsize=1)
def _torchao_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchao") is not None


def _nvml_devices() -> list[DeviceInfo]:
    """GPUs as NVML sees them; [] when there is no driver. Each query wrapped on its own."""
    with nvml_library() as (pynvml, _reason):
        if pynvml is None:
            return []
        driver = nvml_call(pynvml.nvmlSystemGetDriverVersion)
        cuda_driver = nvml_call(pynvml.nvmlSystemGetCudaDriverVersion)
        cuda_version = (f"{cuda_driver // 1000}.{(cuda_driver % 1000) // 10}"
                        if isinstance(cuda_driver, int) else None)
        count = nvml_call(pynvml.nvmlDeviceGetCount) or 0
        return [dev for dev in (_nvml_device(pynvml, index, driver, cuda_version)
                                for index in range(count)) if dev is not None]


def _nvml_device(pynvml, index: int, driver, cuda_version: str | None) -> DeviceInfo | None:
    handle = nvml_call(pynvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return None
    name = nvml_call(pynvml.nvmlDeviceGetName, handle) or f"GPU {index}"
    cc = nvml_call(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    mem = nvml_call(pynvml.nvmlDeviceGetMemoryInfo, handle)
    cc_tuple = tuple(cc) if cc else None
    return DeviceInfo(
        key=f"cuda:{index}", kind="cuda",
        name=name.decode() if isinstance(name, bytes) else str(name),
        capability=f"sm{cc_tuple[0]}{cc_tuple[1]}" if cc_tuple else "unknown",
        memory_bytes=int(mem.total) if mem is not None else None,
        driver_version=driver.decode() if isinstance(driver, bytes) else driver,
        cuda_version=cuda_version, compute_capability=cc_tuple)  # type: ignore[arg-type]


def _torch_cuda_devices() -> list[DeviceInfo]:
    import torch

    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        cc = (props.major, props.minor)
        devices.append(DeviceInfo(
            key=f"cuda:{index}", kind="cuda", name=props.name, capability=f"sm{cc[0]}{cc[1]}",
            memory_bytes=int(props.total_memory), cuda_version=torch.version.cuda,
            compute_capability=cc))
    return devices


@functools.lru_cache(maxsize=1)
def list_devices() -> tuple[DeviceInfo, ...]:
    """CPU first, then every CUDA GPU. Cached: hardware does not change under a process."""
    gpus = _nvml_devices()
    if gpus:
        torch_cuda_count = _torch_cuda_count()
        gpus = [gpu if index < torch_cuda_count else _replace(gpu, torch_usable=False)
                for index, gpu in enumerate(gpus)]
    elif not _nvml_importable():
        # No NVML bindings to ask: let torch look (this imports it).
        gpus = _torch_cuda_devices()
    # NVML present but no GPU: no driver, so no CUDA device either; torch is not imported.
    return (_cpu_device_cached(), *gpus)


@functools.lru_cache(maxsize=1)
def _cpu_device_cached() -> DeviceInfo:
    return cpu_device()


def _nvml_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("pynvml") is not None


def _torch_cuda_count() -> int:
    # Ask via NVML inside torch so the check itself does not create a CUDA context.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _replace(dev: DeviceInfo, **changes) -> DeviceInfo:
    import dataclasses

    return dataclasses.replace(dev, **changes)


def mode_support(dev: DeviceInfo, mode: Precision) -> ModeSupport:
    if dev.kind == "cpu":
        return _cpu_mode_support(dev, mode)
    return _cuda_mode_support(dev, mode)


def get_device(key: str) -> DeviceInfo:
    if key == "cpu":  # no GPU discovery (and no torch import) for a CPU run
        return _cpu_device_cached()
    for dev in list_devices():
        if dev.key == key:
            return dev
    raise KeyError(key)


def resolve_device_key(spec: str) -> str:
    """'auto' -> 'cuda:0' when a usable GPU exists, else 'cpu'; 'cuda' -> 'cuda:0'."""
    if spec == "cpu":
        return "cpu"
    devices = list_devices()
    usable_gpus = [d for d in devices if d.kind == "cuda" and d.torch_usable]
    if spec == "auto":
        return usable_gpus[0].key if usable_gpus else "cpu"
    key = "cuda:0" if spec == "cuda" else spec
    if not any(d.key == key for d in usable_gpus):
        found = ", ".join(d.key for d in usable_gpus) or "none"
        raise ConfigError("device", spec, f"no usable CUDA device {key} here (usable GPUs: "
                                          f"{found}); use --device cpu or auto")
    return key
