"""The torch side of a multi-process run: the process group, DDP or FSDP2 around the
model with the chosen gradient-communication dtype, the one collective per log boundary,
and the rank's life (`run_rank`, started by torchrun through engine.distributed).

Backends: NCCL on CUDA (one GPU per rank), gloo on a CPU. Only rank 0 profiles; its
trace holds the collectives: NCCL kernels (ncclDevKernel_AllReduce_...), which the Kernels
page counts as "communication", or on a CPU gloo's CPU ops (gloo:all_reduce), visible in
the trace download (the CPU evidence is oneDNN's primitive log, which has no collectives).
"""

from __future__ import annotations

import os
import signal
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .config import CommHook, RunConfig, Sharding
from .distributed import cuda_device_keys, fsdp2_dtypes, injected_fault, write_rank_error
from .store import DIVERGED, FINISHED, RUNNING, STOPPED, Store

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


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
    policy = MixedPrecisionPolicy(param_dtype=_DTYPES.get(param), reduce_dtype=_DTYPES.get(reduce))
    # BatchNorm keeps fp32 weights, as under autocast: its running statistics are fp32
    # buffers, and the kernels take a low-precision input but not mixed weight/statistics.
    keep_fp32 = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=_DTYPES.get(reduce))
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and param is not None:
            fully_shard(module, mp_policy=keep_fp32)
    for block in getattr(model, "blocks", ()):
        fully_shard(block, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)


# ---------------------------------------------------------------------------------------
# one rank's life


class _StopFlag:
    def __init__(self) -> None:
        self.requested = False

    def __call__(self, *_args) -> None:
        self.requested = True


def run_rank(run_id: str, store: Store, rank: int) -> int:
    """Train one rank. Rank 0 writes metrics, summary and the final status when the run
    ends as a whole (finished, stopped, diverged); a rank that fails writes its own error
    record and exits non-zero, and the supervisor sets the status from torchrun's report."""
    stop = _StopFlag()
    signal.signal(signal.SIGTERM, stop)  # torchrun forwards stop requests as SIGTERM
    signal.signal(signal.SIGINT, stop)
    run = store.get_run(run_id)
    if run.status != RUNNING:
        print(f"[rank{rank}] run {run_id} is {run.status}, not running; nothing to do", flush=True)
        return 0
    run_dir = store.run_dir(run_id)
    ctx = None
    step_box = {"step": None}
    try:
        ctx = ParallelContext.start(run.config, run.device_key)
        code = _train_rank(run, store, ctx, stop, step_box)
    except Exception as exc:  # noqa: BLE001 - recorded with the rank, then exit 1
        traceback.print_exc()
        status, reason = _failure_of(exc, run.config.batch_size)
        write_rank_error(run_dir, rank, status, reason, step_box["step"])
        # No destroy_process_group here: the peers may be gone and tearing the group down
        # could block; the process exits now anyway.
        return 1
    ctx.close()
    return code


def _train_rank(run, store: Store, ctx: ParallelContext, stop: _StopFlag, step_box: dict) -> int:
    from .run_analysis import window_handler
    from .run_stats import finalize_run_data
    from .telemetry import TelemetrySampler
    from .train import Diverged, train
    from .worker import MetricBuffer, device_peak

    cfg, run_id, lead = run.config, run.id, ctx.rank == 0
    print(f"[rank{ctx.rank}] run {run_id}: {ctx.world_size} ranks, {ctx.backend}, "
          f"{cfg.sharding}, comm {cfg.comm_hook}, on {ctx.device_key}", flush=True)
    buffer = MetricBuffer(store, run_id) if lead else None
    fault_step = injected_fault(ctx.rank)

    def emit(rows: list[dict]) -> None:
        step_box["step"] = rows[-1]["step"]
        if fault_step is not None and step_box["step"] >= fault_step:
            raise RuntimeError(f"injected fault on rank {ctx.rank}")
        if buffer is not None:  # rank 0 alone writes metrics: one row per logged step
            buffer(rows)

    on_window = window_handler(store, run_id, ctx.device_key)

    peak = device_peak(store, run_id, ctx.device_key, cfg) if lead else None
    if peak and ctx.device_key.startswith("cuda"):
        peak *= ctx.world_size  # one GPU per rank; CPU ranks share one CPU's peak
    sampler = TelemetrySampler(ctx.device_key, lambda rows: store.write_telemetry(
        run_id, rows, rank=ctx.rank)).start()
    try:
        result = train(cfg, ctx.device_key, emit=emit, should_stop=lambda: stop.requested,
                       run_dir=store.run_dir(run_id) if lead else None,
                       on_window=on_window if lead else None, peak_flops=peak, parallel=ctx)
    except Diverged as exc:  # the aggregated loss: every rank diverges at the same step
        if lead:
            buffer.close()
            finalize_run_data(store, run_id)
            store.set_status(run_id, DIVERGED, str(exc))
        return 0
    finally:
        sampler.stop()
        if buffer is not None:
            buffer.close()
    if lead:
        _record_result(store, run_id, result, ctx, peak)
    return 0


def _record_result(store: Store, run_id: str, result, ctx: ParallelContext,
                   peak: float | None) -> None:
    """Rank 0, once every rank has left the loop: summary, overview, final status."""
    from .run_stats import finalize_run_data, result_summary

    summary = result_summary(result, peak)
    summary["parallel"] = ctx.describe()
    store.merge_summary(run_id, summary)
    finalize_run_data(store, run_id)
    store.set_status(run_id, STOPPED if result.status == "stopped" else FINISHED, result.reason)
    print(f"[rank0] run {run_id}: {result.status} after {result.steps_completed} steps", flush=True)


def _failure_of(exc: BaseException, batch_size: int) -> tuple[str, str]:
    """(status, reason) a failed rank reports: out-of-memory errors become "oom"."""
    from .store import FAILED, OOM

    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text.lower() \
            or "can't allocate memory" in text:
        return OOM, (f"out of memory at batch size {batch_size} per rank: "
                     f"{text.splitlines()[0][:300]}")
    return FAILED, text.splitlines()[0][:1000]
