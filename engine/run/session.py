"""THE trainer session: the one path from "this process trains run X" to its outcome.

Every executor runs it: the local trainer (engine.run.worker --train, also when forked
by the standby), each rank of a multi-process run (engine.run.rank) and a Ray task
(engine.cluster.ray_tasks). In order:

    peak FLOP/s (lead only, before anything else uses the device)
    -> telemetry sampler -> train() -> finished | stopped | diverged | oom | failed
    -> sampler stopped, metrics flushed -> summary (MFU, processes)

The session decides the outcome; the executor records it (`finish`): the local trainer
and rank 0 finalize and set the status in the store, a non-lead rank reports a failure
to torchrun, a Ray task sends it to the store actor. Nothing here knows which.
"""

from __future__ import annotations

import secrets
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from engine.analysis.contention import assess, sample_is_busy
from engine.analysis.speedup import apply_verdicts, explain
from engine.analysis.whatif import measured_rates
from engine.config import COMPUTE_DTYPES, Precision, RunConfig
from engine.hardware.contention import logical_cores
from engine.hardware.devices import EMULATED, get_device, mode_support
from engine.hardware.peaks import note_achieved, peak_for, reference_peaks
from engine.proc import become_subreaper, end_descendants
from engine.schema import (
    DIVERGED,
    FAILED,
    FINISHED,
    OOM,
    RUNNING,
    RUNS_DIRNAME,
    STEADY,
    STOPPED,
    mfus_against,
    plausible_mfu,
)
from engine.store import Store
from engine.training.fp8_advice import fp8_advice, linear_gemm_shapes

if TYPE_CHECKING:  # the type only; the session imports torch when it trains
    from engine.training.parallel import ParallelContext

FLUSH_INTERVAL_S = 0.5


class StopFlag:
    """A signal handler that asks the loop to stop at its next step (SIGTERM, SIGINT)."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, *_args) -> None:
        self.requested = True


class SummarySink(Protocol):
    """Where a session's summary fields and kernel rows go: a Store, or the Ray actor."""

    def merge_summary(self, run_id: str, values: dict[str, Any]) -> None: ...

    def write_kernels(self, run_id: str, rows: list[dict[str, Any]]) -> None: ...


class MetricBuffer:
    """Collects metric rows; writes them in one transaction at most every 0.5 s, except the
    first: it is written at once."""

    def __init__(self, store: Store, run_id: str, token: str | None = None):
        self.store = store
        self.run_id = run_id
        self.token = token  # the trainer's claim on the run (store.claim_trainer)
        self.rows: list[dict] = []
        # The first point is what a person who just pressed Launch waits for: a trainer from
        # the standby reaches its first step ~0.1 s after this buffer exists, and would
        # otherwise wait out the rest of the interval for it (~0.4 s, bench.first_point).
        self.last_flush_s = float("-inf")
        self.conn = store.open_connection()  # kept: a fresh one per flush costs ~7 ms

    def __call__(self, rows: list[dict]) -> None:
        self.rows.extend(rows)
        if time.monotonic() - self.last_flush_s >= FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.store.write_metrics(self.run_id, self.rows, conn=self.conn, token=self.token)
            self.rows = []
        self.last_flush_s = time.monotonic()

    def close(self) -> None:
        self.flush()
        self.conn.close()


@dataclass
class SessionSpec:
    """What differs between executors; everything else is the session's."""
    run_id: str
    cfg: RunConfig
    device_key: str                # what torch trains on ("cpu", "cuda:0")
    sink: SummarySink              # summary fields and kernel rows
    emit: Callable[[list[dict]], None]          # metric rows
    telemetry: Callable[[list[dict]], None]     # telemetry rows
    should_stop: Callable[[], bool]
    run_dir: Path | None           # None: this process does not profile (ranks > 0)
    on_window: Callable[[Any, str], None] | None
    telemetry_key: str | None = None  # NVML device for telemetry, default device_key
    lead: bool = True              # writes the summary (single runs, rank 0, Ray tasks)
    parallel: "ParallelContext | None" = None
    where: str | None = None       # appended to an OOM reason ("on NVIDIA H100 on 10.0.0.5")
    keep_trace_path: bool = True   # False on a Ray node: its local path means nothing elsewhere
    rank_trace_dir: Path | None = None  # ranks > 0: profile the same window into their own file
    log: Callable[[str], None] = field(default=lambda line: print(line, flush=True))


@dataclass
class Outcome:
    status: str                    # finished | stopped | diverged | oom | failed
    reason: str | None
    summary: dict[str, Any] = field(default_factory=dict)  # merged already (lead)
    error: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self.status == FAILED


def run_session(spec: SessionSpec, close_metrics: Callable[[], None]) -> Outcome:
    """Train `spec.cfg`; return how it ended. `close_metrics` flushes the metric rows and
    is called before the outcome's summary is merged, on every path."""
    from engine.hardware.telemetry import TelemetrySampler  # its thread belongs to the trainer
    from engine.training.loop import Diverged, train  # imports torch

    cfg = spec.cfg
    if cfg.is_speedup_check:
        return run_speedup_session(spec, close_metrics)
    peak, peak_later = (device_peak(spec.sink, spec.run_id, spec.device_key, cfg)
                        if spec.lead else (None, False))
    peak = _per_run_peak(peak, spec)
    sampler = TelemetrySampler(spec.telemetry_key or spec.device_key, spec.telemetry).start()
    marker = ContentionMarker(sampler)
    try:
        result = train(cfg, spec.device_key, emit=marker.wrap(spec.emit),
                       should_stop=spec.should_stop, run_dir=spec.run_dir,
                       on_window=spec.on_window, peak_flops=peak, parallel=spec.parallel,
                       rank_trace_dir=spec.rank_trace_dir)
    except Diverged as exc:
        close_metrics()
        return Outcome(DIVERGED, str(exc))
    except BaseException as exc:  # noqa: BLE001 - every ending is an outcome
        close_metrics()
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        spec.log(traceback.format_exc().rstrip())  # the whole story goes to the run's log
        if is_oom(exc):
            return Outcome(OOM, _record_oom(spec, exc), error=exc)
        return Outcome(FAILED, f"{type(exc).__name__}: {exc}"[:2000], error=exc)
    finally:
        sampler.stop()
    close_metrics()
    # No stored peak at the start: measured now that the steps are done (not after a stop
    # request: the stop must end within its grace, and MFU waits for the next run).
    if spec.lead and peak_later and result.status != "stopped":
        peak = _per_run_peak(device_peak(spec.sink, spec.run_id, spec.device_key, cfg,
                                         measure=True)[0], spec)
    summary = result_summary(result, peak) if spec.lead else {}
    if spec.lead:
        summary["mfu_peaks"] = both_mfus(spec, result.achieved_tflops)
        # this device's measured matmul rates per dtype, for the what-if (analysis.whatif)
        # on surfaces that do not load torch
        summary["matmul_rates"] = measured_rates(spec.device_key)
        # the measured ceiling (not the MFU basis): a run that beats it proves it too low
        measured = (summary["mfu_peaks"].get("measured") or {}).get("flops_per_s")
        check_peak_beaten(spec.device_key, cfg, result.achieved_tflops,
                          measured / spec.parallel.world_size
                          if measured and spec.parallel is not None
                          and spec.device_key.startswith("cuda") else measured)
        summary["contention"] = marker.verdict()
        if spec.parallel is not None:
            summary["parallel"] = spec.parallel.describe()
        if not spec.keep_trace_path:
            summary.pop("trace_path", None)  # the store actor records where the trace landed
        elif summary.get("trace_path"):
            # Relative to the data directory: an exported summary or report must not carry
            # this machine's absolute paths.
            summary["trace_path"] = run_relative_path(spec.run_id, summary["trace_path"])
        spec.sink.merge_summary(spec.run_id, summary)
    return Outcome(STOPPED if result.status == "stopped" else FINISHED, result.reason, summary)


def both_mfus(spec: SessionSpec, achieved_tflops: float | None) -> dict[str, Any]:
    """MFU against the datasheet peak (a CPU: its ISA peak) and against this device's
    measured matmul ceiling, each with its peak named (run.finalize puts the steady median
    in place of this mean once the rows are in)."""
    try:
        peaks = reference_peaks(get_device(spec.device_key),
                                spec.cfg.precision_mode.compute_dtype)
    except Exception as exc:  # noqa: BLE001 - MFU is optional; the run is not
        return {"error": f"peaks unavailable: {exc}"}
    for entry in peaks.values():
        entry["flops_per_s"] = _per_run_peak(entry["flops_per_s"], spec)
    return mfus_against(peaks, achieved_tflops)


def _per_run_peak(peak: float | None, spec: SessionSpec) -> float | None:
    if peak and spec.parallel is not None and spec.device_key.startswith("cuda"):
        return peak * spec.parallel.world_size  # one GPU per rank; CPU ranks share one peak
    return peak


class ContentionMarker:
    """Marks each logged step with whether the machine was busy (the sampler's latest
    sample), and keeps the steady steps' samples for the run's contention verdict."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.cores = logical_cores()
        self.steady_samples: dict[float, dict] = {}  # by sample time: each sample once

    def wrap(self, emit: Callable[[list[dict]], None]) -> Callable[[list[dict]], None]:
        def marked(rows: list[dict]) -> None:
            latest = self.sampler.latest
            busy = sample_is_busy(latest, self.cores)
            for row in rows:
                row["host_busy"] = None if busy is None else int(busy)
                if latest and row.get("phase") == STEADY:
                    self.steady_samples[latest["t_s"]] = latest
            emit(rows)
        return marked

    def verdict(self) -> dict[str, Any]:
        return assess(self.steady_samples.values(), self.cores)


def run_speedup_session(spec: SessionSpec, close_metrics: Callable[[], None]) -> Outcome:
    """A paired speedup check (cfg.speedup_modes) instead of a training run: the result so
    far is merged into the summary ("speedup") after every round, for Live and the CLI."""
    cfg = spec.cfg

    def on_progress(result: dict[str, Any]) -> None:
        spec.sink.merge_summary(spec.run_id, {"speedup": {**result, "running": True}})

    try:
        result = speedup_check(cfg, spec.device_key, on_progress, spec.should_stop,
                               telemetry=spec.telemetry, telemetry_key=spec.telemetry_key,
                               with_peaks=spec.lead)
    except BaseException as exc:  # noqa: BLE001 - every ending is an outcome
        close_metrics()
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        spec.log(traceback.format_exc().rstrip())
        if is_oom(exc):
            return Outcome(OOM, _record_oom(spec, exc), error=exc)
        return Outcome(FAILED, f"{type(exc).__name__}: {exc}"[:2000], error=exc)
    close_metrics()
    summary = {"speedup": {**result, "running": False}, "contention": result["contention"]}
    spec.sink.merge_summary(spec.run_id, summary)
    stopped = result["stopped_by"] == "stop requested"
    reason = (f"stopped by request after {result['rounds']} rounds" if stopped else
              f"{result['rounds']} rounds of {result['block_steps']} steps per mode "
              f"(stopped by {result['stopped_by']})")
    return Outcome(STOPPED if stopped else FINISHED, reason, summary)


def speedup_check(cfg: RunConfig, device_key: str,
                  on_progress: Callable[[dict[str, Any]], None] = lambda _r: None,
                  should_stop: Callable[[], bool] = lambda: False,
                  telemetry: Callable[[list[dict]], None] = lambda _rows: None,
                  telemetry_key: str | None = None, with_peaks: bool = True) -> dict[str, Any]:
    """One paired speedup check in this process, judged: the measurement
    (training.speedup), the machine's load over its rounds (the telemetry sampler), each
    mode's verdict under that load and the findings. What a check run stores, and what
    bench/speedup_calibration.py repeats to measure the method's false-claim rate. The
    budget counts from here: the peaks, the set-up and the rounds all spend it, and the
    set-up's progress goes to `on_progress` too (phase "setup")."""
    started_s = time.perf_counter()
    # In set-up from the first moment: the peaks and torch's import come before the first
    # stage, and the no-progress rule reads the phase.
    on_progress({"phase": "setup", "setup": {"stage": None, "mode": None, "stages_done": 0,
                                             "modes": {}},
                 "rounds": 0, "modes": [], "elapsed_s": 0.0, "budget_s": cfg.speedup_budget_s,
                 "target_pct": cfg.speedup_target_pct, "dropped": [],
                 "baseline": cfg.speedup_mode_list[0]})
    from engine.hardware.telemetry import TelemetrySampler  # its thread belongs to the trainer
    from engine.training.speedup import measure_speedup  # imports torch

    peaks = speedup_peaks(device_key, cfg) if with_peaks else {}
    shapes = model_gemm_shapes(cfg)
    sampler = TelemetrySampler(telemetry_key or device_key, telemetry).start()
    cores = logical_cores()
    samples: dict[float, dict] = {}

    def on_round() -> None:
        if sampler.latest:
            samples[sampler.latest["t_s"]] = sampler.latest

    def progress(result: dict[str, Any]) -> None:
        on_progress(with_context(result, peaks, assess(samples.values(), cores), shapes))

    try:
        result = measure_speedup(cfg, device_key, on_progress=progress,
                                 should_stop=should_stop, on_round=on_round,
                                 on_setup=on_progress, started_s=started_s)
    finally:
        sampler.stop()
    return with_context(result, peaks, assess(samples.values(), cores), shapes)


def speedup_peaks(device_key: str, cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """Per mode of a speedup check: the measured (or datasheet) matmul rate of its dtype,
    so the result can say how much of it the model's matmuls reached."""
    out = {}
    device = get_device(device_key)
    for mode in dict.fromkeys(cfg.speedup_mode_list):
        try:
            dtype = COMPUTE_DTYPES[mode]
            support = mode_support(device, Precision(mode))
            out[mode] = {"dtype": dtype, **peak_for(device, dtype).to_dict(),
                         "emulated": support.status == EMULATED,
                         "emulated_reason": support.reason if support.status == EMULATED
                         else None}
        except Exception as exc:  # noqa: BLE001 - the explanation is optional; the check is not
            out[mode] = {"dtype": None, "flops_per_s": None, "source": "n/a", "note": str(exc)}
    return out


def with_context(result: dict[str, Any], peaks: dict[str, dict[str, Any]],
                 contention: dict[str, Any], gemm_shapes: list | None = None) -> dict[str, Any]:
    """The check's result with each mode's matmul peak, the contention verdict, each
    mode's verdict under it (one rule: engine.analysis.speedup.mode_verdict) and the
    findings that say why (engine.analysis.speedup.explain)."""
    modes = []
    for row in result["modes"]:
        mode = row["mode"].split(" (")[0]
        modes.append({**row, "peak": peaks.get(mode)})
    full = apply_verdicts({**result, "modes": modes, "contention": contention,
                           "gemm_shapes": gemm_shapes})
    full["findings"] = explain(full)
    return full


def model_gemm_shapes(cfg: RunConfig) -> list | None:
    """(layer, M, K, N) of the model's Linear GEMMs, for "too small to pay" findings."""
    try:
        return [list(shape) for shape in linear_gemm_shapes(cfg)]
    except Exception:  # noqa: BLE001 - a model without a shape table: no shape in the finding
        return None


def run_relative_path(run_id: str, path: str | Path) -> str:
    """runs/<id>/<file name>: where a run's file is, relative to the data directory."""
    return f"{RUNS_DIRNAME}/{run_id}/{Path(path).name}"


def result_summary(result, peak_flops: float | None) -> dict[str, Any]:
    """A TrainResult as every executor stores it in the run summary, with MFU against
    `peak_flops` (FLOP/s of the run's devices), or the reason MFU is left out."""
    summary = result.to_dict()
    # run.finalize replaces samples_per_s with the steady median; the mean stays here.
    summary["samples_per_s_mean"] = result.samples_per_s
    if peak_flops and result.achieved_tflops:
        summary["mfu"] = plausible_mfu(result.achieved_tflops * 1e12, peak_flops)
        if summary["mfu"] is None:
            summary["mfu_note"] = (
                f"MFU omitted: the run achieved {result.achieved_tflops * 1e3:.3g} GFLOP/s, "
                f"more than the {peak_flops / 1e9:.3g} GFLOP/s peak measured by the matmul "
                "microbenchmark, so that peak does not represent this model's matmuls "
                "(typical of emulated dtypes); the peak is measured again at the next run")
    return summary


def device_peak(sink: SummarySink, run_id: str, device_key: str, cfg: RunConfig,
                measure: bool = False) -> tuple[float | None, bool]:
    """(dense peak FLOP/s for this run's precision, whether it is still to be measured).

    At the run's start only the datasheet or a stored quiet measurement is used: the
    first steps must not wait 1.5 s for a microbenchmark, and at that moment a launch from
    the app has the server and the browser redrawing, so a measurement would mostly be
    refused as busy. Without one, the session measures after training (`measure=True`),
    while the device is still its own.
    """
    try:
        device = get_device(device_key)
        peak = peak_for(device, cfg.precision_mode.compute_dtype, measure=measure)
        basis = reference_peaks(device, cfg.precision_mode.compute_dtype)["datasheet"]
    except Exception as exc:  # noqa: BLE001 - MFU is optional; the run is not
        sink.merge_summary(run_id, {"mfu_note": f"peak unavailable: {exc}"})
        return None, False
    if basis.get("flops_per_s"):
        # One MFU basis on every surface: the datasheet peak (a CPU: its ISA peak) of the
        # mode's compute dtype; the measured ceiling stays beside it in mfu_peaks, named.
        # A missing measured ceiling is still measured after the steps (peak.measurable).
        sink.merge_summary(run_id, {
            "peak_flops": basis["flops_per_s"], "peak_source": MFU_BASIS_SOURCE,
            "peak_label": basis["label"], "mfu_note": None, "fp8_advice": fp8_advice(cfg)})
        return basis["flops_per_s"], peak.measurable
    note = peak.note
    if peak.measurable:
        note = ("the matmul peak of this device is measured when the run's steps are done "
                "(none stored yet); MFU follows then")
    sink.merge_summary(run_id, {"peak_flops": peak.flops_per_s, "peak_source": peak.source,
                                "peak_label": peak.label or None, "mfu_note": note,
                                "fp8_advice": fp8_advice(cfg)})
    return peak.flops_per_s, peak.measurable


MFU_BASIS_SOURCE = "datasheet (GPU) or ISA peak (CPU) of the mode's dtype"


def check_peak_beaten(device_key: str, cfg: RunConfig, achieved_tflops: float | None,
                      peak_flops: float | None) -> None:
    """A run that achieved more than its measured peak proves the peak too low: the
    stored record is marked, and the next run measures it again."""
    if not achieved_tflops or not peak_flops or achieved_tflops * 1e12 <= peak_flops:
        return
    try:
        note_achieved(get_device(device_key), cfg.precision_mode.compute_dtype,
                      achieved_tflops * 1e12)
    except Exception:  # noqa: BLE001 - the cache is an optimisation; the run's result stands
        pass


def looks_like_oom(exc: BaseException) -> bool:
    text = str(exc)
    return "can't allocate memory" in text or "out of memory" in text.lower()


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error, typed (torch, Python) or by its words (CUDA, NCCL, mmap)."""
    import torch  # loaded by now: only a trainer asks

    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or looks_like_oom(exc)


def _record_oom(spec: SessionSpec, exc: BaseException) -> str:
    """The OOM reason, with the memory in use at the failure (also stored, lead only)."""
    import torch  # loaded by now: the session trained

    from engine.training.step_meter import memory_snapshot  # imports torch

    batch_size = spec.cfg.batch_size
    first_line = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    if spec.parallel is not None:  # a rank: torchrun's verdict names the rank that failed
        text = f"{type(exc).__name__}: {exc}"
        return f"out of memory at batch size {batch_size} per rank: {text.splitlines()[0][:300]}"
    mem = memory_snapshot(torch.device(spec.device_key))
    used = mem.get("mem_reserved_bytes") or mem.get("rss_bytes") or 0
    if spec.lead:
        spec.sink.merge_summary(spec.run_id, {"oom_batch_size": batch_size, "oom_mem_bytes": used})
    where = f", on {spec.where}" if spec.where else ""
    cap_mb = spec.cfg.memory_cap_mb
    cap = (f"; this run's memory cap was {cap_mb} MiB (memory_cap_mb): raise it, or lower "
           "the batch size" if cap_mb and not spec.device_key.startswith("cuda") else "")
    return (f"out of memory at batch size {batch_size} (memory in use at failure: "
            f"{used / 2**30:.2f} GiB{where}){cap}: {first_line}")


# ---------------------------------------------------------------------------------------
# the local executor: `python -m engine.run.worker --train RUN_ID`, or forked by the standby


def run_trainer(run_id: str, store: Store) -> int:
    """Train a single-process run and record its outcome; 1 when it failed."""
    import signal

    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    run = store.get_run(run_id)
    if run.status != RUNNING:
        print(f"[trainer] run {run_id} is {run.status}, not running; nothing to do", flush=True)
        return 0
    if run.config_error:  # the supervisor refuses these; a stale standby hand-off must too
        store.set_status(
            run_id, FAILED, f"{run.config_error}; re-launch the run with a valid config"
        )
        return 1
    try:
        import torch  # noqa: F401 - here, so a memory cap too small for PyTorch is named
    except (ImportError, OSError) as exc:
        cap = run.config.memory_cap_mb
        hint = (f"; memory_cap_mb={cap} is too small to load PyTorch (try >= 1024)"
                if cap else "")
        store.set_status(run_id, OOM if cap else FAILED,
                         f"could not load PyTorch: {str(exc)[:300]}{hint}")
        return 1
    from engine.run.window import window_handler  # analysis of the profiler window

    token = secrets.token_hex(8)
    if not store.claim_trainer(run_id, token):
        # Another trainer has this run (a standby that stalled past its hand-off resumed
        # after the supervisor started a fresh trainer): training too would mix two runs.
        print(f"[trainer] run {run_id}: already claimed by another trainer; not training",
              flush=True)
        return 0
    cfg = run.config
    buffer = MetricBuffer(store, run_id, token)
    print(f"[trainer] run {run_id}: {cfg.to_json()} on {run.device_key}", flush=True)
    spec = SessionSpec(
        run_id=run_id, cfg=cfg, device_key=run.device_key, sink=store, emit=buffer,
        telemetry=lambda rows: store.write_telemetry(run_id, rows),
        should_stop=lambda: stop.requested, run_dir=store.run_dir(run_id),
        on_window=window_handler(store, run_id, run.device_key))
    become_subreaper()  # before the workload builds: its orphans come back to us
    outcome = run_session(spec, close_metrics=buffer.close)
    # Before the status is recorded: once a run has ended, no process of it is left.
    leftovers = end_descendants()
    if leftovers:
        print(f"[trainer] run {run_id}: ended {len(leftovers)} process(es) the workload "
              f"left running: {', '.join(leftovers[:10])}", flush=True)
    if not store.holds_claim(run_id, token):  # lost it meanwhile: the run is not ours to end
        print(f"[trainer] run {run_id}: no longer this trainer's; not recording", flush=True)
        return 0
    finish(store, run_id, outcome)
    if cfg.is_speedup_check:  # no run steps: its rounds are its progress
        rounds = (outcome.summary.get("speedup") or {}).get("rounds", 0)
        print(f"[trainer] run {run_id}: {outcome.status} after {rounds} rounds", flush=True)
    else:
        steps = outcome.summary.get("steps_completed", store.get_run(run_id).steps_completed)
        print(f"[trainer] run {run_id}: {outcome.status} after {steps} steps", flush=True)
    return 1 if outcome.failed else 0


def finish(store: Store, run_id: str, outcome: Outcome) -> bool:
    """The run's last word in the store: overview and comparison stats (for a run that
    trained to an end), then the status; True when the status was set."""
    # finalize reads the whole metric table with pandas: kept out of the supervisor
    from engine.run.finalize import finalize_run_data

    if outcome.status in (FINISHED, STOPPED, DIVERGED):
        finalize_run_data(store, run_id)
    return store.set_status(run_id, outcome.status, outcome.reason)
