"""Multi-process runs (RunConfig.nprocs > 1): torchrun starts the ranks; this module is the
supervisor's side (start the agent, forward a stop, record the outcome), the agent, and
the verdict of why a run failed. What a machine allows is engine.admission; the records of
the rank processes are engine.run.ranks; one rank's life is engine.run.rank.

Processes of such a run:

    supervisor  `python -m engine.run.worker RUN_ID` (no torch; leads the run's process group)
      agent     `python -m engine.run.torchrun agent RUN_ID`: torchrun, in-process
                (torch.distributed.run --standalone --nproc-per-node N --max-restarts 0)
        rank 0  `python -m engine.run.torchrun rank RUN_ID`: trains, writes the metrics,
                the summary and the final status (finished, stopped, diverged)
        rank 1.. train in lockstep; telemetry rows only

- Failures: the agent runs torchrun in-process so a failed rank arrives as data
  (ChildFailedError.failures: rank -> exit code or signal), and each rank writes its own
  exception to runs/<id>/ranks/rank<N>.error.json. `failure_reason` picks the rank that
  failed first and the agent stores it in runs/<id>/ranks/failure.json; the supervisor
  sets the status from it ("rank 1 exited with signal 9 (SIGKILL) at step 12").
- Stop: torchrun starts every rank in a new session, so signalling the run's process
  group does not reach them. Every rank process is recorded in runs/<id>/ranks/<pid>.json
  (by the supervisor as soon as it appears under the agent, and by the rank itself), and
  stop and reconcile signal those as well. Each rank also asks the kernel for SIGKILL
  when the agent dies (PR_SET_PDEATHSIG): a killed agent leaves no training orphans.
- A stop request reaches every rank (SIGTERM) but the ranks leave the loop together: the
  flag is OR-ed across ranks in the one collective of each log boundary, so no rank waits
  forever in an all-reduce that its peers have left.

No torch import at module level: the supervisor imports this module; the agent and the
ranks import torch when they start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from engine.proc import process_create_time, signal_name
from engine.run.ranks import (
    ranks_dir,
    read_json,
    read_rank_errors,
    record_rank_process,
    signal_rank_processes,
    wait_ranks_gone,
    write_json,
)
from engine.run.watch import RunWatch
from engine.schema import ACTIVE_STATUSES, FAILED, FAILURE_FILENAME, STOPPED

if TYPE_CHECKING:
    from engine.store import RunRecord, Store

AGENT_PID_ENV = "PRECISION_LAB_AGENT_PID"
STOP_FORWARD_GRACE_S = 2.5  # supervisor: SIGTERM to agent and ranks, SIGKILL after this
AGENT_SHUTDOWN_TIMEOUT_S = 3  # torchrun: SIGTERM to ranks, SIGKILL after this
POLL_S = 0.1


def _record_children(agent_pid: int, run_dir: Path, seen: set[int]) -> None:
    """Record the agent's children (the ranks) as soon as they appear."""
    import psutil

    try:
        children = psutil.Process(agent_pid).children()
    except (psutil.Error, OSError):
        return
    for child in children:
        if child.pid not in seen:
            try:
                record_rank_process(run_dir, child.pid, child.create_time())
                seen.add(child.pid)
            except (psutil.Error, OSError):
                continue


# ---------------------------------------------------------------------------------------
# supervisor side (engine.run.worker.supervise calls supervise_distributed)


def supervise_distributed(run: "RunRecord", store: "Store", stop,
                          preexec_fn: Callable[[], None] | None = None) -> None:
    """Start the torchrun agent, wait for it (forwarding a stop) and record the outcome."""
    run_dir = store.run_dir(run.id)
    print(f"[supervisor] run {run.id}: starting {run.config.nprocs} ranks with torchrun",
          flush=True)
    # memory_cap_mb is inherited by the agent's children: a cap per process.
    agent = subprocess.Popen([sys.executable, "-m", "engine.run.torchrun", "agent", run.id],
                             preexec_fn=preexec_fn)
    store.update_run(run.id, train_pid=agent.pid)
    watch = RunWatch(store, run.id)
    return_code = _wait_agent(agent, run_dir, stop, on_tick=watch.tick)
    watch.close()
    # Whatever the agent managed, no rank outlives the run.
    if signal_rank_processes(run_dir, signal.SIGKILL):
        wait_ranks_gone(run_dir, timeout_s=2.0)
    record_distributed_exit(store, run.id, return_code, stop.requested)


def _wait_agent(agent: subprocess.Popen, run_dir: Path, stop,
                on_tick: Callable[[], None] = lambda: None) -> int:
    seen: set[int] = set()
    forwarded_at = None
    while True:
        _record_children(agent.pid, run_dir, seen)
        try:
            return agent.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        on_tick()
        if stop.requested and forwarded_at is None:
            forwarded_at = time.monotonic()
            agent.send_signal(signal.SIGTERM)  # torchrun forwards it to the ranks ...
            signal_rank_processes(run_dir, signal.SIGTERM)  # ... and they get it directly
        if forwarded_at is not None and time.monotonic() - forwarded_at > STOP_FORWARD_GRACE_S:
            signal_rank_processes(run_dir, signal.SIGKILL)
            agent.kill()


def record_distributed_exit(store: "Store", run_id: str, return_code: int,
                            stop_requested: bool) -> None:
    """Rank 0 writes finished/stopped/diverged itself; this covers every other ending."""
    run = store.get_run(run_id)
    if run.status not in ACTIVE_STATUSES:
        return
    step = run.steps_completed
    if stop_requested:
        store.set_status(run_id, STOPPED, f"stopped by request at step {step}")
        return
    failure = read_json(ranks_dir(store.run_dir(run_id)) / FAILURE_FILENAME)
    if failure and failure.get("reason"):
        store.set_status(run_id, failure.get("status") or FAILED, failure["reason"])
    elif return_code == 0:
        store.set_status(run_id, STOPPED, f"the ranks stopped at step {step} on a "
                                          "termination signal (not a stop request)")
    else:
        store.set_status(run_id, FAILED, f"torchrun agent {_exit_words(return_code)} at step "
                                         f"{step}; see worker.log")


# ---------------------------------------------------------------------------------------
# why a run failed


@dataclass(frozen=True)
class RankExit:
    """One failed rank as torchrun saw it (ProcessFailure)."""
    rank: int
    exitcode: int  # < 0: killed by signal -exitcode
    detected_s: float  # when torchrun noticed (whole seconds without an error file)


# How a collective fails when a peer process is gone (gloo, NCCL): a consequence, not a cause.
_LOST_PEER_WORDS = ("closed by peer", "reset by peer", "broken pipe", "connection refused",
                    "remote process exited", "communicator was aborted")


def lost_peer_error(error: dict[str, Any]) -> bool:
    reason = str(error.get("reason", "")).lower()
    return any(words in reason for words in _LOST_PEER_WORDS)


def failure_reason(exits: list[RankExit], errors: dict[int, dict[str, Any]],
                   step: int) -> tuple[str, str]:
    """(status, reason) of the rank that failed first.

    When one rank dies its peers fail too: their collectives break ("connection closed by
    peer"), and torchrun SIGTERMs the rest. So, in order: a rank killed by another signal,
    when every exception the ranks reported is such a consequence or came later (within
    torchrun's whole-second timestamps); the earliest exception that is not a consequence;
    the earliest exception; the first failure torchrun noticed other than its SIGTERMs.
    """
    causes = {rank: e for rank, e in errors.items() if not lost_peer_error(e)}
    first_cause_s = min((e.get("time_s", float("inf")) for e in causes.values()), default=None)
    for item in exits:
        killed = item.exitcode < 0 and -item.exitcode != signal.SIGTERM
        if killed and item.rank not in errors and (
                first_cause_s is None or item.detected_s <= int(first_cause_s) + 1):
            return "failed", _signal_reason(item.rank, -item.exitcode, step)
    if errors:
        rank, error = min((causes or errors).items(),
                          key=lambda kv: kv[1].get("time_s", float("inf")))
        where = f" (at step {error['step']})" if error.get("step") is not None else ""
        return error.get("status", "failed"), f"rank {rank}: {error['reason']}{where}"
    if not exits:
        return "failed", f"torchrun reported a failure without a failed rank at step {step}"
    item = next((e for e in exits if e.exitcode != -signal.SIGTERM), exits[0])
    if item.exitcode < 0:
        return "failed", _signal_reason(item.rank, -item.exitcode, step)
    return "failed", (f"rank {item.rank} exited with code {item.exitcode} at step {step}; "
                      "see worker.log")


def _signal_reason(rank: int, sig: int, step: int) -> str:
    # No OOM guess: the agent has no evidence of which process the kernel killed.
    return f"rank {rank} exited with signal {sig} ({signal_name(sig)}) at step {step}"


def _exit_words(return_code: int) -> str:
    if return_code < 0:
        return f"exited with signal {-return_code} ({signal_name(-return_code)})"
    return f"exited with code {return_code}"


# ---------------------------------------------------------------------------------------
# the agent: torchrun in-process


def torchrun_args(nprocs: int, run_id: str) -> list[str]:
    """torchrun's command line for a run: one node, no restarts (a failure is a result)."""
    return ["--standalone", "--nproc-per-node", str(nprocs), "--max-restarts", "0",
            "--monitor-interval", str(POLL_S),
            "--shutdown-timeout", str(AGENT_SHUTDOWN_TIMEOUT_S),
            "-m", "engine.run.torchrun", "rank", run_id]


def run_agent(run_id: str, store: "Store") -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as torchrun

    run = store.get_run(run_id)
    os.environ[AGENT_PID_ENV] = str(os.getpid())  # the ranks check their parent with it
    print(f"[agent] run {run_id}: torchrun {' '.join(torchrun_args(run.config.nprocs, run_id))}",
          flush=True)
    try:
        torchrun(parse_args(torchrun_args(run.config.nprocs, run_id)))
    except ChildFailedError as exc:
        run_dir = store.run_dir(run_id)
        exits = [RankExit(rank, failure.exitcode, float(failure.timestamp))
                 for rank, failure in exc.failures.items()]
        status, reason = failure_reason(exits, read_rank_errors(run_dir),
                                        store.get_run(run_id).steps_completed)
        write_json(ranks_dir(run_dir) / FAILURE_FILENAME, {"status": status, "reason": reason})
        print(f"[agent] run {run_id}: {status}: {reason}", flush=True)
        return 1
    except SignalException as exc:
        print(f"[agent] run {run_id}: ranks shut down on {exc.sigval.name}", flush=True)
        return 128 + int(exc.sigval)
    return 0


# ---------------------------------------------------------------------------------------
# a rank process


def _die_with_agent() -> None:
    """Ask Linux to SIGKILL this rank when its parent (the agent) dies: a killed agent
    must not leave ranks training on. Exit at once if the agent is already gone."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux: stop/reconcile still kill
        return
    agent_pid = os.environ.get(AGENT_PID_ENV)
    if agent_pid and os.getppid() != int(agent_pid):
        sys.exit(f"[rank] the torchrun agent {agent_pid} is gone; not starting")


def rank_main(run_id: str) -> int:
    _die_with_agent()
    from engine.store import Store  # after the agent check: a rank whose agent died exits first

    store = Store()
    rank = int(os.environ.get("RANK", "0"))
    record_rank_process(store.run_dir(run_id), os.getpid(), process_create_time(os.getpid()),
                        rank=rank)
    from engine.run.rank import run_rank  # imports torch: only the rank process needs it

    return run_rank(run_id, store, rank)


# ---------------------------------------------------------------------------------------
# entry point


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m engine.run.torchrun")
    parser.add_argument("role", choices=("agent", "rank"))
    parser.add_argument("run_id")
    args = parser.parse_args(argv)
    if args.role == "rank":
        return rank_main(args.run_id)
    from engine.store import Store  # the agent's store; rank_main opens its own after its check

    return run_agent(args.run_id, Store())


if __name__ == "__main__":
    sys.exit(main())
