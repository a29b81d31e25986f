"""The names every layer shares, and nothing that needs torch, pandas or the store.

A run's statuses, the columns of its metric/telemetry/kernel rows, the phases of its
steps, the files in its run directory, the throughput unit of a model, the MFU rule and
the keys of its summary are defined here once: the supervisor (no torch), the trainer,
the pages and the CLI all read them from this module.
"""

from __future__ import annotations

from typing import Any, TypedDict

from engine.architectures import is_token_model

# -- run statuses ------------------------------------------------------------------------
QUEUED, RUNNING, FINISHED, FAILED, STOPPED, DIVERGED, OOM = (
    "queued", "running", "finished", "failed", "stopped", "diverged", "oom")
STATUSES = (QUEUED, RUNNING, FINISHED, FAILED, STOPPED, DIVERGED, OOM)
ACTIVE_STATUSES = (QUEUED, RUNNING)
FINAL_STATUSES = (FINISHED, FAILED, STOPPED, DIVERGED, OOM)

# -- sweeps ------------------------------------------------------------------------------
SWEEP_LOCAL, SWEEP_RAY = "local", "ray"
SWEEP_RUNNING, SWEEP_DONE, SWEEP_FAILED = "running", "done", "failed"

# -- step phases (metrics.phase) ---------------------------------------------------------
# warmup: the first warmup_steps (allocator, autotuning, compile); profile: the profiler
# window; numerics: a step the numerics probe sampled; steady: everything else. Only
# steady steps enter throughput figures.
WARMUP, STEADY, PROFILE, NUMERICS = "warmup", "steady", "profile", "numerics"
PHASES = (WARMUP, STEADY, PROFILE, NUMERICS)

# -- row columns (units in the names; NULL where a value does not apply) -----------------
METRIC_COLUMNS = (
    "step", "wall_time_s", "loss", "lr", "step_time_ms", "samples_per_s", "tokens_per_s",
    "mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes", "rss_bytes",
    "loss_scale", "skipped_steps", "grad_norm", "achieved_tflops", "mfu", "phase",
    "host_busy",
    # per step, mean over the logged interval: waiting for the next batch (the input
    # pipeline), and its host-to-device copy (NULL where there is none: synthetic, CPU)
    "data_wait_ms", "h2d_copy_ms",
)
TELEMETRY_COLUMNS = (
    "t_s", "gpu_util_pct", "mem_util_pct", "gpu_mem_used_bytes", "power_w", "power_limit_w",
    "temp_c", "sm_clock_mhz", "throttle_reasons", "cpu_pct", "rss_bytes",
    "load_per_core", "others_cpu_cores", "steal_pct", "gpu_other_procs", "sm_clock_max_mhz",
)
# The unit of each metric column whose name does not carry one (exports write "loss [nats]").
METRIC_UNITS = {
    "step": "optimizer step", "loss": "nats (cross-entropy)", "lr": "learning rate",
    "mfu": "fraction of peak", "loss_scale": "GradScaler scale", "skipped_steps": "count",
    "grad_norm": "L2 norm", "phase": "warmup|steady|profile|numerics",
    "host_busy": "1 = measured while other work competed for the machine",
}
TELEMETRY_UNITS = {"throttle_reasons": "NVML clock event reasons", "rank": "process rank",
                   "load_per_core": "1-min load average / logical cores",
                   "others_cpu_cores": "cores' worth of CPU used by other processes",
                   "gpu_other_procs": "other processes on this GPU"}
KERNEL_COLUMNS = (
    "name", "category", "tensor_core", "dtype", "reason", "total_us", "count", "cpu_op",
)

# -- the data directory -----------------------------------------------------------------
HOME_ENV = "PRECISION_LAB_HOME"  # where the store lives; default ./.precision_lab
# Set for a run's supervisor and trainer, inherited by every process its workload starts:
# how reconcile finds what a killed run left behind (engine.proc.processes_of_run).
RUN_ID_ENV = "PRECISION_LAB_RUN_ID"

# -- files of a run directory (runs/<id>/) and of the data directory ---------------------
RUNS_DIRNAME = "runs"                      # <data dir>/runs/<run id>/
WORKER_LOG = "worker.log"                  # supervisor + trainer output; Live shows its tail
TRACE_FILENAME = "trace.json.gz"           # the profiler window's trace (Perfetto-loadable)
# multi-process runs: rank 0's window is TRACE_FILENAME, rank N's (N > 0) this name
RANK_TRACE_PATTERN = "trace-rank{rank}.json.gz"
ONEDNN_LOG_FILENAME = "onednn_verbose.log"  # CPU runs: oneDNN's primitive log of the window
NUMERICS_FILENAME = "numerics.json"        # the numerics probe's per-layer magnitudes
RANKS_DIRNAME = "ranks"                    # multi-process runs: one record per rank process
FAILURE_FILENAME = "failure.json"          # ranks/failure.json: the agent's failure verdict
# Files a run may leave that the pages read (the Ray store actor accepts only these).
RUN_ARTIFACTS = (TRACE_FILENAME, ONEDNN_LOG_FILENAME, NUMERICS_FILENAME)
DRIVER_LOG = "driver.log"                  # sweeps/<id>/driver.log: a Ray sweep's driver
STANDBY_LOG = "standby.log"                # <data dir>/standby.log
STANDBY_WANTED = "standby.wanted.json"     # <data dir>/: the app keeps a standby ready
STANDBY_STARTING = "standby.starting.json"  # <data dir>/: a standby importing torch
PEAKS_CACHE_FILENAME = "peaks_cache.json"  # <data dir>/peaks_cache.json: measured peaks

# -- throughput --------------------------------------------------------------------------
def throughput_column(model: str) -> str:
    """The metric column a model's throughput is read from: tokens for sequence models."""
    return "tokens_per_s" if is_token_model(model) else "samples_per_s"


def throughput_unit(model: str) -> str:
    return "tokens/s" if is_token_model(model) else "samples/s"


def plausible_mfu(achieved_flops: float | None, peak_flops: float | None) -> float | None:
    """achieved / peak, or None when it cannot be right (above 100 %: the peak is an
    underestimate, e.g. a measured peak of an emulated dtype). Omitted, never wrong."""
    if not achieved_flops or not peak_flops:
        return None
    mfu = achieved_flops / peak_flops
    return mfu if mfu <= 1.0 else None


def mfus_against(peaks: dict[str, dict[str, Any]], achieved_tflops: float | None
                 ) -> dict[str, dict[str, Any]]:
    """Each named peak ({"flops_per_s", "label"}) with the MFU against it; a peak the run
    beat says so instead of an MFU above 100 %."""
    achieved = achieved_tflops * 1e12 if achieved_tflops else None
    out = {}
    for kind, peak in peaks.items():
        mfu = plausible_mfu(achieved, peak.get("flops_per_s"))
        entry = {"flops_per_s": peak.get("flops_per_s"), "label": peak.get("label"), "mfu": mfu}
        if mfu is None and achieved and peak.get("flops_per_s"):
            entry["note"] = "the run achieved more than this peak: it does not bound this model"
        out[kind] = entry
    return out


# -- the run summary ---------------------------------------------------------------------
class RunSummary(TypedDict, total=False):
    """Every key a run's summary (runs.summary_json) may hold, and who writes it.

    A new field is declared here first: tests/test_house_rules.py checks every
    merge_summary call of the engine and the pages against these keys.
    """
    # engine.training.loop.TrainResult (run.finalize.result_summary)
    status: str
    reason: str | None
    steps_completed: int
    first_loss: float | None
    final_loss: float | None
    # steady-state median of the logged steps (run.finalize), all ranks together; the
    # training loop's time-weighted mean over the same steps is samples_per_s_mean
    samples_per_s: float | None
    samples_per_s_mean: float | None
    throughput_basis: str
    tokens_per_s: float | None
    step_time_ms: float | None
    # the memory chart's peak: CUDA: the tensor peak; CPU: the process peak (peak RSS)
    peak_mem_bytes: int | None
    # engine.training.memory: the two peaks by name, the tensor peak's split, and why the
    # tensor peak is missing (a CPU run with fewer than 2 warm-up steps)
    tensor_peak_bytes: int | None
    process_peak_bytes: int | None
    memory_by_kind: dict[str, Any] | None
    tensor_peak_note: str | None
    loss_scale_final: float | None  # fp16-amp with a GradScaler only
    skipped_steps: int
    flops_per_step: float | None
    flops_method: str | None
    achieved_tflops: float | None
    param_count: int
    trace_path: str | None
    data_wait_ms: float | None  # steady steps: mean wait for the next batch
    h2d_copy_ms: float | None   # steady steps: mean host-to-device copy (None: no copy)
    data_wait_share: float | None  # data_wait_ms / step_time_ms (input-bound near 1)
    skip_ledger: dict[str, Any] | None  # fp16-amp: each skipped step, where it overflowed
    extra: dict[str, Any]  # model spec, compute dtype
    # MFU (run.session: the peak before training, result_summary after it)
    mfu: float | None
    mfu_note: str | None
    peak_flops: float | None
    peak_source: str
    peak_label: str | None  # what MFU is relative to: datasheet row, or measured when/how
    # MFU against both: "datasheet" (a CPU: its ISA peak) and "measured" (the matmul ceiling)
    mfu_peaks: dict[str, Any]
    matmul_rates: dict[str, float]  # this device's measured matmul FLOP/s per dtype (what-if)
    fp8_advice: str | None
    # out of memory (run.session)
    oom_batch_size: int
    oom_mem_bytes: int
    # the profiler window (run.window)
    compute_dtype: str
    gpm_tensor_util_pct: float | None
    gpm_note: str
    trace_file: str
    kernels: dict[str, Any]
    cpu_evidence: dict[str, Any]
    profile_error: str
    explain: dict[str, Any]  # the window's banner, bound-by verdict and time parts (run.window)
    # multi-process runs (run.session, rank 0)
    parallel: dict[str, Any]
    # the busy-machine guard over the steady steps (run.session, analysis.contention.assess)
    contention: dict[str, Any]
    # a paired speedup check (run.session.run_speedup_session; training.speedup)
    speedup: dict[str, Any]
    # run end (run.finalize.finalize_run_data): steady medians and loss tail for Compare
    compare_stats: dict[str, Any]
    # "find the largest batch that fits" (CLI maxbatch --run-id, Live page)
    max_batch_fit: int | None
    max_batch_search: dict[str, Any]
    # no progress for a while (run.watch, the supervisor): since when, at which step
    stall: dict[str, Any] | None


SUMMARY_KEYS = frozenset(RunSummary.__annotations__)
