"""Can this config run here? The one place that decides, for every way a run starts
(Launch page, CLI, presets, sweeps, Ray tasks on their node):

- the precision mode against the device (native, emulated with a warning, or refused),
  from engine.hardware.devices' evidence (ISA flags, compute capability);
- multi-process limits: processes per CPU, one GPU per rank from the run's device up;
- torch's own rule for DDP's bf16 gradient hook (a CUDA build with NCCL 2.10+);
- FSDP2's MixedPrecisionPolicy dtypes for a precision mode.

A refusal is a ConfigError naming the field, the value and the fix. No torch import at
module level: only the bf16-hook question asks torch, and only when that choice is made.
"""

from __future__ import annotations

import os
from typing import Callable

from engine.architectures import missing_extra
from engine.config import CommHook, ConfigError, Precision, RunConfig, Sharding
from engine.hardware.devices import (
    EMULATED,
    UNSUPPORTED,
    DeviceInfo,
    get_device,
    list_devices,
    mode_support,
    resolve_device_key,
)
from engine.support import torch_support

MAX_CPU_PROCS = 8  # each CPU process trains a whole replica on shared cores


def check_runnable(cfg: RunConfig) -> tuple[DeviceInfo, list[str]]:
    """Refuse a config the resolved device cannot run; return the device and warnings."""
    torch = torch_support()
    if not torch.ok:
        raise ConfigError("torch", torch.version or "not installed", torch.problem)
    problem = missing_extra(cfg.model.value)  # a known architecture whose library is absent
    if problem:
        raise ConfigError("model", cfg.model, problem)
    dev = get_device(resolve_device_key(cfg.device))
    warnings = [torch.warning] if torch.warning else []
    # A speedup check trains every one of its modes: each must run here.
    field = "speedup_modes" if cfg.is_speedup_check else "precision"
    for mode in dict.fromkeys(cfg.speedup_mode_list or [cfg.precision]):
        support = mode_support(dev, mode)
        if support.status == UNSUPPORTED:
            runnable = [m for m, s in dev.modes.items() if s.status != UNSUPPORTED]
            raise ConfigError(field, mode,
                              f"not supported on {dev.name}: {support.reason} "
                              f"(runnable here: {', '.join(runnable)})")
        if support.status == EMULATED:
            warnings.append(f"{mode} on {dev.name} is emulated: {support.reason}")
    if cfg.unused_loader_options:
        warnings.append(f"{', '.join(cfg.unused_loader_options)} unused: DataLoader options "
                        "apply to data loader with workers (set data loader, num_workers >= 1)")
    if cfg.memory_cap_mb and dev.kind != "cpu":
        warnings.append("memory_cap_mb applies to CPU runs only; ignored on CUDA")
    if cfg.memory_cap_mb and cfg.nprocs > 1:
        warnings.append(f"memory_cap_mb={cfg.memory_cap_mb} applies to each of the "
                        f"{cfg.nprocs} processes")
    warnings += _check_parallel(cfg, dev)
    return dev, warnings


def _check_parallel(cfg: RunConfig, dev: DeviceInfo) -> list[str]:
    """nprocs, sharding and comm_hook against this machine."""
    if cfg.nprocs == 1:
        return []
    usable_gpus = ([d.key for d in list_devices() if d.kind == "cuda" and d.torch_usable]
                   if dev.kind == "cuda" else [])  # a CPU run needs no GPU discovery
    return check_parallel(cfg, dev, usable_gpus, os.cpu_count())




def cpu_proc_limit(cpu_count: int | None) -> int:
    """Processes a CPU run may ask for: they share the cores, so a few per core at most."""
    return max(2, min(MAX_CPU_PROCS, 2 * (cpu_count or 1)))


def cuda_device_keys(first_key: str, nprocs: int) -> list[str]:
    """The GPUs of an N-process CUDA run: one per rank, from the run's device upwards."""
    _, _, index = first_key.partition(":")
    first = int(index or 0)
    return [f"cuda:{first + offset}" for offset in range(nprocs)]


def max_procs_for(dev: DeviceInfo, usable_gpu_keys: list[str], cpu_count: int | None) -> int:
    """The most processes a run on `dev` may ask for: the CPU's limit, or the usable GPUs
    from the run's device upwards (one GPU per rank)."""
    if dev.kind == "cpu":
        return cpu_proc_limit(cpu_count)
    count = 0
    for key in cuda_device_keys(dev.key, len(usable_gpu_keys)):
        if key not in usable_gpu_keys:
            break
        count += 1
    return max(1, count)


def bf16_hook_problem_for(cuda_build: bool, nccl_version: tuple[int, ...] | None,
                          torch_version: str) -> str | None:
    """Why DDP would refuse bf16_compress_hook, or None. The rule is torch's own
    (DistributedDataParallel._check_comm_hook): a CUDA build with NCCL 2.10+. It is
    about the build, not the backend: a CUDA build runs the hook over gloo too."""
    if cuda_build and nccl_version is not None and tuple(nccl_version) >= (2, 10):
        return None
    return (f"DDP's bf16_compress_hook needs a CUDA build of PyTorch with NCCL 2.10+ (torch "
            f"refuses it otherwise, even over gloo); this PyTorch is {torch_version}")


def bf16_comm_hook_problem() -> str | None:
    """bf16_hook_problem_for this PyTorch (imports torch: only asked for that choice)."""
    import torch
    import torch.distributed as dist

    cuda_build = torch.version.cuda is not None or torch.version.hip is not None
    nccl = None
    if cuda_build and dist.is_available() and dist.is_nccl_available():
        try:
            nccl = tuple(torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - no usable NCCL library: the hook is refused
            nccl = None
    return bf16_hook_problem_for(cuda_build, nccl, torch.__version__)


def check_parallel(cfg: RunConfig, dev: DeviceInfo, usable_gpu_keys: list[str],
                   cpu_count: int | None,
                   bf16_problem: Callable[[], str | None] = bf16_comm_hook_problem) -> list[str]:
    """Refuse (ConfigError) a multi-process config this machine cannot run; warnings else.

    The queue is one run per device key: an N-process CUDA run claims the N GPUs
    cuda:K..cuda:K+N-1 (store.claim_device), a CPU run the one "cpu" key like any run.
    """
    if cfg.nprocs == 1:
        return []
    warnings = []
    if dev.kind == "cpu":
        limit = cpu_proc_limit(cpu_count)
        if cfg.nprocs > limit:
            raise ConfigError("nprocs", cfg.nprocs,
                              f"at most {limit} processes on this CPU ({cpu_count} cores; "
                              f"each process trains a whole model replica); use nprocs "
                              f"2..{limit}")
        warnings.append(f"{cfg.nprocs} processes share this CPU's {cpu_count} cores: the run "
                        "shows DDP/FSDP2 and gloo at work, not a speed-up")
    else:
        wanted = cuda_device_keys(dev.key, cfg.nprocs)
        missing = [key for key in wanted if key not in usable_gpu_keys]
        if missing:
            raise ConfigError("nprocs", cfg.nprocs,
                              f"one process per GPU: from {dev.key} that needs {wanted[0]}.."
                              f"{wanted[-1]}, but {', '.join(missing)} is not a usable GPU here "
                              f"(usable: {', '.join(usable_gpu_keys) or 'none'}); use nprocs "
                              f"<= {max_procs_for(dev, usable_gpu_keys, cpu_count)} or an "
                              "earlier device")
    if cfg.comm_hook == CommHook.BF16.value and cfg.sharding == Sharding.DDP.value:
        problem = bf16_problem()
        if problem:
            raise ConfigError("comm_hook", cfg.comm_hook,
                              f"{problem}; use comm_hook fp16, or sharding fsdp2 (its bf16 "
                              "reduce_dtype works over gloo too)")
    return warnings


def fsdp2_dtypes(precision: str, comm_hook: str) -> tuple[str | None, str | None]:
    """(param_dtype, reduce_dtype) of FSDP2's MixedPrecisionPolicy, as dtype names.

    param_dtype: what the all-gathered parameters compute in (the mode's compute dtype;
    None keeps the stored dtype: fp32, or bf16 for bf16-pure). reduce_dtype: what
    gradients are reduce-scattered in: the comm_hook choice, else fp32 (the safe default,
    as in torchtitan), or bf16 for bf16-pure whose gradients are bf16 already.
    """
    mode = Precision(precision)
    if mode == Precision.FP8:
        raise ConfigError("sharding", Sharding.FSDP2.value, "fp8 runs with ddp only; use "
                          "sharding ddp")
    param = {Precision.FP16_AMP: "fp16", Precision.BF16_AMP: "bf16"}.get(mode)
    if comm_hook != CommHook.NONE.value:
        return param, comm_hook
    return param, None if mode == Precision.BF16_PURE else "fp32"
