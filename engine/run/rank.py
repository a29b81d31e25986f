"""One rank of a multi-process run, as torchrun starts it (`python -m engine.run.torchrun
rank RUN_ID`): join the process group, run THE trainer session (engine.run.session) with
this rank's share of the work, and report how it ended.

Rank 0 writes metrics, summary and the final status when the run ends as a whole
(finished, stopped, diverged); a rank that fails writes its own error record and exits
non-zero, and the supervisor sets the status from torchrun's report (engine.run.torchrun).
"""

from __future__ import annotations

import signal
import traceback

from engine.run.ranks import injected_fault, write_rank_error
from engine.run.session import (
    MetricBuffer,
    Outcome,
    SessionSpec,
    StopFlag,
    finish,
    is_oom,
    run_session,
)
from engine.run.window import window_handler
from engine.schema import FAILED, OOM, RUNNING
from engine.store import Store
from engine.training.parallel import ParallelContext


def run_rank(run_id: str, store: Store, rank: int) -> int:
    """Train one rank; 1 when this rank failed (its error record says why)."""
    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop)  # torchrun forwards stop requests as SIGTERM
    signal.signal(signal.SIGINT, stop)
    run = store.get_run(run_id)
    if run.status != RUNNING:
        print(f"[rank{rank}] run {run_id} is {run.status}, not running; nothing to do", flush=True)
        return 0
    run_dir = store.run_dir(run_id)
    step_box: dict = {"step": None}
    try:
        return _rank_life(run, store, rank, stop, step_box)
    except Exception as exc:  # noqa: BLE001 - whatever failed, torchrun's verdict needs it
        traceback.print_exc()
        status = OOM if is_oom(exc) else FAILED
        text = f"{type(exc).__name__}: {exc}"
        reason = (f"out of memory at batch size {run.config.batch_size} per rank: "
                  f"{text.splitlines()[0][:300]}" if status == OOM else text.splitlines()[0][:1000])
        write_rank_error(run_dir, rank, status, reason, step_box["step"])
        # No destroy_process_group here: the peers may be gone and tearing the group down
        # could block; the process exits now anyway.
        return 1


def _rank_life(run, store: Store, rank: int, stop: StopFlag, step_box: dict) -> int:
    """Join the group, train, record; a failure the session returned is written here."""
    ctx = ParallelContext.start(run.config, run.device_key)
    outcome = _train_rank(run, store, ctx, stop, step_box)
    if outcome.status in (OOM, FAILED):
        reason = outcome.reason if outcome.status == OOM else \
            f"{type(outcome.error).__name__}: {outcome.error}".splitlines()[0][:1000]
        write_rank_error(store.run_dir(run.id), rank, outcome.status, reason, step_box["step"])
        return 1
    if ctx.rank == 0:
        finish(store, run.id, outcome)
        print(f"[rank0] run {run.id}: {outcome.status} after "
              f"{outcome.summary.get('steps_completed', step_box['step'])} steps", flush=True)
    # Other ranks leave the rest to rank 0: a divergence is of the aggregated loss, so every
    # rank diverges at the same step, and rank 0 records it.
    ctx.close()
    return 0


def _train_rank(run, store: Store, ctx: ParallelContext, stop: StopFlag,
                step_box: dict) -> Outcome:
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

    spec = SessionSpec(
        run_id=run_id, cfg=cfg, device_key=ctx.device_key, sink=store, emit=emit,
        telemetry=lambda rows: store.write_telemetry(run_id, rows, rank=ctx.rank),
        should_stop=lambda: stop.requested,
        run_dir=store.run_dir(run_id) if lead else None,
        on_window=window_handler(store, run_id, ctx.device_key) if lead else None,
        lead=lead, parallel=ctx,
        # every rank profiles the same steps: the Kernels page and `engine kernels RUN --set`
        # show the ranks side by side (traces.sets)
        rank_trace_dir=None if lead else store.run_dir(run_id))
    return run_session(spec, close_metrics=buffer.close if buffer is not None else _nothing)


def _nothing() -> None:
    """close_metrics of a rank that writes no metric rows."""
