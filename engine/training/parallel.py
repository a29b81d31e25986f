"""The torch side of a multi-process run: the process group, DDP or FSDP2 around the
model with the chosen gradient-communication dtype, and the one collective per log
boundary. A rank's life (started by torchrun) is engine.run.rank.

Backends: NCCL on CUDA (one GPU per rank), gloo on a CPU. Only rank 0 profiles; its
trace holds the collectives: NCCL kernels (ncclDevKernel_AllReduce_...), which the Kernels
page counts as "communication", or on a CPU gloo's CPU ops (gloo:all_reduce), visible in
the trace download (the CPU evidence is oneDNN's primitive log, which has no collectives).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.admission import cuda_device_keys, fsdp2_dtypes
from engine.config import CommHook, RunConfig, Sharding
from engine.hardware.dtypes import torch_dtype


@dataclass
class ParallelContext:
    """This process's place in the run: rank, world size, its device, the backend."""
    cfg: RunConfig
    rank: int
    local_rank: int
    world_size: int
    device_key: str
    backend: str

    @classmethod
    def start(cls, cfg: RunConfig, run_device_key: str) -> "ParallelContext":
        """Join the process group torchrun set up (RANK, WORLD_SIZE, MASTER_* in env)."""
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        world_size = int(os.environ["WORLD_SIZE"])
        if run_device_key.startswith("cuda"):
            device_key = cuda_device_keys(run_device_key, world_size)[local_rank]
            torch.cuda.set_device(torch.device(device_key))
            dist.init_process_group("nccl", device_id=torch.device(device_key))
            backend = "nccl"
        else:
            device_key, backend = "cpu", "gloo"
            dist.init_process_group("gloo")
        return cls(cfg, rank, local_rank, world_size, device_key, backend)

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.cfg.sharding == Sharding.FSDP2.value:
            return _fully_shard(model, self.cfg)
        return _ddp(model, self.cfg, self.device_key)

    def reduce_log_values(self, loss_value: float, stop_requested: bool) -> tuple[float, bool]:
        """(mean loss over ranks, any rank asked to stop): one all-reduce of two numbers.

        Called at log boundaries only, which are host syncs already (the loss was read),
        so it adds no sync of its own.
        """
        device = torch.device(self.device_key)
        values = torch.tensor([loss_value, 1.0 if stop_requested else 0.0],
                              dtype=torch.float64, device=device)
        dist.all_reduce(values)
        loss_sum, stops = values.tolist()
        return loss_sum / self.world_size, stops > 0

    def describe(self) -> dict[str, Any]:
        """What the summary and the UI show about the run's processes."""
        info = {"nprocs": self.world_size, "sharding": self.cfg.sharding,
                "comm_hook": self.cfg.comm_hook, "backend": self.backend}
        if self.cfg.sharding == Sharding.FSDP2.value:
            param, reduce = fsdp2_dtypes(self.cfg.precision, self.cfg.comm_hook)
            info["fsdp2_param_dtype"], info["fsdp2_reduce_dtype"] = param, reduce
        return info

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _ddp(model: nn.Module, cfg: RunConfig, device_key: str) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [torch.device(device_key).index] if device_key.startswith("cuda") else None
    ddp = DistributedDataParallel(model, device_ids=device_ids)
    if cfg.comm_hook != CommHook.NONE.value:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        # The hooks cast each gradient bucket to 16 bits for the all-reduce and back:
        # half the bytes on the wire, fp16's range or bf16's precision on the gradients.
        hook = {CommHook.FP16.value: default_hooks.fp16_compress_hook,
                CommHook.BF16.value: default_hooks.bf16_compress_hook}[cfg.comm_hook]
        ddp.register_comm_hook(dist.group.WORLD, hook)
    return ddp


def _fully_shard(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """FSDP2: each transformer/residual block its own unit (all-gathered just in time),
    then the root for what is left (embeddings, head). Innermost units first."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    param, reduce = fsdp2_dtypes(cfg.precision, cfg.comm_hook)
    policy = MixedPrecisionPolicy(param_dtype=torch_dtype(param), reduce_dtype=torch_dtype(reduce))
    # BatchNorm keeps fp32 weights, as under autocast: its running statistics are fp32
    # buffers, and the kernels take a low-precision input but not mixed weight/statistics.
    keep_fp32 = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch_dtype(reduce))
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and param is not None:
            fully_shard(module, mp_policy=keep_fp32)
    for block in getattr(model, "blocks", ()):
        fully_shard(block, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)
