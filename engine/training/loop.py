"""The one training loop: steps, timing, metrics, loss-scaler stats, NaN guard and the
profiler window. The worker, the CLI's `run` and the benchmarks all call `train()`.

Host-device syncs happen only at log boundaries (every `log_interval` steps, and once
where the phase changes: warm-up -> profiler window -> steady): losses,
gradient norms and skipped-step counts stay on the device in between.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F

from engine.architectures import ARCHITECTURES, is_token_model
from engine.config import ModelName, OptimizerName, RunConfig
from engine.hardware.telemetry import gpm_tensor_util
from engine.schema import (
    NUMERICS,
    NUMERICS_FILENAME,
    ONEDNN_LOG_FILENAME,
    PROFILE,
    RANK_TRACE_PATTERN,
    STEADY,
    TRACE_FILENAME,
    WARMUP,
)
from engine.training.input_pipeline import (
    BatchSource,
    FunctionSource,
    LoaderSource,
    SyntheticSource,
    builtin_source,
)
from engine.training.memory import TensorPeakProbe, run_memory_figures
from engine.training.models import build_model, model_spec, parameter_count
from engine.training.numerics import NumericsProbe, default_sample_steps
from engine.training.onednn import capture_onednn_verbose
from engine.training.precision import PrecisionPlan, cast_inputs, make_plan, prepare_model
from engine.training.skip_ledger import SkipLedger
from engine.training.step_meter import StepMeter, memory_snapshot
from engine.training.workload import WorkloadError, is_dataset, load_workload, one_line
from engine.workloads import workload_label

if TYPE_CHECKING:  # the multi-process side imports torch.distributed; single runs never do
    from engine.training.parallel import ParallelContext



GRAD_NORM_EVERY = 10  # steps between logged gradient norms (see train())


class Diverged(RuntimeError):
    def __init__(self, step: int, message: str):
        super().__init__(message)
        self.step = step


@dataclass
class TrainResult:
    status: str  # finished | diverged | stopped
    reason: str | None
    steps_completed: int
    first_loss: float | None
    final_loss: float | None
    # steady-state steps only (no warm-up, no profiler window); all ranks together
    samples_per_s: float | None
    tokens_per_s: float | None
    step_time_ms: float | None
    peak_mem_bytes: int | None
    loss_scale_final: float | None
    skipped_steps: int
    flops_per_step: float | None  # all ranks together in a multi-process run
    flops_method: str | None
    achieved_tflops: float | None
    param_count: int
    trace_path: str | None = None
    # steady steps: mean wait for the next batch and host-to-device copy per step (ms),
    # and the wait's share of the step time
    data_wait_ms: float | None = None
    h2d_copy_ms: float | None = None
    data_wait_share: float | None = None
    # fp16-amp: the GradScaler's skipped steps, each with where it overflowed (skip_ledger)
    skip_ledger: dict[str, Any] | None = None
    # engine.training.memory: the two peaks, by name, and the tensor peak's split
    tensor_peak_bytes: int | None = None
    process_peak_bytes: int | None = None
    memory_by_kind: dict[str, Any] | None = None
    tensor_peak_note: str | None = None  # why the tensor peak was not measured
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def phase_of(step: int, cfg: RunConfig) -> str:
    """warmup for the first steps, profile for the profiler window, steady otherwise.

    The window is one evidence step (CUDA: the profiler's own warm-up; CPU: oneDNN verbose
    on, not traced) plus `profile_steps` traced steps, right after the warm-up; those steps
    are slower and are kept out of steady-state averages.
    """
    if step <= cfg.warmup_steps:
        return WARMUP
    window_start = cfg.warmup_steps + 1
    if cfg.profile and window_start <= step < window_start + cfg.profile_steps + 1:
        return PROFILE
    return STEADY


def lr_at(step: int, cfg: RunConfig) -> float:
    # Linear warm-up then constant: short runs should not spend themselves on a schedule.
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / (cfg.warmup_steps + 1)
    return cfg.lr


def resolve_torch_device(device_key: str) -> torch.device:
    device = torch.device(device_key)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def build_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    if cfg.optimizer == OptimizerName.SGD.value:
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def compute_loss(cfg: RunConfig, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in fp32 whatever the mode (autocast would too, and bf16-pure logits
    summed in bf16 lose the small differences the optimizer needs). Sequence models'
    (batch, seq, vocab) logits: over every position; targets of -100 (BERT's unmasked
    positions) are ignored."""
    logits = logits.float()
    if logits.dim() == 3:  # (batch, seq, vocab)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return F.cross_entropy(logits, targets)


class Trainer:
    """Holds the model, optimizer and precision plan for one run (or one rank of it)."""

    def __init__(self, cfg: RunConfig, device: torch.device,
                 parallel: "ParallelContext | None" = None, ledger: bool = True):
        self.cfg = cfg
        self.device = device
        # Same seed on every rank: identical initial weights (FSDP2 shards them as they are).
        torch.manual_seed(cfg.seed)
        self.plan: PrecisionPlan = make_plan(cfg, device)
        rank = parallel.rank if parallel is not None else 0
        self.workload = load_workload(cfg) if cfg.model == ModelName.CUSTOM.value else None
        built = self.workload.model if self.workload else build_model(cfg)
        model = prepare_model(built, self.plan, device, cfg.channels_last)
        self.param_count = parameter_count(model)
        self.module = model  # unwrapped: what the numerics probe hooks into
        # DDP / FSDP2 go around the model before the optimizer sees its parameters
        # (fully_shard turns them into sharded DTensors) and before torch.compile.
        wrapped = parallel.wrap(model) if parallel is not None else model
        self.model = torch.compile(wrapped) if cfg.compile else wrapped
        self.params = [p for p in wrapped.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(cfg, self.params)
        self.loss_fn = (self.workload.loss if self.workload and self.workload.loss
                        else lambda outputs, targets: compute_loss(cfg, outputs, targets))
        # Each rank its own batches; with a DataLoader the workers start loading now.
        self.batches: BatchSource = (self._workload_source() if self.workload
                                     else builtin_source(cfg, device, stream=rank))
        # what SyntheticTask-based callers read (None for a DataLoader or a workload)
        self.task = self.batches.task if isinstance(self.batches, SyntheticSource) else None
        # Global: every rank trains batch_size samples per step.
        self.samples_per_step = cfg.batch_size * (parallel.world_size if parallel else 1)
        self.tokens_per_sample = (self.workload.tokens_per_sample if self.workload
                                  else cfg.seq_len if is_token_model(cfg.model) else None)
        self.probe: NumericsProbe | None = None
        # fp16-amp: which layer overflowed, for every step the GradScaler skipped (off in
        # the speedup check: its per-layer pass would land inside a timed block)
        self.ledger = (SkipLedger(self.module) if ledger and self.plan.scaler is not None
                       else None)
        # A batch fetched ahead of its step (the FLOP count's): (step, inputs, targets),
        # handed to that step so no batch is drawn twice or skipped.
        self._pending_batch: tuple[int, Any, Any] | None = None

    def _workload_source(self) -> BatchSource:
        source = self.workload.batches
        if is_dataset(source):
            return LoaderSource(source, self.cfg, self.device, self.cfg.channels_last)
        if self.cfg.data == "loader":
            raise WorkloadError(
                f"workload {workload_label(self.cfg.workload)}: data loader needs a "
                "torch.utils.data.Dataset as Workload.batches, and this one "
                "is a function; return a Dataset, or use data synthetic"
            )
        return FunctionSource(source, self.device)

    def close(self) -> None:
        """End the batch source's DataLoader workers (train() calls it on every path)."""
        self.batches.close()

    def _batch(self, step: int) -> tuple[Any, Any]:
        pending, self._pending_batch = self._pending_batch, None
        if pending is not None and pending[0] == step:
            return pending[1], pending[2]
        return self.batches.next(step)

    def forward_backward_untrained(self, step: int) -> None:
        """One forward and backward on step `step`'s batch that changes nothing the run
        keeps: no optimizer step, no GradScaler update, gradients cleared, BatchNorm
        running statistics and the random generators restored; the batch is kept for
        that step. What the FLOP count runs: the first update is the run's step 1."""
        inputs, targets = self._pending_batch[1:] if (
            self._pending_batch and self._pending_batch[0] == step) else self.batches.next(step)
        self._pending_batch = (step, inputs, targets)
        buffers = {name: buffer.detach().clone() for name, buffer in self.module.named_buffers()}
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        try:
            with self.plan.autocast():
                if isinstance(inputs, (tuple, list)):
                    logits = self.model(*(_cast(x, self.plan) for x in inputs))
                else:
                    logits = self.model(_cast(inputs, self.plan))
            self.loss_fn(logits, targets).backward()
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for name, buffer in self.module.named_buffers():
                    if name in buffers:
                        buffer.copy_(buffers[name])
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng, self.device)

    def step(self, step: int, want_grad_norm: bool = True
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One optimizer step. Returns (loss, grad_norm) as device tensors: no sync here.

        The gradient norm costs a reduction over every gradient; it is computed when it is
        logged, and on every step under a GradScaler (a non-finite norm = a skipped step).
        """
        lr = lr_at(step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = self._batch(step)
        scaler = self.plan.scaler
        probe = self.probe if self.probe is not None and self.probe.wants(step) else None
        if probe is not None:  # sampled steps only: get_scale() is a host sync
            probe.begin_step(step, loss_scale=float(scaler.get_scale()) if scaler else 1.0)
        with self.plan.autocast():
            if isinstance(inputs, (tuple, list)):  # a workload's several model arguments
                logits = self.model(*(_cast(x, self.plan) for x in inputs))
            else:
                logits = self.model(_cast(inputs, self.plan))
        loss = self.loss_fn(logits, targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(self.optimizer)  # so the logged gradient norm is the real one
        else:
            loss.backward()
        if probe is not None:
            probe.capture_gradients(step, self.module)  # after unscale_: the true gradients
        grad_norm = None
        if want_grad_norm or scaler is not None:
            grads = [p.grad for p in self.params if p.grad is not None]
            grad_norm = (torch.nn.utils.get_total_norm(grads) if grads
                         else torch.zeros((), device=self.device))
            if hasattr(grad_norm, "full_tensor"):
                # FSDP2: the norm of sharded gradients is a DTensor; materialising it is a
                # collective, reached by every rank because each computes it on the same steps.
                grad_norm = grad_norm.full_tensor()
        if scaler is not None:
            entry = None
            # scaler.step reads its found-inf flag here anyway (a host sync on CUDA)
            if self.ledger is not None and not bool(torch.isfinite(grad_norm)):
                entry = self.ledger.before_step(step, float(scaler.get_scale()), loss)
            scaler.step(self.optimizer)  # skipped internally when grads hold inf/NaN
            scaler.update()
            if entry is not None:
                self.ledger.after_step(entry, float(scaler.get_scale()))
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach(), None if grad_norm is None else grad_norm.detach()


def _cast(value: Any, plan: PrecisionPlan) -> Any:
    return cast_inputs(value, plan) if isinstance(value, torch.Tensor) else value


def measure_flops_per_step(trainer: Trainer) -> float | None:
    """FLOPs of one forward+backward, counted by torch.utils.flop_counter on the real model
    with step 1's batch. Nothing is trained: no optimizer step, no GradScaler update (a
    scaler series matches PyTorch's own), the batch is step 1's. None when the counter
    cannot run (e.g. some compiled graphs)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        counter = FlopCounterMode(display=False)
        with counter:
            trainer.forward_backward_untrained(1)
        return float(counter.get_total_flops()) or None
    except Exception:  # the count is informative; a failure must not stop a run
        trainer.optimizer.zero_grad(set_to_none=True)
        return None


class ProfilerWindow:
    """torch.profiler around the PROFILE steps; trace written gzip'd to the run dir. On a
    CPU the window's first step runs with oneDNN verbose on, fd 1 sent to its log.

    A context manager: leaving it, however the loop ended (a step that raised inside the
    window included), puts fd 1 back (the worker log, where the run's traceback is written
    next) and stops a profiler still recording (its partial trace is not written)."""

    def __init__(self, cfg: RunConfig, device: torch.device, run_dir: Path | None,
                 trace_name: str = TRACE_FILENAME, evidence: bool = True):
        """`trace_name`/`evidence`: a rank other than 0 writes its own trace file and no
        oneDNN verbose log or GPM sample (rank 0's evidence stands for the run)."""
        self.enabled = cfg.profile and run_dir is not None
        self.device = device
        self.run_dir = run_dir
        self.trace_name, self.evidence = trace_name, evidence
        self.prof = None
        self.stack: contextlib.ExitStack | None = None
        self.trace_path: Path | None = None
        self.onednn_log_path: Path | None = None
        self.gpm_thread = None
        self.verbose: contextlib.ExitStack | None = None  # oneDNN verbose capture (CPU)
        # Why the window's trace or oneDNN log was dropped (a full disk): one line each,
        # for the run's summary; the run itself goes on.
        self.write_errors: list[str] = []
        self.gpm: tuple[float | None, str] = (
            (None, "not available: still sampling") if device.type == "cuda" else
            (None, "not available: NVML GPM tensor counters exist on NVIDIA Hopper+ GPUs only"))

    def __enter__(self) -> "ProfilerWindow":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(quiet=exc_type is not None)

    def close(self, quiet: bool = False) -> None:
        """End whatever of the window is still on: each part is ended even when another
        fails. `quiet`: an exception is on its way out, and a failure here must not take
        its place (it is the run's story)."""
        errors: list[Exception] = []
        for end in (self.close_verbose, self._stop_profiler):
            try:
                end()
            except Exception as exc:  # noqa: BLE001 - the next part still has to end
                errors.append(exc)
        if self.gpm_thread is not None:
            self.gpm_thread.join(timeout=5.0)
        if errors and not quiet:
            raise errors[0]

    def _stop_profiler(self) -> None:
        stack, self.stack, self.prof = self.stack, None, None
        if stack is not None:
            stack.close()

    def before_step(self, step: int, phase: str) -> None:
        if not (self.enabled and phase == PROFILE and self.prof is None
                and self.trace_path is None):
            return
        # runs/<id>/ deleted under a running trainer: write the window's files anyway.
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.device.type != "cuda" and self.onednn_log_path is None and self.evidence:
            # The CPU's evidence (which oneDNN implementation ran each primitive) comes from
            # the window's first step alone: verbose printing slows every primitive, and
            # inside the profiled steps it would inflate the very times the trace explains.
            self.onednn_log_path = self.run_dir / ONEDNN_LOG_FILENAME
            self.verbose = contextlib.ExitStack()
            self.verbose.enter_context(capture_onednn_verbose(self.onednn_log_path))
            return
        self.close_verbose()
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        self.stack = contextlib.ExitStack()
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
            if self.evidence:
                self._start_gpm_sampler()
        self.prof = self.stack.enter_context(
            profile(activities=activities, record_shapes=True))

    def close_verbose(self) -> None:
        """End the oneDNN verbose capture (stdout back to the worker log), if it is on."""
        if self.verbose is not None:
            self.verbose.close()
            self.verbose = None
            # oneDNN prints with C stdio, whose failed writes raise nothing: a disk with no
            # free block left means the log is cut short, and a cut log would read as
            # evidence of fewer primitives than ran.
            if self.onednn_log_path is not None and _disk_full(self.onednn_log_path.parent):
                self.onednn_log_path.unlink(missing_ok=True)
                self.onednn_log_path = None
                self.write_errors.append("the oneDNN log could not be written: "
                                         "the data directory's disk is full")

    def _start_gpm_sampler(self) -> None:
        """Counter-based confirmation on Hopper+: NVML GPM tensor-pipe activity, sampled in
        a thread while the window's steps run (name-based evidence only infers)."""
        import threading

        index = self.device.index or 0

        def sample() -> None:
            self.gpm = gpm_tensor_util(index, duration_s=0.5)

        self.gpm_thread = threading.Thread(target=sample, name="gpm-sampler", daemon=True)
        self.gpm_thread.start()

    def after_step(self, step: int, next_phase: str | None) -> bool:
        """Close the window after its last step; True when a trace was written now."""
        if next_phase != PROFILE:
            self.close_verbose()  # a window cut short after its evidence step
        if self.prof is None or next_phase == PROFILE:
            return False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        prof, self.prof = self.prof, None
        self.stack.close()
        if self.gpm_thread is not None:
            self.gpm_thread.join(timeout=5.0)
        plain = self.run_dir / (self.trace_name.removesuffix(".gz") + ".tmp")
        partial = self.run_dir / (self.trace_name + ".partial")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)  # deleted during the window
            # Kineto writes plain + ".tmp" and renames it; on a full disk it fails without
            # raising, and the missing file is the first sign (FileNotFoundError below).
            prof.export_chrome_trace(str(plain))
            # written whole, then renamed: a page reading the run's traces meanwhile never
            # sees half a file
            with open(plain, "rb") as src, gzip.open(partial, "wb", compresslevel=5) as dst:
                shutil.copyfileobj(src, dst)
            os.replace(partial, self.run_dir / self.trace_name)
            self.trace_path = self.run_dir / self.trace_name
        except OSError as exc:
            # The steps ran and their metrics are kept: only the trace is lost.
            reason = ("the data directory's disk is full" if _disk_full(self.run_dir)
                      or getattr(exc, "errno", None) == errno.ENOSPC
                      else f"{exc.strerror or exc}")
            self.write_errors.append(f"the trace could not be written: {reason}")
        finally:
            for leftover in (plain.with_name(plain.name + ".tmp"), plain, partial):
                with contextlib.suppress(OSError):
                    leftover.unlink()
        return True




def _disk_full(folder: Path) -> bool:
    """No block left for an unprivileged write under `folder` (statvfs)."""
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False


def train(cfg: RunConfig, device_key: str, emit: Callable[[list[dict[str, Any]]], None],
          should_stop: Callable[[], bool] = lambda: False, run_dir: Path | None = None,
          peak_flops: float | None = None,
          on_window: Callable[["ProfilerWindow", str], None] | None = None,
          parallel: "ParallelContext | None" = None,
          rank_trace_dir: Path | None = None) -> TrainResult:
    """Train `cfg` on `device_key`, calling `emit(rows)` at each log boundary.

    `peak_flops` (FLOP/s of the device at this precision) turns achieved FLOP/s into MFU;
    None leaves MFU empty rather than guessing. Raises torch.OutOfMemoryError / MemoryError
    on OOM; divergence and stop requests end the run with a status instead.

    With `parallel` (one rank of a multi-process run) the logged loss is the mean over the
    ranks, throughput and FLOPs count all ranks, and a stop request is honoured at a log
    boundary by every rank together. Pass run_dir=None on ranks other than 0 (rank 0 writes
    the run's files); with `rank_trace_dir` such a rank profiles the same window into its
    own trace file there (RANK_TRACE_PATTERN), for the per-rank view.
    """
    device = resolve_torch_device(device_key)
    trainer = _user_code(cfg, "setting up", lambda: Trainer(cfg, device, parallel))
    try:
        return _user_code(cfg, "training", lambda: _train(
            trainer, emit, should_stop, run_dir, peak_flops, on_window, parallel,
            rank_trace_dir))
    finally:
        trainer.close()  # DataLoader workers end with the run, whatever ended it


def _user_code(cfg: RunConfig, doing: str, work: Callable[[], Any]) -> Any:
    """Run `work`; for a custom workload, its failures become one-line WorkloadErrors
    (the user's traceback chained, for the run's log). OOM and divergence keep their type:
    the session records them as oom / diverged."""
    if cfg.model != ModelName.CUSTOM.value:
        return work()
    try:
        return work()
    except (WorkloadError, Diverged, torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as exc:
        if "out of memory" in str(exc).lower() or "can't allocate memory" in str(exc).lower():
            raise
        raise WorkloadError(
            f"workload {workload_label(cfg.workload)}: {doing} raised {one_line(exc)} "
            "(traceback in the run's log)"
        ) from exc


def _profiler(cfg: RunConfig, device: torch.device, run_dir: Path | None,
              parallel: "ParallelContext | None", rank_trace_dir: Path | None
              ) -> "ProfilerWindow":
    if run_dir is None and rank_trace_dir is not None and parallel is not None:
        return ProfilerWindow(cfg, device, rank_trace_dir, evidence=False,
                              trace_name=RANK_TRACE_PATTERN.format(rank=parallel.rank))
    return ProfilerWindow(cfg, device, run_dir)


def _train(trainer: Trainer, emit, should_stop, run_dir, peak_flops, on_window,
           parallel, rank_trace_dir=None) -> TrainResult:
    cfg, device = trainer.cfg, trainer.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    flops_per_step = measure_flops_per_step(trainer)
    if flops_per_step and parallel is not None:
        flops_per_step *= parallel.world_size  # every rank does the same work
    probe = None
    if cfg.numerics and run_dir is not None and not cfg.compile:
        # Registered after the FLOP count so step 1 is not sampled twice.
        probe = trainer.probe = NumericsProbe(default_sample_steps(cfg.steps)).register(
            trainer.module)
    meter = StepMeter(source=trainer.batches, scaler=trainer.plan.scaler, device=device,
                      samples_per_step=trainer.samples_per_step,
                      tokens_per_sample=trainer.tokens_per_sample,
                      flops_per_step=flops_per_step, peak_flops=peak_flops,
                      log_interval_steps=cfg.log_interval, total_steps=cfg.steps)
    # Left on any path (an exception in a window step included): stdout back to the worker
    # log, a profiler still recording stopped.
    tensor_peak = TensorPeakProbe(cfg.warmup_steps, device)
    with _profiler(cfg, device, run_dir, parallel, rank_trace_dir) as profiler:
        status, reason, step = _steps(trainer, meter, profiler, probe, emit, should_stop,
                                      run_dir, on_window, parallel, tensor_peak)
    return TrainResult(
        status=status, reason=reason, steps_completed=step, **meter.steady_figures(),
        peak_mem_bytes=memory_snapshot(device)["mem_peak_bytes"],
        flops_per_step=flops_per_step,
        flops_method="measured with torch.utils.flop_counter (matmul/conv/attention FLOPs)"
        if flops_per_step else None,
        param_count=trainer.param_count,
        trace_path=str(profiler.trace_path) if profiler.trace_path else None,
        skip_ledger=trainer.ledger.summary() if trainer.ledger is not None else None,
        extra={"spec": _spec_of(cfg), "compute_dtype": trainer.plan.compute_dtype_name,
               "input_pipeline": _pipeline_of(cfg)},
        **run_memory_figures(trainer, tensor_peak))


def _steps(trainer: Trainer, meter: StepMeter, profiler: ProfilerWindow,
           probe: NumericsProbe | None, emit, should_stop, run_dir, on_window,
           parallel, tensor_peak: TensorPeakProbe) -> tuple[str, str | None, int]:
    """The steps of one run: (status, reason, the last step completed)."""
    cfg = trainer.cfg
    status, reason, step = "finished", None, 0
    for step in range(1, cfg.steps + 1):
        if parallel is None and should_stop():
            status, reason, step = "stopped", f"stopped by request at step {step - 1}", step - 1
            break
        phase = phase_of(step, cfg)
        sampled = probe is not None and probe.wants(step)
        if sampled and phase == STEADY:
            phase = NUMERICS  # slower on purpose: kept out of steady-state averages
        profiler.before_step(step, phase)
        is_log_step = meter.should_log(step)
        # The gradient norm reads every gradient once (ResNet-50: ~100 MB, ~8 ms a step on
        # a CPU core): logged every GRAD_NORM_EVERY steps and at the last, not every step;
        # a GradScaler run computes it every step anyway (a non-finite norm = a skip).
        want_norm = is_log_step and (step % GRAD_NORM_EVERY == 0 or step == cfg.steps)
        if tensor_peak.wants(step):
            loss, grad_norm = tensor_peak.run(
                lambda: trainer.step(step, want_grad_norm=want_norm))
        else:
            loss, grad_norm = trainer.step(step, want_grad_norm=want_norm)
        if sampled:
            run_dir.mkdir(parents=True, exist_ok=True)  # deleted under a running trainer
            probe.save(run_dir / NUMERICS_FILENAME)  # rewritten each time: a crash keeps it
        meter.step_done(grad_norm)
        next_phase = phase_of(step + 1, cfg) if step < cfg.steps else None
        # A phase change is a timing boundary too (one extra sync per phase, not per
        # step), so a steady interval never carries warm-up or profiler time.
        phase_ends = next_phase is not None and next_phase != phase
        stop_all = False
        if is_log_step or profiler.prof is not None or phase_ends:
            # Sync point: timing needs the device to have finished the queued work.
            loss_value, stop_all = _synced_loss(loss, parallel, is_log_step or phase_ends,
                                                should_stop)
            row = meter.log(step, phase, loss_value, grad_norm, lr=lr_at(step, cfg))
            if profiler.after_step(step, next_phase):  # the trace was written now
                if on_window is not None:
                    on_window(profiler, trainer.plan.compute_dtype_name)
                meter.restart()  # the export and its analysis are not a step
            if row is not None:
                emit([row])
                _check_finite(cfg, step, loss_value, row["loss_scale"])
        if stop_all:
            status, reason = "stopped", f"stopped by request at step {step}"
            break
    return status, reason, step


def _synced_loss(loss: torch.Tensor, parallel, reduce: bool, should_stop) -> tuple[float, bool]:
    """The loss as a number (a host sync) and whether any rank was asked to stop. In a
    multi-process run the same condition holds on every rank (the profiler runs on rank 0
    only), so this one collective always meets all ranks: the mean loss, and the stop
    request (they must leave the loop at the same step)."""
    loss_value = float(loss.item())
    if parallel is not None and reduce:
        return parallel.reduce_log_values(loss_value, should_stop())
    return loss_value, False


def _spec_of(cfg: RunConfig) -> dict[str, Any]:
    if cfg.model == ModelName.CUSTOM.value:
        return {"workload": cfg.workload}
    if cfg.model.value in ARCHITECTURES:
        return {"architecture": cfg.model.value}
    return asdict(model_spec(cfg))


def _pipeline_of(cfg: RunConfig) -> dict[str, Any]:
    if cfg.data == "synthetic":
        return {"data": "synthetic"}
    return {"data": "loader", "num_workers": cfg.num_workers, "pin_memory": cfg.pin_memory,
            "persistent_workers": cfg.persistent_workers,
            "prefetch_factor": cfg.prefetch_factor if cfg.num_workers else None}


def _check_finite(cfg: RunConfig, step: int, loss_value: float, loss_scale: float | None) -> None:
    if math.isfinite(loss_value):
        return
    if cfg.uses_grad_scaler and loss_scale is not None and loss_scale >= 1.0:
        # GradScaler skips these steps and backs off; that is loss scaling working,
        # not divergence. Only when the scale has collapsed is the run beyond saving.
        return
    detail = f"; loss scale fell to {loss_scale:g}" if loss_scale is not None else ""
    raise Diverged(step, f"loss became {loss_value} at step {step}{detail}")
