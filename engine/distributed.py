"""Multi-process runs (RunConfig.nprocs > 1): torchrun starts the ranks, this module
decides what is allowed, keeps track of the rank processes and says why a run failed.

Processes of such a run:

    supervisor  `python -m engine.worker RUN_ID` (no torch; leads the run's process group)
      agent     `python -m engine.distributed agent RUN_ID`: torchrun, in-process
                (torch.distributed.run --standalone --nproc-per-node N --max-restarts 0)
        rank 0  `python -m engine.distributed rank RUN_ID`: trains, writes the metrics,
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

No torch import at module level: the supervisor, the launcher and the UI use the
decisions and the bookkeeping; the agent and the ranks import torch when they start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .config import CommHook, ConfigError, Precision, RunConfig, Sharding

if TYPE_CHECKING:
    from .devices import DeviceInfo
    from .store import RunRecord, Store

MAX_CPU_PROCS = 8  # each CPU process trains a whole replica on shared cores
RANKS_DIRNAME = "ranks"
FAILURE_FILENAME = "failure.json"
AGENT_PID_ENV = "PRECISION_LAB_AGENT_PID"
FAULT_ENV = "PRECISION_LAB_INJECT_FAULT"  # "rank=1,step=3": raise there (fault tests)
STOP_FORWARD_GRACE_S = 2.5  # supervisor: SIGTERM to agent and ranks, SIGKILL after this
AGENT_SHUTDOWN_TIMEOUT_S = 3  # torchrun: SIGTERM to ranks, SIGKILL after this
POLL_S = 0.1


# ---------------------------------------------------------------------------------------
# what a machine allows


def cpu_proc_limit(cpu_count: int | None) -> int:
    """Processes a CPU run may ask for: they share the cores, so a few per core at most."""
    return max(2, min(MAX_CPU_PROCS, 2 * (cpu_count or 1)))


def cuda_device_keys(first_key: str, nprocs: int) -> list[str]:
    """The GPUs of an N-process CUDA run: one per rank, from the run's device upwards."""
    _, _, index = first_key.partition(":")
    first = int(index or 0)
    return [f"cuda:{first + offset}" for offset in range(nprocs)]


def max_procs_for(dev: "DeviceInfo", usable_gpu_keys: list[str], cpu_count: int | None) -> int:
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


def check_parallel(cfg: RunConfig, dev: "DeviceInfo", usable_gpu_keys: list[str],
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


# ---------------------------------------------------------------------------------------
# rank processes on record


def ranks_dir(run_dir: Path) -> Path:
    return Path(run_dir) / RANKS_DIRNAME


def record_rank_process(run_dir: Path, pid: int, create_time: float | None,
                        rank: int | None = None) -> None:
    """Remember a rank process (written atomically: readers never see half a file)."""
    folder = ranks_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pid}.json"
    if rank is None and path.exists():
        return  # the rank's own record (with its rank number) wins
    _write_json(path, {"pid": pid, "create_time": create_time, "rank": rank})


def recorded_rank_processes(run_dir: Path) -> list[dict[str, Any]]:
    folder = ranks_dir(run_dir)
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.stem.isdigit():
            record = _read_json(path)
            if record and isinstance(record.get("pid"), int):
                records.append(record)
    return records


def live_rank_pids(run_dir: Path) -> list[int]:
    """Recorded rank processes still running (same create time: not a reused pid)."""
    import psutil

    alive = []
    for record in recorded_rank_processes(run_dir):
        try:
            proc = psutil.Process(record["pid"])
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            expected = record.get("create_time")
            if expected is not None and abs(proc.create_time() - expected) > 1.0:
                continue
            alive.append(record["pid"])
        except (psutil.Error, OSError):
            continue
    return alive


def signal_rank_processes(run_dir: Path, sig: int) -> int:
    """Send `sig` to every live recorded rank and its own session's group; how many."""
    pids = live_rank_pids(run_dir)
    for pid in pids:
        try:
            # torchrun made each rank a session leader: its group holds its own children
            # (e.g. torch.compile workers) and nothing else.
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return len(pids)


def wait_ranks_gone(run_dir: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while live_rank_pids(run_dir):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


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
# supervisor side (engine.worker.supervise calls supervise_distributed)


def supervise_distributed(run: "RunRecord", store: "Store", stop,
                          preexec_fn: Callable[[], None] | None = None) -> None:
    """Start the torchrun agent, wait for it (forwarding a stop) and record the outcome."""
    run_dir = store.run_dir(run.id)
    print(f"[supervisor] run {run.id}: starting {run.config.nprocs} ranks with torchrun",
          flush=True)
    # memory_cap_mb is inherited by the agent's children: a cap per process.
    agent = subprocess.Popen([sys.executable, "-m", "engine.distributed", "agent", run.id],
                             preexec_fn=preexec_fn)
    store.update_run(run.id, train_pid=agent.pid)
    return_code = _wait_agent(agent, run_dir, stop)
    # Whatever the agent managed, no rank outlives the run.
    if signal_rank_processes(run_dir, signal.SIGKILL):
        wait_ranks_gone(run_dir, timeout_s=2.0)
    record_distributed_exit(store, run.id, return_code, stop.requested)


def _wait_agent(agent: subprocess.Popen, run_dir: Path, stop) -> int:
    seen: set[int] = set()
    forwarded_at = None
    while True:
        _record_children(agent.pid, run_dir, seen)
        try:
            return agent.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
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
    from .store import ACTIVE_STATUSES, FAILED, STOPPED

    run = store.get_run(run_id)
    if run.status not in ACTIVE_STATUSES:
        return
    step = run.steps_completed
    if stop_requested:
        store.set_status(run_id, STOPPED, f"stopped by request at step {step}")
        return
    failure = _read_json(ranks_dir(store.run_dir(run_id)) / FAILURE_FILENAME)
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
    hint = " (the kernel's OOM killer or a memory cap?)" if sig == signal.SIGKILL else ""
    return f"rank {rank} exited with signal {sig} ({_signal_name(sig)}) at step {step}{hint}"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _exit_words(return_code: int) -> str:
    if return_code < 0:
        return f"exited with signal {-return_code} ({_signal_name(-return_code)})"
    return f"exited with code {return_code}"


def write_rank_error(run_dir: Path, rank: int, status: str, reason: str,
                     step: int | None) -> None:
    _write_json(ranks_dir(run_dir) / f"rank{rank}.error.json",
                {"rank": rank, "status": status, "reason": reason[:2000], "step": step,
                 "time_s": time.time()})


def read_rank_errors(run_dir: Path) -> dict[int, dict[str, Any]]:
    errors = {}
    for path in ranks_dir(run_dir).glob("rank*.error.json"):
        record = _read_json(path)
        if record and isinstance(record.get("rank"), int) and record.get("reason"):
            errors[record["rank"]] = record
    return errors


# ---------------------------------------------------------------------------------------
# the agent: torchrun in-process


def torchrun_args(nprocs: int, run_id: str) -> list[str]:
    """torchrun's command line for a run: one node, no restarts (a failure is a result)."""
    return ["--standalone", "--nproc-per-node", str(nprocs), "--max-restarts", "0",
            "--monitor-interval", str(POLL_S),
            "--shutdown-timeout", str(AGENT_SHUTDOWN_TIMEOUT_S),
            "-m", "engine.distributed", "rank", run_id]


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
        _write_json(ranks_dir(run_dir) / FAILURE_FILENAME, {"status": status, "reason": reason})
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


def injected_fault(rank: int) -> int | None:
    """The step at which this rank must raise, from PRECISION_LAB_INJECT_FAULT
    ("rank=1,step=3"), for fault tests of the real process tree; None normally."""
    spec = os.environ.get(FAULT_ENV, "")
    try:
        fields = dict(part.split("=", 1) for part in spec.split(",") if part)
        return int(fields["step"]) if int(fields["rank"]) == rank else None
    except (KeyError, ValueError):
        return None


def rank_main(run_id: str) -> int:
    _die_with_agent()
    from .launcher import process_create_time
    from .store import Store

    store = Store()
    rank = int(os.environ.get("RANK", "0"))
    record_rank_process(store.run_dir(run_id), os.getpid(), process_create_time(os.getpid()),
                        rank=rank)
    from .parallel import run_rank

    return run_rank(run_id, store, rank)


# ---------------------------------------------------------------------------------------
# files


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m engine.distributed")
    parser.add_argument("role", choices=("agent", "rank"))
    parser.add_argument("run_id")
    args = parser.parse_args(argv)
    if args.role == "rank":
        return rank_main(args.run_id)
    from .store import Store

    return run_agent(args.run_id, Store())


if __name__ == "__main__":
    sys.exit(main())
