"""`python -m engine.worker RUN_ID`: the process a run lives in.

Two processes per run, one process group:
  - the supervisor (this module's `supervise`) waits for the run's device (FIFO, one
    run per device), starts the training process, and records how it ended even when
    it was killed (a signal, an OOM kill): a run never stays "running" by accident.
    It does not import torch, so queued runs cost almost nothing.
  - the trainer (`--train`) imports torch, trains, and flushes metrics to the store at
    least every 0.5 s in one transaction each.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import traceback

from .run_stats import finalize_run_data, result_summary
from .store import (ACTIVE_STATUSES, DIVERGED, FAILED, FINISHED, OOM, QUEUED, RUNNING,
                    STOPPED, Store)

FLUSH_INTERVAL_S = 0.5
QUEUE_POLL_S = 0.2


class _StopFlag:
    def __init__(self) -> None:
        self.requested = False

    def __call__(self, *_args) -> None:
        self.requested = True


# ---------------------------------------------------------------------------------------
# supervisor


def supervise(run_id: str, store: Store) -> int:
    from .launcher import process_create_time, reconcile

    stop = _StopFlag()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    store.update_run(run_id, pid=os.getpid(), pid_create_time=process_create_time(os.getpid()))
    print(f"[supervisor] run {run_id}: waiting for device", flush=True)
    while not store.claim_device(run_id):
        if stop.requested:
            store.set_status(run_id, STOPPED, "stopped while queued", only_from=(QUEUED,))
            return 0
        if store.get_run(run_id).status != QUEUED:
            return 0  # someone else decided its fate (stopped from the UI, reconciled)
        reconcile(store)  # a dead run must not hold the device forever
        time.sleep(QUEUE_POLL_S)
    run = store.get_run(run_id)
    if run.config.nprocs > 1:  # torchrun and its ranks: engine/distributed.py
        from .distributed import supervise_distributed

        supervise_distributed(run, store, stop, _memory_cap(
            run.config.memory_cap_mb if run.device_key == "cpu" else 0))
        _replace_standby(store)
        return 0
    print(f"[supervisor] run {run_id}: device {run.device_key} claimed, starting trainer",
          flush=True)
    child = _start_trainer(run_id, run, store)
    store.update_run(run_id, train_pid=child.pid)
    return_code = _wait_child(child, stop)
    _record_exit(store, run_id, return_code, stop.requested)
    _replace_standby(store)
    return 0


def _start_trainer(run_id: str, run, store: Store):
    """The pre-started standby trainer when one is ready (PyTorch already imported: the
    first point comes ~3.5 s sooner on a 2-core CPU), else a fresh process.

    Memory-capped runs always start fresh: RLIMIT_AS must be set before PyTorch maps.
    """
    from . import standby

    cap_mb = run.config.memory_cap_mb if run.device_key == "cpu" else 0
    if not cap_mb:
        trainer = standby.hand_off(run_id, store.home)
        if trainer is not None:
            print(f"[supervisor] run {run_id}: trainer pid {trainer.pid} from the standby",
                  flush=True)
            return trainer
    return subprocess.Popen([sys.executable, "-m", "engine.worker", "--train", run_id],
                            preexec_fn=_memory_cap(cap_mb))


def _replace_standby(store: Store) -> None:
    """Keep one standby ready for the next launch; started after the run, not beside it."""
    from . import standby

    try:
        standby.ensure(store)
    except OSError as exc:  # the run's outcome is recorded; a standby is an optimisation
        print(f"[supervisor] no standby started: {exc}", flush=True)


def _wait_child(child, stop: _StopFlag) -> int:
    """`child`: a subprocess.Popen or a standby.StandbyTrainer (same wait/signal API)."""
    forwarded_at = None
    while True:
        try:
            return child.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        if stop.requested and forwarded_at is None:
            forwarded_at = time.monotonic()
            child.send_signal(signal.SIGTERM)  # already sent to the group; harmless twice
        if forwarded_at is not None and time.monotonic() - forwarded_at > 2.5:
            child.kill()


def _record_exit(store: Store, run_id: str, return_code: int, stop_requested: bool) -> None:
    """The trainer writes its own final status; this covers the ways it can fail to."""
    run = store.get_run(run_id)
    if run.status not in ACTIVE_STATUSES:
        return
    step = run.steps_completed
    if stop_requested:
        store.set_status(run_id, STOPPED, f"stopped by request at step {step}")
    elif return_code < 0:
        sig = -return_code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = " (the kernel's OOM killer or a memory cap?)" if sig == signal.SIGKILL else ""
        store.set_status(run_id, FAILED,
                         f"worker exited with signal {sig} ({name}) at step {step}{hint}")
    else:
        store.set_status(run_id, FAILED,
                         f"worker exited with code {return_code} at step {step}; see worker.log")


def _memory_cap(cap_mb: int):
    if not cap_mb:
        return None

    def apply() -> None:  # runs in the child between fork and exec
        import resource

        cap_bytes = cap_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    return apply


# ---------------------------------------------------------------------------------------
# trainer


class MetricBuffer:
    """Collects metric rows; writes them in one transaction at most every 0.5 s."""

    def __init__(self, store: Store, run_id: str):
        self.store = store
        self.run_id = run_id
        self.rows: list[dict] = []
        self.last_flush_s = time.monotonic()
        self.conn = store.open_connection()  # kept: a fresh one per flush costs ~7 ms

    def __call__(self, rows: list[dict]) -> None:
        self.rows.extend(rows)
        if time.monotonic() - self.last_flush_s >= FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.store.write_metrics(self.run_id, self.rows, conn=self.conn)
            self.rows = []
        self.last_flush_s = time.monotonic()

    def close(self) -> None:
        self.flush()
        self.conn.close()


def run_trainer(run_id: str, store: Store) -> int:
    stop = _StopFlag()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    run = store.get_run(run_id)
    if run.status != RUNNING:
        print(f"[trainer] run {run_id} is {run.status}, not running; nothing to do", flush=True)
        return 0
    try:
        import torch
    except (ImportError, OSError) as exc:
        # A memory cap below what PyTorch itself needs fails here, before any training.
        cap = run.config.memory_cap_mb
        hint = (f"; memory_cap_mb={cap} is too small to load PyTorch (try >= 1024)"
                if cap else "")
        store.set_status(run_id, OOM if cap else FAILED,
                         f"could not load PyTorch: {str(exc)[:300]}{hint}")
        return 1

    from .run_analysis import window_handler
    from .telemetry import TelemetrySampler
    from .train import Diverged, train

    cfg = run.config
    buffer = MetricBuffer(store, run_id)
    print(f"[trainer] run {run_id}: {cfg.to_json()} on {run.device_key}", flush=True)

    on_window = window_handler(store, run_id, run.device_key)
    peak = device_peak(store, run_id, run.device_key, cfg)
    sampler = TelemetrySampler(run.device_key, lambda rows: store.write_telemetry(run_id, rows))
    sampler.start()
    try:
        result = train(cfg, run.device_key, emit=buffer, should_stop=lambda: stop.requested,
                       run_dir=store.run_dir(run_id), on_window=on_window,
                       peak_flops=peak)
    except Diverged as exc:
        buffer.close()
        finalize_run_data(store, run_id)
        store.set_status(run_id, DIVERGED, str(exc))
        return 0
    except (torch.OutOfMemoryError, MemoryError) as exc:
        buffer.close()
        _record_oom(store, run_id, cfg.batch_size, exc)
        return 0
    except Exception as exc:
        buffer.close()
        traceback.print_exc()
        if looks_like_oom(exc):
            _record_oom(store, run_id, cfg.batch_size, exc)
        else:
            store.set_status(run_id, FAILED, f"{type(exc).__name__}: {exc}"[:2000])
        return 1
    finally:
        sampler.stop()
    buffer.close()
    summary = result_summary(result, peak)
    store.merge_summary(run_id, summary)
    final = STOPPED if result.status == "stopped" else FINISHED
    finalize_run_data(store, run_id)
    store.set_status(run_id, final, result.reason)
    print(f"[trainer] run {run_id}: {final} after {result.steps_completed} steps", flush=True)
    return 0


def device_peak(store: Store, run_id: str, device_key: str, cfg) -> float | None:
    """Dense peak FLOP/s for this run's precision: datasheet, or measured once and cached.

    Measured before telemetry and training start, while the device is ours, so the
    microbenchmark neither competes with the run nor is disturbed by it.
    """
    from .devices import get_device
    from .peaks import compute_dtype_for, fp8_advice, peak_for

    try:
        peak = peak_for(get_device(device_key), compute_dtype_for(cfg.precision))
    except Exception as exc:  # noqa: BLE001 - MFU is optional; the run is not
        store.merge_summary(run_id, {"mfu_note": f"peak unavailable: {exc}"})
        return None
    store.merge_summary(run_id, {"peak_flops": peak.flops_per_s, "peak_source": peak.source,
                                 "mfu_note": peak.note, "fp8_advice": fp8_advice(cfg)})
    return peak.flops_per_s


def looks_like_oom(exc: BaseException) -> bool:
    text = str(exc)
    return "can't allocate memory" in text or "out of memory" in text.lower()


def _record_oom(store: Store, run_id: str, batch_size: int, exc: BaseException) -> None:
    from .train import memory_snapshot  # torch is loaded by now

    import torch

    run = store.get_run(run_id)
    mem = memory_snapshot(torch.device(run.device_key))
    used = mem.get("mem_reserved_bytes") or mem.get("rss_bytes") or 0
    store.merge_summary(run_id, {"oom_batch_size": batch_size, "oom_mem_bytes": used})
    store.set_status(run_id, OOM, f"out of memory at batch size {batch_size} "
                                  f"(memory in use at failure: {used / 2**30:.2f} GiB): "
                                  f"{str(exc).splitlines()[0][:300]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.worker")
    parser.add_argument("run_id")
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    store = Store()
    if args.train:
        return run_trainer(args.run_id, store)
    return supervise(args.run_id, store)


if __name__ == "__main__":
    sys.exit(main())
