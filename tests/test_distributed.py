"""Multi-process runs on the CPU: real torchrun, real gloo, real SQLite.

The end-to-end tests start 2-rank mlp-tiny runs through engine.run.launcher (or the CLI) and
observe them through the store and psutil; the rest tests the decisions (what a machine
allows, which rank failed first, FSDP2's dtypes, GPU claims) without processes, including
the CUDA-only paths, whose decision logic needs no GPU.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time

import psutil
import pytest

from engine.admission import (
    bf16_comm_hook_problem,
    bf16_hook_problem_for,
    check_parallel,
    check_runnable,
    cpu_proc_limit,
    cuda_device_keys,
    fsdp2_dtypes,
)
from engine.config import MAX_NPROCS, ConfigError, RunConfig
from engine.hardware.devices import DeviceInfo
from engine.run.launcher import launch, read_log_tail, stop
from engine.run.ranks import (
    FAULT_ENV,
    live_rank_pids,
    recorded_rank_processes,
    signal_rank_processes,
)
from engine.run.torchrun import RankExit, failure_reason, torchrun_args
from engine.schema import FAILED, FINAL_STATUSES, FINISHED, RUNNING, STOPPED
from engine.store import Store
from tests.chart_support import charts_by_title

TWO = RunConfig(model="mlp", size="tiny", batch_size=8, steps=10, warmup_steps=2,
                profile=False, device="cpu", nprocs=2)
LONG = TWO.replace(steps=1_000_000)
RUN_TIMEOUT_S = 120  # a 2-rank mlp-tiny run takes ~9 s on an idle 2-core box

real_ranks = pytest.mark.usefixtures("one_thread_workers", "no_rank_left")


@pytest.fixture
def no_rank_left(home):
    """Ranks live in their own sessions: after the test, kill any this home recorded."""
    yield
    runs_dir = home / "runs"
    for run_dir in runs_dir.iterdir() if runs_dir.is_dir() else []:
        signal_rank_processes(run_dir, signal.SIGKILL)


def log_of(store, run_id):
    return lambda: (f"run {run_id}: {store.get_run(run_id)}\nworker.log:\n"
                    f"{read_log_tail(run_id, store, 4000)}")


def wait_final(store, run_id, wait_for, timeout_s=RUN_TIMEOUT_S):
    wait_for(lambda: store.get_run(run_id).status in FINAL_STATUSES, timeout_s,
             message=log_of(store, run_id))
    return store.get_run(run_id)


def rank_pid(store, run_id, rank, wait_for) -> int:
    def find():
        return next((r["pid"] for r in recorded_rank_processes(store.run_dir(run_id))
                     if r.get("rank") == rank), None)
    return wait_for(find, 60, message=log_of(store, run_id))


def run_processes(run) -> list[psutil.Process]:
    """The supervisor and everything under it (the agent, the ranks in their sessions)."""
    root = psutil.Process(run.pid)
    return [root, *root.children(recursive=True)]


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---------------------------------------------------------------------------------------
# end to end, through engine.run.launcher and the store


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_two_rank_run_records_mean_loss_global_throughput_and_both_ranks_telemetry(
        store, wait_for):
    import torch

    # A learning rate this small leaves the weights at their initial values, so the
    # expected loss of each step can be recomputed here from each rank's batches.
    cfg = TWO.replace(lr=1e-9, steps=6)
    run_id = launch(cfg, store)
    run = wait_final(store, run_id, wait_for)
    assert run.status == FINISHED, log_of(store, run_id)()

    frame = store.read_metrics(run_id, max_points=None)
    assert list(frame["step"]) == list(range(1, cfg.steps + 1))  # one row per step
    assert run.summary["parallel"] == {"nprocs": 2, "sharding": "ddp", "comm_hook": "none",
                                       "backend": "gloo"}
    # Throughput counts both ranks: 2 x batch_size samples per step.
    for row in frame.itertuples():
        assert row.samples_per_s == pytest.approx(2 * cfg.batch_size * 1000.0 / row.step_time_ms)

    # The logged loss is the mean of the two ranks' losses on their own batches.
    from engine.training.data import SyntheticTask
    from engine.training.loop import Trainer, compute_loss

    device = torch.device("cpu")
    model = Trainer(cfg, device).model  # the same seed: the ranks' initial weights
    tasks = [SyntheticTask(cfg, device, stream=rank) for rank in (0, 1)]
    rank_gaps = []
    with torch.no_grad():
        for step in range(1, cfg.steps + 1):
            losses = [float(compute_loss(cfg, model(x), y)) for x, y in (t.batch() for t in tasks)]
            logged = float(frame.loc[frame["step"] == step, "loss"].iloc[0])
            assert logged == pytest.approx(sum(losses) / 2, abs=2e-5), (step, losses)
            rank_gaps.append(abs(losses[0] - losses[1]))
    assert max(rank_gaps) > 1e-4  # the ranks' losses differ: the mean is not rank 0's alone

    telemetry = store.read_telemetry(run_id, max_points=None)
    assert set(telemetry["rank"]) == {0, 1}
    assert (telemetry["rss_bytes"] > 0).all()
    # Rank 0 records "finished" before the ranks have exited: they must all go soon after.
    wait_for(lambda: not live_rank_pids(store.run_dir(run_id)), 20,
             message="every rank process to exit after the run finished")


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_fp16_comm_hook_over_gloo_trains_and_rank_0_profiles_the_collectives(store, wait_for,
                                                                              cli):
    import gzip

    run_id = launch(TWO.replace(comm_hook="fp16", steps=15, profile=True), store)
    run = wait_final(store, run_id, wait_for)
    assert run.status == FINISHED, log_of(store, run_id)()
    assert run.summary["parallel"]["comm_hook"] == "fp16"
    assert run.summary["final_loss"] < run.summary["first_loss"]
    assert "profile_error" not in run.summary and run.summary["cpu_evidence"]["verdict"]
    with gzip.open(store.run_dir(run_id) / "trace.json.gz", "rt") as handle:
        names = {event.get("name") for event in json.load(handle)["traceEvents"]}
    assert "gloo:all_reduce" in names  # DDP's gradient all-reduce, in rank 0's window
    # every rank profiled the same window: the ranks side by side, from the run id
    from engine.traces.explain import run_rank_traces
    from engine.traces.sets import analyze_set

    members = run_rank_traces(store, run)
    assert [label for label, _ in members] == ["rank-0", "rank-1"]
    result = analyze_set(members)
    assert [row["rank"] for row in result["ranks"]] == [0, 1]
    assert all(row["kind"] == "cpu" and row["step_time_us"] > 0 and row["communication_us"]
               for row in result["ranks"])
    assert result["slowest"]["rank"] in (0, 1) and "2 rank traces" in result["sentence"]
    shown = cli("kernels", run_id, "--set", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["trace_set"]["ranks"] == json.loads(json.dumps(
        result["ranks"]))
    from test_kernels_page import _kernels_page  # the Kernels page of this run

    page = _kernels_page(run_id)
    assert "Ranks side by side" in [header.value for header in page.subheader]
    assert result["sentence"] in [text.value for text in page.text]


def test_bf16_comm_hook_is_refused_where_torch_refuses_it(store):
    problem = bf16_comm_hook_problem()
    if problem is None:
        pytest.skip("this PyTorch is a CUDA build with NCCL 2.10+: DDP accepts the bf16 hook")
    with pytest.raises(ConfigError) as error:
        launch(TWO.replace(comm_hook="bf16"), store)
    assert error.value.field == "comm_hook" and error.value.value == "bf16"
    assert "CUDA build" in error.value.fix and "comm_hook fp16" in error.value.fix
    assert store.list_runs() == []  # refused before anything was queued


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_fsdp2_with_bf16_policy_trains_on_cpu_gloo(store, wait_for):
    cfg = TWO.replace(sharding="fsdp2", precision="bf16-amp", comm_hook="bf16", steps=15)
    run_id = launch(cfg, store)
    run = wait_final(store, run_id, wait_for)
    assert run.status == FINISHED, log_of(store, run_id)()
    assert run.summary["parallel"] == {
        "nprocs": 2, "sharding": "fsdp2", "comm_hook": "bf16", "backend": "gloo",
        "fsdp2_param_dtype": "bf16", "fsdp2_reduce_dtype": "bf16"}
    assert run.summary["final_loss"] < run.summary["first_loss"]
    assert store.metrics_count(run_id) == cfg.steps


# ---------------------------------------------------------------------------------------
# faults and stop


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_sigkill_of_one_rank_fails_the_run_naming_rank_and_signal(store, wait_for):
    run_id = launch(LONG, store)
    victim = rank_pid(store, run_id, 1, wait_for)
    wait_for(lambda: store.metrics_count(run_id) >= 3, 60, message=log_of(store, run_id))
    run = store.get_run(run_id)
    processes = run_processes(run)
    os.kill(victim, signal.SIGKILL)
    run = wait_final(store, run_id, wait_for, timeout_s=30)
    assert run.status == FAILED
    assert run.reason.startswith("rank 1 exited with signal 9 (SIGKILL) at step "), run.reason
    wait_for(lambda: all(gone(p) for p in processes), 10,
             message=lambda: f"left: {[p.pid for p in processes if not gone(p)]}")


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_exception_on_one_rank_fails_the_run_with_rank_and_message(store, wait_for, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "rank=1,step=3")  # inherited by the worker and its ranks
    run_id = launch(TWO, store)
    run = wait_final(store, run_id, wait_for)
    assert run.status == FAILED
    assert run.reason == "rank 1: RuntimeError: injected fault on rank 1 (at step 3)"


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_stop_ends_every_rank_and_torchrun_within_5s(store, wait_for):
    run_id = launch(LONG, store)
    rank_pid(store, run_id, 1, wait_for)
    wait_for(lambda: store.metrics_count(run_id) >= 2, 60, message=log_of(store, run_id))
    run = store.get_run(run_id)
    processes = run_processes(run)
    assert len(processes) >= 4  # supervisor, torchrun agent, two ranks
    started = time.monotonic()
    stopped = stop(run_id, store)
    elapsed_s = time.monotonic() - started
    assert stopped.status == STOPPED and "stopped by request at step" in stopped.reason
    assert elapsed_s < 5.5, elapsed_s
    assert [p.pid for p in processes if not gone(p)] == []
    assert not live_rank_pids(store.run_dir(run_id))


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_sigkill_of_torchrun_fails_the_run_and_takes_every_rank_with_it(store, wait_for):
    run_id = launch(LONG, store)
    rank_pid(store, run_id, 1, wait_for)
    wait_for(lambda: store.metrics_count(run_id) >= 2, 60, message=log_of(store, run_id))
    run = store.get_run(run_id)
    processes = run_processes(run)
    os.kill(run.train_pid, signal.SIGKILL)  # the torchrun agent
    run = wait_final(store, run_id, wait_for, timeout_s=30)
    assert run.status == FAILED
    assert run.reason.startswith("torchrun agent exited with signal 9 (SIGKILL) at step ")
    wait_for(lambda: all(gone(p) for p in processes), 10,
             message=lambda: f"left: {[p.pid for p in processes if not gone(p)]}")


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_reconcile_ends_the_ranks_of_a_run_whose_supervisor_died(store, wait_for):
    from engine.run.launcher import reconcile

    run_id = launch(LONG, store)
    rank_pid(store, run_id, 1, wait_for)
    wait_for(lambda: store.metrics_count(run_id) >= 2, 60, message=log_of(store, run_id))
    run = store.get_run(run_id)
    processes = run_processes(run)
    os.kill(run.pid, signal.SIGKILL)  # the supervisor alone: torchrun and the ranks go on
    wait_for(lambda: gone(processes[0]), 10)
    assert reconcile(store) == [run_id]
    run = store.get_run(run_id)
    assert run.status == FAILED and f"worker process {run.pid} is gone" in run.reason
    wait_for(lambda: all(gone(p) for p in processes), 15,
             message=lambda: f"left: {[p.pid for p in processes if not gone(p)]}")


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_cli_run_in_the_foreground_with_two_processes_and_flag_errors(cli):
    done = cli("run", "--model", "mlp", "--nprocs", "2", "--steps", "6", "--device", "cpu",
               "--no-profile", "--comm-hook", "fp16", "--json", timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == FINISHED and summary["steps_completed"] == 6

    too_many = cpu_proc_limit(os.cpu_count()) + 1
    for args, expected in [
        (["--nprocs", "0"], "--nprocs 0: out of range [1, 64]"),
        (["--comm-hook", "fp16"], "--comm-hook 'fp16': gradient communication needs several"),
        (["--sharding", "fsdp2"], "--sharding 'fsdp2': fsdp2 shards the model across"),
        (["--nprocs", "2", "--comm-hook", "int8"], "--comm-hook 'int8': unknown communication"),
        (["--nprocs", str(too_many), "--device", "cpu"], f"--nprocs {too_many}: at most"),
    ]:
        bad = cli("launch", "--model", "mlp", *args)
        assert bad.returncode == 2, (args, bad.stderr)
        assert bad.stderr.startswith(f"error: {expected}"), (args, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1



# ---------------------------------------------------------------------------------------
# config


def test_multi_process_fields_validate_naming_field_value_and_fix():
    assert RunConfig().nprocs == 1 and RunConfig().sharding == "ddp"
    assert RunConfig().comm_hook == "none"
    cases = [
        (dict(nprocs=0), "nprocs", "out of range"),
        (dict(nprocs=MAX_NPROCS + 1), "nprocs", "out of range"),
        (dict(nprocs=2.0), "nprocs", "whole number"),
        (dict(nprocs=True), "nprocs", "whole number"),
        (dict(nprocs=2, sharding="zero3"), "sharding", "choose one of ddp, fsdp2"),
        (dict(nprocs=2, comm_hook="int8"), "comm_hook", "choose one of none, fp16, bf16"),
        (dict(comm_hook="fp16"), "comm_hook", "set nprocs to 2 or more"),
        (dict(sharding="fsdp2"), "sharding", "set nprocs to 2 or more"),
        (dict(nprocs=2, sharding="fsdp2", precision="fp8"), "sharding", "use sharding ddp"),
        (dict(nprocs=2, sharding="fsdp2", numerics=True), "numerics", "use sharding ddp"),
    ]
    for changes, field, fix in cases:
        with pytest.raises(ConfigError) as error:
            RunConfig(**changes)
        assert error.value.field == field and fix in error.value.fix, (changes, error.value)
    assert RunConfig(nprocs=2, sharding="fsdp2", comm_hook="bf16").label.endswith("x2 procs")


def test_old_stored_configs_load_with_single_process_defaults():
    old = {"model": "mlp", "size": "tiny", "precision": "fp32", "batch_size": 8, "steps": 5}
    cfg = RunConfig.from_json(json.dumps(old))
    assert (cfg.nprocs, cfg.sharding, cfg.comm_hook) == (1, "ddp", "none")
    new = RunConfig(nprocs=2, comm_hook="fp16")
    assert RunConfig.from_json(new.to_json()) == new


def test_check_runnable_limits_cpu_processes_to_the_cores():
    limit = cpu_proc_limit(os.cpu_count())
    _device, warnings = check_runnable(TWO)
    assert any("share this CPU" in w for w in warnings)
    with pytest.raises(ConfigError) as error:
        check_runnable(TWO.replace(nprocs=limit + 1))
    assert error.value.field == "nprocs" and f"nprocs 2..{limit}" in error.value.fix
    assert cpu_proc_limit(1) == 2 and cpu_proc_limit(2) == 4 and cpu_proc_limit(64) == 8


# ---------------------------------------------------------------------------------------
# CUDA-only decisions (no GPU needed to decide)


def _gpu(index: int) -> DeviceInfo:
    return DeviceInfo(key=f"cuda:{index}", kind="cuda", name="H100", capability="sm90",
                      memory_bytes=80 * 2**30, compute_capability=(9, 0))


def test_cuda_runs_take_one_gpu_per_rank_from_the_run_device():
    assert cuda_device_keys("cuda:0", 2) == ["cuda:0", "cuda:1"]
    assert cuda_device_keys("cuda:2", 2) == ["cuda:2", "cuda:3"]
    four = ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    cfg = RunConfig(device="cuda", nprocs=4, precision="bf16-amp")
    assert check_parallel(cfg, _gpu(0), four, 32, bf16_problem=lambda: None) == []
    with pytest.raises(ConfigError) as error:
        check_parallel(cfg.replace(nprocs=2), _gpu(3), four, 32, bf16_problem=lambda: None)
    assert error.value.field == "nprocs" and "cuda:4 is not a usable GPU" in error.value.fix
    assert "use nprocs <= 1" in error.value.fix
    with pytest.raises(ConfigError) as error:
        check_parallel(cfg.replace(nprocs=8), _gpu(0), four, 32, bf16_problem=lambda: None)
    assert "use nprocs <= 4" in error.value.fix


def test_bf16_hook_follows_torchs_own_rule():
    assert bf16_hook_problem_for(True, (2, 21, 5), "2.13.0+cu128") is None
    assert "NCCL 2.10+" in bf16_hook_problem_for(True, (2, 9, 6), "2.13.0+cu118")
    assert "2.13.0+cpu" in bf16_hook_problem_for(False, None, "2.13.0+cpu")
    cfg = RunConfig(device="cuda", nprocs=2, comm_hook="bf16")
    with pytest.raises(ConfigError) as error:
        check_parallel(cfg, _gpu(0), ["cuda:0", "cuda:1"], 32,
                       bf16_problem=lambda: "no NCCL here")
    assert error.value.field == "comm_hook" and error.value.fix.startswith("no NCCL here")
    # FSDP2 reduces in bf16 without DDP's hook: not refused.
    assert check_parallel(cfg.replace(sharding="fsdp2"), _gpu(0), ["cuda:0", "cuda:1"], 32,
                          bf16_problem=lambda: "no NCCL here") == []


def test_fsdp2_policy_dtypes_follow_precision_and_comm_hook():
    assert fsdp2_dtypes("fp32", "none") == (None, "fp32")
    assert fsdp2_dtypes("bf16-amp", "none") == ("bf16", "fp32")
    assert fsdp2_dtypes("bf16-amp", "bf16") == ("bf16", "bf16")
    assert fsdp2_dtypes("fp16-amp", "fp16") == ("fp16", "fp16")
    assert fsdp2_dtypes("bf16-pure", "none") == (None, None)  # gradients are bf16 already
    assert fsdp2_dtypes("tf32", "fp16") == (None, "fp16")


def test_torchrun_command_is_standalone_without_restarts():
    args = torchrun_args(4, "run-1")
    assert args[:6] == ["--standalone", "--nproc-per-node", "4", "--max-restarts", "0",
                        "--monitor-interval"]
    assert args[-4:] == ["-m", "engine.run.torchrun", "rank", "run-1"]


# ---------------------------------------------------------------------------------------
# which rank failed first


def test_a_killed_rank_is_the_cause_not_the_peer_whose_collective_broke():
    exits = [RankExit(0, 1, 100.0), RankExit(1, -9, 100.0)]
    errors = {0: {"rank": 0, "status": "failed", "step": 7, "time_s": 100.4,
                  "reason": "RuntimeError: Connection closed by peer"}}
    assert failure_reason(exits, errors, step=7) == (
        "failed", "rank 1 exited with signal 9 (SIGKILL) at step 7")


def test_a_killed_rank_noticed_late_is_still_the_cause_when_peers_only_lost_it():
    # a loaded machine: torchrun noticed the SIGKILL 3 s after rank 0's collective broke
    exits = [RankExit(0, 1, 100.0), RankExit(1, -9, 103.0)]
    errors = {0: {"status": "failed", "step": 7, "time_s": 100.1,
                  "reason": "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed "
                            "by peer [127.0.0.1]:62593"}}
    assert failure_reason(exits, errors, step=7)[1].startswith("rank 1 exited with signal 9")


def test_an_exception_beats_a_peer_that_only_lost_it_even_if_recorded_later():
    exits = [RankExit(0, 1, 100.0), RankExit(1, 1, 100.0)]
    errors = {0: {"status": "failed", "step": 3, "time_s": 100.1,
                  "reason": "RuntimeError: Connection reset by peer"},
              1: {"status": "failed", "step": 3, "time_s": 100.3, "reason": "KeyError: 'x'"}}
    assert failure_reason(exits, errors, step=3)[1] == "rank 1: KeyError: 'x' (at step 3)"


def test_the_earliest_reported_exception_is_the_cause():
    exits = [RankExit(0, 1, 101.0), RankExit(1, 1, 101.0)]
    errors = {0: {"status": "failed", "step": 3, "time_s": 100.9,
                  "reason": "RuntimeError: peer gone"},
              1: {"status": "failed", "step": 3, "time_s": 100.2, "reason": "ValueError: bad"}}
    assert failure_reason(exits, errors, step=3) == (
        "failed", "rank 1: ValueError: bad (at step 3)")


def test_a_rank_killed_at_teardown_long_after_an_exception_is_not_the_cause():
    # rank 1 raised; rank 0 hung in a collective and torchrun SIGKILLed it 30 s later
    exits = [RankExit(1, 1, 100.0), RankExit(0, -9, 131.0)]
    errors = {1: {"status": "oom", "step": 5, "time_s": 99.8,
                  "reason": "out of memory at batch size 64 per rank: OutOfMemoryError: ..."}}
    status, reason = failure_reason(exits, errors, step=5)
    assert status == "oom" and reason.startswith("rank 1: out of memory at batch size 64")


def test_without_error_records_the_first_failure_other_than_teardown_sigterm_is_named():
    exits = [RankExit(0, -15, 100.0), RankExit(1, 3, 100.0)]
    assert failure_reason(exits, {}, step=2) == (
        "failed", "rank 1 exited with code 3 at step 2; see worker.log")


# ---------------------------------------------------------------------------------------
# store: telemetry ranks, GPU claims


def test_telemetry_rank_column_is_added_to_an_existing_database(tmp_path):
    home = tmp_path / "old_home"
    (home / "runs").mkdir(parents=True)
    with sqlite3.connect(home / "precision_lab.sqlite3") as conn:  # the schema before ranks
        conn.execute("CREATE TABLE telemetry (run_id TEXT NOT NULL, t_s REAL NOT NULL,"
                     " gpu_util_pct REAL, mem_util_pct REAL, gpu_mem_used_bytes INTEGER,"
                     " power_w REAL, power_limit_w REAL, temp_c REAL, sm_clock_mhz REAL,"
                     " throttle_reasons TEXT, cpu_pct REAL, rss_bytes INTEGER)")
        conn.execute("INSERT INTO telemetry (run_id, t_s, cpu_pct) VALUES ('old', 1.0, 50.0)")
        conn.execute("PRAGMA user_version=1")
    store = Store(home)
    Store(home)  # a second open (another process) finds the column and leaves it
    store.write_telemetry("old", [{"t_s": 2.0, "cpu_pct": 70.0}], rank=1)
    frame = store.read_telemetry("old", max_points=None)
    assert frame[["t_s", "rank", "cpu_pct"]].values.tolist() == [[1.0, 0, 50.0], [2.0, 1, 70.0]]


def test_telemetry_is_downsampled_per_rank_keeping_every_rank(store):
    run_id = store.create_run(TWO, "cpu")
    for rank in (0, 1):
        store.write_telemetry(run_id, [{"t_s": 1000.0 + i + rank / 10, "cpu_pct": float(i % 7)}
                                       for i in range(3000)], rank=rank)
    frame = store.read_telemetry(run_id, max_points=400)
    assert set(frame["rank"]) == {0, 1} and len(frame) <= 500
    assert frame["t_s"].is_monotonic_increasing
    for rank in (0, 1):
        assert frame.loc[frame["rank"] == rank, "cpu_pct"].max() == 6.0


def test_a_two_gpu_run_holds_both_gpus_in_the_queue(store):
    two_gpus = store.create_run(RunConfig(device="cuda:0", nprocs=2), "cuda:0")
    on_gpu1 = store.create_run(RunConfig(device="cuda:1"), "cuda:1")
    on_gpu2 = store.create_run(RunConfig(device="cuda:2"), "cuda:2")
    on_cpu = store.create_run(TWO, "cpu")
    assert store.claim_device(two_gpus)
    assert not store.claim_device(on_gpu1)  # cuda:1 belongs to the 2-GPU run
    assert store.claim_device(on_gpu2) and store.claim_device(on_cpu)
    store.set_status(two_gpus, FINISHED)
    assert store.claim_device(on_gpu1)


def test_a_queued_multi_gpu_run_is_not_overtaken_on_its_gpus(store):
    busy = store.create_run(RunConfig(device="cuda:0"), "cuda:0")
    assert store.claim_device(busy)
    waiting_for_two = store.create_run(RunConfig(device="cuda:0", nprocs=2), "cuda:0")
    later_on_gpu1 = store.create_run(RunConfig(device="cuda:1"), "cuda:1")
    assert not store.claim_device(waiting_for_two)
    assert not store.claim_device(later_on_gpu1)  # FIFO: the 2-GPU run asked first
    store.set_status(busy, FINISHED)
    assert store.claim_device(waiting_for_two)
    assert store.get_run(waiting_for_two).status == RUNNING


# ---------------------------------------------------------------------------------------
# pages (Streamlit AppTest against a real store)


def _app():
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"),
                           default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    return at


def test_launch_page_process_choices_are_disabled_for_one_process(home):
    at = _app()
    at.selectbox(key="device").set_value("cpu").run()
    assert at.text_input(key="nprocs").value == "1"
    assert at.selectbox(key="sharding").disabled and at.selectbox(key="comm_hook").disabled
    at.text_input(key="nprocs").set_value("2").run()
    assert not at.exception, at.exception
    assert not at.selectbox(key="sharding").disabled
    assert not at.selectbox(key="comm_hook").disabled
    assert any("share this CPU" in caption.value for caption in at.caption)
    if bf16_comm_hook_problem() is not None:
        at.selectbox(key="comm_hook").set_value("bf16").run()
        assert at.button(key="launch").disabled
        assert any("comm_hook" in err.value and "fp16" in err.value for err in at.error)
        at.selectbox(key="sharding").set_value("fsdp2").run()  # FSDP2 reduces in bf16 itself
        assert not at.button(key="launch").disabled


@pytest.mark.slow
@real_ranks
@pytest.mark.timeout(240)
def test_launch_page_starts_a_two_process_run(home, store, wait_for):
    at = _app()
    at.selectbox(key="device").set_value("cpu")
    at.selectbox(key="model").set_value("mlp")
    at.text_input(key="steps").set_value("5")
    at.checkbox(key="profile").uncheck()
    at.text_input(key="nprocs").set_value("2").run()
    at.selectbox(key="comm_hook").set_value("fp16").run()
    at.button(key="launch").click().run()
    assert not at.exception, at.exception
    (run,) = store.list_runs()
    assert (run.config.nprocs, run.config.sharding, run.config.comm_hook) == (2, "ddp", "fp16")
    assert wait_final(store, run.id, wait_for).status == FINISHED


def test_live_telemetry_draws_one_line_per_rank(home, store):
    run_id = store.create_run(TWO, "cpu", "test cpu")
    store.set_status(run_id, RUNNING)
    store.write_metrics(run_id, [{"step": 1, "loss": 2.0, "step_time_ms": 5.0, "phase": "steady"}])
    for rank in (0, 1):
        store.write_telemetry(run_id, [{"t_s": 100.0 + i, "cpu_pct": 90.0 + rank,
                                        "rss_bytes": 2**28} for i in range(4)], rank=rank)
    store.set_status(run_id, FINISHED)
    at = _app()
    at.session_state["live_run_id"] = run_id
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    specs = {}
    specs.update(charts_by_title(at))
    cpu = specs["CPU utilisation (100 % = one core)"]
    assert [trace["name"] for trace in cpu["data"]] == ["rank 0 worker CPU %",
                                                       "rank 1 worker CPU %"]
    assert [_values(trace["y"]) for trace in cpu["data"]] == [[90.0] * 4, [91.0] * 4]
    assert any("2 processes (ddp, comm hook none)" in c.value for c in at.caption)


def _values(series) -> list[float]:
    """Plotly's JSON holds arrays as lists or as base64 typed arrays ({dtype, bdata})."""
    if isinstance(series, dict):
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(series["bdata"]), dtype=series["dtype"]).tolist()
    return list(series)
