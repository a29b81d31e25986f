"""Time from launch to the first metric row in the store (tiny model on CPU).

    python -m bench.first_point [--launches 3] [--json]

Two ways in, both measured from the moment of the call until a metric row of the new
run is visible to a reader of the store (polled every 10 ms over a fresh connection,
as the UI reads):
  cli        `python -m engine launch --json ...` as a subprocess (a terminal, CI, a script)
  in-process `engine.run.launcher.launch(config, store)` called from this process, which
             has already imported torch and listed the devices, as the Streamlit server
             has by the time someone presses Launch.
Each way twice: with a standby trainer ready (engine/run/standby.py: PyTorch already
imported; the app starts one and every run's supervisor leaves a new one, so this is
the usual launch; the bench waits for it to listen before each launch, as a person
reading the previous run would) and cold (PRECISION_LAB_STANDBY=0: a fresh trainer
process imports everything). The target is judged on the standby launches.

Each launch is broken down from the store's own timestamps and the processes' create
times: the run row created -> supervisor process started -> device claimed (status
running) -> trainer process started -> training loop started (the first flushed row's
`wall_time_s` counts from there) -> first row visible. Separately, a fresh process
does what a trainer does before its first row, phase by phase (imports ranked with
`python -X importtime`), which says what a pre-started worker would save.

The very first run in a new data directory also measures this CPU's matmul peak once
(for MFU) and caches it; that is done (and timed) before the launches, as a first run
would, so the medians are of the usual launch. Runs are mlp-tiny, profile off, and are
stopped as soon as their first row is seen. Target: < 2 s.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import REPO_ROOT, emit_json, machine_info, print_table, spread, subprocess_env

TARGET_S = 2.0
POLL_S = 0.010
RUN_ARGS = {"model": "mlp", "size": "tiny", "precision": "fp32", "batch_size": 16,
            "steps": 2_000, "device": "cpu", "profile": False}  # stopped at the first row
FIRST_ROW_TIMEOUT_S = 60.0

BUDGET_S = 35.0  # no new launch pair starts after this long (under a minute in all)
STANDBY_READY_TIMEOUT_S = 60.0
WAYS = (("cli", "cli: python -m engine launch", True),
        ("in_process", "in-process: launcher.launch()", True),
        ("cli_cold", "cli, cold (no standby)", False),
        ("in_process_cold", "in-process, cold (no standby)", False))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.first_point", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=2,
                        help="launches per way in with a standby, alternating (default 2); "
                             "one cold launch per way in")
    parser.add_argument("--phase-repeats", type=int, default=1,
                        help="fresh trainer-start-up probes (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: one launch each way")
    parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    args = parser.parse_args(argv)
    if args.quick:
        args.launches, args.phase_repeats = 1, 1
    return args


# ---------------------------------------------------------------------------------------
# watching the store


def _query(db_path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """One short-lived read-only connection per query, as the UI reads."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5.0)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def max_seq(db_path: Path) -> int:
    return _query(db_path, "SELECT COALESCE(MAX(seq), 0) FROM runs")[0][0]


def first_row_after(db_path: Path, seq: int, proc: subprocess.Popen | None,
                    marks: dict[str, float]) -> str:
    """Poll until a run newer than `seq` has a metric row; return its id.

    Also notes when the CLI process (if any) exited and the trainer's create time.
    """
    deadline = time.monotonic() + FIRST_ROW_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and "returned" not in marks and proc.poll() is not None:
            marks["returned"] = time.time()
        try:
            rows = _query(db_path, "SELECT r.id FROM runs r WHERE r.seq > ? AND EXISTS"
                                   " (SELECT 1 FROM metrics m WHERE m.run_id = r.id)", (seq,))
        except sqlite3.OperationalError:  # locked for a moment by a writer: poll again
            rows = []
        if rows:
            marks["first_row"] = time.time()
            pids = _query(db_path, "SELECT pid, train_pid FROM runs WHERE id = ?", (rows[0][0],))
            marks["supervisor_start"] = process_start_epoch(pids[0][0])
            marks["trainer_start"] = process_start_epoch(pids[0][1])
            return rows[0][0]
        time.sleep(POLL_S)
    raise RuntimeError(f"no metric row within {FIRST_ROW_TIMEOUT_S:.0f} s")


def process_start_epoch(pid: int | None) -> float:
    """Unix time a live process started, to the clock tick (10 ms).

    Not psutil's create_time: it adds the boot time in whole seconds, up to 1 s off,
    which is the size of the stages measured here.
    """
    import os

    if not pid:
        return float("nan")
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            data = handle.read()
    except OSError:
        return float("nan")
    start_ticks = int(data[data.rindex(")") + 2:].split()[19])
    boot_epoch = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot_epoch + start_ticks / os.sysconf("SC_CLK_TCK")


def breakdown(store, run_id: str, marks: dict[str, float]) -> dict[str, Any]:
    """Stage durations (s) of one launch from store timestamps and process start times."""
    run = store.get_run(run_id)
    rows = _query(store.db_path, "SELECT step, wall_time_s FROM metrics WHERE run_id = ?"
                                 " ORDER BY step", (run_id,))
    # Rows visible at first sight were flushed together when the last of them was emitted;
    # its wall_time_s counts from the start of the training loop.
    last_step, last_wall_s = rows[-1]
    loop_start = marks["first_row"] - (last_wall_s or 0.0)
    supervisor_start = marks.get("supervisor_start", float("nan"))
    trainer_start = marks.get("trainer_start", float("nan"))
    claimed = run.started_at or float("nan")
    t0 = marks["t0"]
    stages = {
        "call -> run row created": run.created_at - t0,
        "run row -> supervisor process": supervisor_start - run.created_at,
        "supervisor -> device claimed": claimed - supervisor_start,
        "claimed -> trainer process": trainer_start - claimed,
        "trainer process -> loop start": loop_start - trainer_start,
        "loop start -> first row visible": last_wall_s or 0.0,
    }
    return {"run_id": run_id, "first_row_s": marks["first_row"] - t0,
            "returned_s": marks.get("returned", float("nan")) - t0,
            "rows_in_first_flush": len(rows), "first_flush_last_step": last_step,
            "stages_s": stages}


def stop_run(store, run_id: str) -> None:
    from engine.run.launcher import stop

    stop(run_id, store)


def stop_leftovers(store) -> None:
    """Stop every run still active in our private store (after an error, say): a
    benchmark must not leave trainers behind on a shared machine."""
    from engine.run.launcher import stop
    from engine.schema import ACTIVE_STATUSES

    for run in store.list_runs(statuses=ACTIVE_STATUSES):
        try:
            stop(run.id, store, grace_s=1.0)
        except Exception:  # noqa: BLE001 - best effort; keep stopping the others
            pass


# ---------------------------------------------------------------------------------------
# the two ways in


def use_standby(store, on: bool) -> None:
    """Standby on: wait until one listens for this data directory. Off: none, and none
    started (the env var reaches the CLI and the workers through os.environ)."""
    import os

    from engine.run import standby

    os.environ[standby.ENABLE_ENV] = "1" if on else "0"
    if not on:
        standby.shutdown(store.home)
        return
    standby.ensure(store)
    deadline = time.monotonic() + STANDBY_READY_TIMEOUT_S
    while standby.ping(store.home) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no standby listening after {STANDBY_READY_TIMEOUT_S:.0f} s; "
                               f"see {store.home / standby.STANDBY_LOG}")
        time.sleep(0.1)


def cli_launch(home: Path, store) -> dict[str, Any]:
    args = [sys.executable, "-m", "engine", "launch", "--json"]
    for name, value in RUN_ARGS.items():
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else (
            [f"--no-{name.replace('_', '-')}"] if value is False else [flag, str(value)])
    seq = max_seq(store.db_path)
    marks = {"t0": time.time()}
    proc = subprocess.Popen(args, cwd=str(REPO_ROOT), env=subprocess_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        run_id = first_row_after(store.db_path, seq, proc, marks)
    finally:
        out, err = proc.communicate(timeout=60)
    marks.setdefault("returned", time.time())
    if proc.returncode != 0:
        raise RuntimeError(f"engine launch failed ({proc.returncode}): {err.strip()[-500:]}")
    printed = json.loads(out.strip().splitlines()[-1])["run_id"]
    assert printed == run_id, (printed, run_id)
    result = breakdown(store, run_id, marks)
    stop_run(store, run_id)
    return result


def inprocess_launch(store) -> dict[str, Any]:
    from engine.config import RunConfig
    from engine.run.launcher import launch

    cfg = RunConfig(**RUN_ARGS)
    seq = max_seq(store.db_path)
    marks = {"t0": time.time()}
    run_id = launch(cfg, store)
    marks["returned"] = time.time()
    seen = first_row_after(store.db_path, seq, None, marks)
    assert seen == run_id, (seen, run_id)
    result = breakdown(store, run_id, marks)
    stop_run(store, run_id)
    return result


# ---------------------------------------------------------------------------------------
# imports in fresh processes


def seed_peak_cache(home: Path) -> float:
    """Measure and cache the CPU fp32 peak in `home` as a first run would; seconds taken.

    Same cache key as the trainer's (device, dtype, torch version, default threads).
    """
    import os

    from engine.hardware.devices import get_device
    from engine.hardware.peaks import peak_for

    saved = os.environ.get("PRECISION_LAB_HOME")
    os.environ["PRECISION_LAB_HOME"] = str(home)
    try:
        start = time.perf_counter()
        peak_for(get_device("cpu"), "fp32")
        return time.perf_counter() - start
    finally:
        if saved is None:
            os.environ.pop("PRECISION_LAB_HOME", None)
        else:
            os.environ["PRECISION_LAB_HOME"] = saved


def interpreter_start_s(home: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, env=subprocess_env(home))
    return time.perf_counter() - start


def trainer_phases(home: Path, run_id: str) -> dict[str, Any]:
    """A fresh process doing what `engine.run.worker --train` does before its first row,
    phase by phase (`python -X importtime`, so the imports can be ranked too)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "bench.first_point",
                           "--trainer-phases", str(home), run_id],
                          capture_output=True, text=True, cwd=str(REPO_ROOT),
                          env=subprocess_env(home), timeout=120, check=True)
    phases = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"phases_s": phases, "top_imports_s": top_level_imports(proc.stderr)}


def top_level_imports(importtime_stderr: str, top: int = 8) -> dict[str, float]:
    """Cumulative seconds of the outermost imports in `-X importtime` output.

    Lines read "import time: self [us] | cumulative | <indent>name"; the indent grows by
    two spaces per nesting level, and outermost imports have one space.
    """
    totals: dict[str, float] = {}
    for line in importtime_stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3:
            continue
        cumulative, raw_name = parts[1].strip(), parts[2]
        if not cumulative.isdigit() or raw_name.startswith("  "):
            continue
        totals[raw_name.strip()] = int(cumulative) / 1e6
    return dict(sorted(totals.items(), key=lambda kv: kv[1], reverse=True)[:top])


def run_trainer_phases(home: str, run_id: str) -> None:
    """The body of `--trainer-phases`: engine.run.session.run_trainer's start-up, timed.

    Prints one JSON object: seconds per phase, from the interpreter's start.
    """
    import os

    t_start = time.perf_counter()
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks[name] = time.perf_counter()

    import engine.run.worker  # noqa: F401 - what `python -m engine.run.worker` imports first
    from engine.run.session import device_peak
    from engine.store import Store
    mark("import engine.run.worker (supervisor, session, store)")
    import torch
    mark("import torch")
    from engine.hardware.telemetry import TelemetrySampler
    from engine.run.window import analyze_window  # noqa: F401 - as run_trainer does
    from engine.training.loop import Trainer, measure_flops_per_step, train  # noqa: F401
    mark("import window, telemetry, loop")
    store = Store(home)
    run = store.get_run(run_id)
    mark("Store() + get_run")
    device_peak(store, run_id, "cpu", run.config)
    mark("device peak (cached)")
    sampler = TelemetrySampler("cpu", lambda rows: None).start()
    mark("telemetry sampler start")
    trainer = Trainer(run.config, torch.device("cpu"))
    mark("Trainer() (model, optimizer, data)")
    measure_flops_per_step(trainer)
    mark("FLOP count step (FlopCounterMode)")
    loss, _ = trainer.step(1)
    float(loss.item())
    mark("first training step")
    sampler.stop()
    phases, previous = {}, t_start
    for name, at in marks.items():
        phases[name] = at - previous
        previous = at
    phases["pid"] = os.getpid()
    print(json.dumps(phases))


# ---------------------------------------------------------------------------------------


def summarize(launches: list[dict[str, Any]]) -> dict[str, Any]:
    if not launches:
        return {}
    stage_names = list(launches[0]["stages_s"])
    return {
        "first_row_s": spread(r["first_row_s"] for r in launches),
        "returned_s": spread(r["returned_s"] for r in launches),
        "stages_s": {name: spread(r["stages_s"][name] for r in launches)
                     for name in stage_names},
        "launches": launches,
    }


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 4 and sys.argv[1] == "--trainer-phases":
        run_trainer_phases(sys.argv[2], sys.argv[3])  # internal: see trainer_phases()
        return 0
    args = parse_args(argv)
    machine = machine_info()
    started = time.monotonic()
    import torch  # noqa: F401 - the UI process has torch loaded before anyone launches

    from engine.config import RunConfig
    from engine.hardware.devices import list_devices
    from engine.store import Store

    list_devices()  # as the sidebar device card has done in the UI process

    with tempfile.TemporaryDirectory(prefix="bench_first_point_") as tmp:
        home = Path(tmp) / "home"
        store = Store(home)
        try:
            peak_s = seed_peak_cache(home)
            runs: dict[str, list] = {key: [] for key, _label, _on in WAYS}
            for index in range(args.launches):  # alternate the two ways in
                if index and time.monotonic() - started > BUDGET_S:
                    break
                use_standby(store, True)
                runs["cli"].append(cli_launch(home, store))
                use_standby(store, True)
                runs["in_process"].append(inprocess_launch(store))
            use_standby(store, False)
            runs["cli_cold"].append(cli_launch(home, store))
            runs["in_process_cold"].append(inprocess_launch(store))
            python_s = interpreter_start_s(home)
            probe_id = store.create_run(RunConfig(**RUN_ARGS), "cpu", "bench.first_point probe")
            probes = [trainer_phases(home, probe_id) for _ in range(args.phase_repeats)]
        finally:
            stop_leftovers(store)
            from engine.run import standby

            standby.shutdown(home)
    elapsed_s = time.monotonic() - started

    results = {key: summarize(runs[key]) for key, _label, _on in WAYS}
    phase_names = [k for k in probes[0]["phases_s"] if k != "pid"]
    trainer_start = {name: spread(p["phases_s"][name] for p in probes) for name in phase_names}
    top_imports = probes[0]["top_imports_s"]
    cli_med = results["cli"]["first_row_s"]["median"]
    inproc_med = results["in_process"]["first_row_s"]["median"]
    met = {"cli": cli_med < TARGET_S, "in_process": inproc_med < TARGET_S}

    print(f"bench.first_point: mlp-tiny fp32 on cpu, profile off; {args.launches} launches "
          f"per way in, {elapsed_s:.1f} s; load avg at start "
          f"{machine['load_avg_1_5_15_min']}")
    rows = []
    for key, label, _on in WAYS:
        r = results[key]
        rows.append([label, r["first_row_s"]["median"], r["first_row_s"]["min"],
                     r["first_row_s"]["max"], len(r["launches"]), r["returned_s"]["median"],
                     met.get(key, "n/a (reference)")])
    print_table(f"Launch -> first metric row visible (s; target < {TARGET_S})",
                ["way in", "median", "min", "max", "n", "call returned after", "met"], rows)
    stage_rows = [[name] + [results[key]["stages_s"][name]["median"] for key, _l, _o in WAYS]
                  for name in results["cli"]["stages_s"]]
    print_table("Where the time goes (median s per stage)",
                ["stage"] + [key for key, _l, _o in WAYS], stage_rows)
    print(f"  not in the medians: the first run in a new data directory also measures the CPU's "
          f"matmul peak once (for MFU): {peak_s:.2f} s here, done before the launches")
    print_table("A trainer's start-up in a fresh process, phase by phase (s; python -X "
                "importtime on)",
                ["phase", "s"],
                [["interpreter start (python -c pass, separate process)", python_s]]
                + [[name, v["median"]] for name, v in trainer_start.items()]
                + [["total", sum(v["median"] for v in trainer_start.values())]])
    print_table("Largest top-level imports in that process (cumulative s)",
                ["package", "s"], list(top_imports.items()))
    cold = {key: results[key]["first_row_s"]["median"] for key in ("cli_cold", "in_process_cold")}
    print(f"\nfirst row with a standby: cli {cli_med:.2f} s, in-process {inproc_med:.2f} s "
          f"(cold: cli {cold['cli_cold']:.2f} s, in-process {cold['in_process_cold']:.2f} s); "
          f"target < "
          f"{TARGET_S} s: cli {'met' if met['cli'] else 'MISSED'}, in-process "
          f"{'met' if met['in_process'] else 'MISSED'}")
    if args.json:
        emit_json({
            "benchmark": "first_point", "target": TARGET_S, "target_op": "<",
            "first_row_s": {"cli": cli_med, "in_process": inproc_med, **cold},
            "met": met["cli"] and met["in_process"], "met_by_way": met,
            "results": results, "one_time_peak_measurement_s": peak_s,
            "interpreter_start_s": python_s, "trainer_start_phases_s": trainer_start,
            "top_imports_s": top_imports,
            "config": {**RUN_ARGS, "stopped_after_first_row": True, "poll_s": POLL_S},
            "repeats": args.launches, "elapsed_s": elapsed_s, "machine": machine,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
