"""The CLI contract, through real subprocesses: `python -m engine ...`.

- run [--json]: trains in the foreground, recorded like any other run, exit 0 when finished.
- launch [--json]: background, returns at once with {"run_id": ...}.
- show RUN_ID --json, list [--json], stop RUN_ID.
- invalid input: exit 2, exactly one stderr line naming the field, no traceback.
"""

from __future__ import annotations

import json
import time

import pytest

from engine.config import RunConfig, config_fields
from engine.store import Store

TINY = ["--size", "tiny", "--batch-size", "8", "--no-profile", "--device", "cpu"]
RUN_JSON_KEYS = {"run_id": str, "status": str, "steps_completed": int, "first_loss": float,
                 "final_loss": float, "samples_per_s": float, "peak_mem_bytes": int,
                 "skipped_steps": int, "device": str, "tensor_peak_bytes": int,
                 "process_peak_bytes": int, "memory_by_kind": dict}


def last_json(stdout: str):
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "nothing on stdout"
    return json.loads(lines[-1])


def assert_clean(result) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout


# ---------------------------------------------------------------------------------------
# run (three foreground runs, started at once in separate data directories)

FOREGROUND_RUNS = {
    "fp32": ["run", "--model", "gpt", "--steps", "12", *TINY, "--json"],
    # An initial scale of 2**32 overflows the first fp16 gradients: steps are skipped
    # and the scale backs off (test_train checks the details in-process).
    "fp16-amp": ["run", "--model", "mlp", "--steps", "10", "--precision", "fp16-amp",
                 "--init-scale", str(2**32), *TINY, "--json"],
    # Measured: mlp/sgd at lr=10 without warm-up reaches NaN at step 6.
    "diverges": ["run", "--model", "mlp", "--optimizer", "sgd", "--lr", "10",
                 "--warmup-steps", "0", "--steps", "30", *TINY, "--json"],
}


@pytest.fixture(scope="module")
def foreground_runs(module_homes, start_cli, finish_cli):
    homes = {name: module_homes(f"cli_{name}") for name in FOREGROUND_RUNS}
    procs = {name: start_cli(homes[name], *args) for name, args in FOREGROUND_RUNS.items()}
    return {name: (finish_cli(proc, 240), homes[name]) for name, proc in procs.items()}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_json_fp32_reports_every_field_and_is_recorded(foreground_runs):
    result, home = foreground_runs["fp32"]
    assert_clean(result)
    assert result.returncode == 0, result.stderr
    summary = last_json(result.stdout)
    for key, kind in RUN_JSON_KEYS.items():
        assert isinstance(summary[key], kind) and not isinstance(summary[key], bool), (
            key,
            summary[key],
        )
    assert "loss_scale_final" in summary and summary["loss_scale_final"] is None
    assert summary["status"] == "finished" and summary["steps_completed"] == 12
    assert summary["skipped_steps"] == 0 and summary["device"] == "cpu"
    assert summary["final_loss"] < summary["first_loss"]
    assert summary["samples_per_s"] > 0 and summary["peak_mem_bytes"] > 0
    # two peaks by name: a CPU run's chart peak is its process peak; the tensors' is less
    assert summary["process_peak_bytes"] == summary["peak_mem_bytes"]
    assert 0 < summary["tensor_peak_bytes"] < summary["process_peak_bytes"]
    assert summary["memory_by_kind"]["peak_bytes"] == summary["tensor_peak_bytes"]
    # recorded in the store like any other run
    store = Store(home)
    run = store.get_run(summary["run_id"])
    assert run.status == "finished" and run.steps_completed == 12
    assert run.config.model == "gpt" and run.config.batch_size == 8
    assert store.metrics_count(run.id) == 12
    assert run.summary["final_loss"] == pytest.approx(summary["final_loss"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_json_fp16_amp_reports_loss_scale_and_skipped_steps(foreground_runs):
    result, _home = foreground_runs["fp16-amp"]
    assert_clean(result)
    assert result.returncode == 0, result.stderr
    summary = last_json(result.stdout)
    scale = summary["loss_scale_final"]
    assert isinstance(scale, float) and 1.0 <= scale < 2.0**32
    assert isinstance(summary["skipped_steps"], int) and summary["skipped_steps"] >= 1
    assert summary["status"] == "finished"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_that_diverges_reports_diverged_with_the_step(foreground_runs):
    result, home = foreground_runs["diverges"]
    assert_clean(result)
    summary = last_json(result.stdout)
    assert summary["status"] == "diverged"
    assert result.returncode == 1  # ran, but did not finish
    step = summary["steps_completed"]
    assert 1 <= step < 30 and f"at step {step}" in summary["reason"]
    assert Store(home).get_run(summary["run_id"]).status == "diverged"


# ---------------------------------------------------------------------------------------
# launch / show / list / stop


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_launch_returns_at_once_then_show_list_and_stop(cli, home, wait_for, group_alive):
    started = time.monotonic()
    result = cli("launch", "--model", "mlp", "--steps", "1000000", *TINY, "--json")
    launch_s = time.monotonic() - started
    assert_clean(result)
    assert result.returncode == 0, result.stderr
    run_id = last_json(result.stdout)["run_id"]
    assert list(last_json(result.stdout)) == ["run_id"]
    assert launch_s < 30, launch_s  # measured ~3 s: interpreter + device check, no training
    store = Store(home)
    assert store.get_run(run_id).status in ("queued", "running")

    wait_for(
        lambda: store.metrics_count(run_id) > 0,
        60,
        message=lambda: (
            f"metrics of {run_id}; log: "
            f"{(store.run_dir(run_id) / 'worker.log').read_text()[-2000:]}"
        ),
    )
    shown = cli("show", run_id, "--json")
    assert_clean(shown)
    assert shown.returncode == 0, shown.stderr
    info = last_json(shown.stdout)
    for key in ("run_id", "status", "reason", "pid", "steps_completed", "metrics_rows", "config"):
        assert key in info, key
    assert info["run_id"] == run_id and info["status"] == "running"
    assert isinstance(info["pid"], int) and info["metrics_rows"] > 0
    assert info["steps_completed"] >= 1
    assert set(info["config"]) == {f.name for f in config_fields()}
    assert RunConfig.from_dict(info["config"]).steps == 1_000_000

    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = last_json(listed.stdout)
    assert [(row["run_id"], row["status"]) for row in rows] == [(run_id, "running")]
    plain = cli("list")
    assert plain.returncode == 0 and run_id in plain.stdout and "running" in plain.stdout

    rows_before_stop = store.metrics_count(run_id)
    pid = store.get_run(run_id).pid
    started = time.monotonic()
    stopped = cli("stop", run_id)
    stop_s = time.monotonic() - started
    assert_clean(stopped)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    assert stop_s < 5 + 5, stop_s  # the contract's 5 s plus interpreter start-up
    run = store.get_run(run_id)
    assert run.status == "stopped" and "step" in run.reason
    assert store.metrics_count(run_id) >= rows_before_stop
    assert not group_alive(pid)
    shown = last_json(cli("show", run_id, "--json").stdout)
    assert shown["status"] == "stopped" and shown["metrics_rows"] >= rows_before_stop


# ---------------------------------------------------------------------------------------
# invalid input


INVALID = [
    (["run", "--batch-size", "0"], "--batch-size"),
    (["run", "--batch-size", "-3"], "--batch-size"),
    (["run", "--model", "foo"], "--model"),
    (["run", "--precision", "fp17"], "--precision"),
    (["run", "--steps", "0"], "--steps"),
    (["run", "--steps", "99999999"], "--steps"),
    (["run", "--precision", "tf32", "--device", "cpu"], "--precision"),
    (["run", "--precision", "fp8", "--device", "cpu"], "--precision"),
    (["run", "--batch-size", "abc"], "--batch-size"),
    (["run", "--lr", "nan"], "--lr"),
    (["run", "--device", "gpu"], "--device"),
    (["launch", "--batch-size", "0", "--json"], "--batch-size"),
    (["launch", "--precision", "tf32", "--device", "cpu", "--json"], "--precision"),
    (["show", "../etc"], "run_id"),
    (["show", "../etc", "--json"], "run_id"),
    (["show", "no-such-run"], "run_id"),
    (["stop", "x;rm -rf ~"], "run_id"),
]


@pytest.fixture(scope="module")
def invalid_results(module_homes, start_cli, finish_cli):
    """All invalid invocations at once, each against its own empty data directory."""
    started = {}
    for index, (args, _field) in enumerate(INVALID):
        home = module_homes(f"invalid_{index}")
        started[" ".join(args)] = (start_cli(home, *args), home)
    return {key: (finish_cli(proc, 120), home) for key, (proc, home) in started.items()}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("args,field", INVALID, ids=[" ".join(a) for a, _ in INVALID])
def test_invalid_input_exits_2_with_one_line_naming_the_field(invalid_results, args, field):
    result, home = invalid_results[" ".join(args)]
    assert_clean(result)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and field in lines[0], lines[0]
    assert result.stdout == ""
    if "tf32" in args:  # says why, and what would run instead
        assert "TF32" in lines[0] and "runnable here:" in lines[0] and "fp32" in lines[0]
    if "fp17" in args:
        assert "choose one of fp32, tf32, fp16-amp, bf16-amp, bf16-pure, fp8" in lines[0]
    if "abc" in args:  # the value, what was expected, and an example
        assert "'abc': expected a whole number, e.g. 2" in lines[0], lines[0]
    if (home / "precision_lab.sqlite3").exists():
        assert Store(home).list_runs() == [], "invalid input must not create a run"


def _parser_tree(parser, path=()):
    """(path, parser) for `parser` and every sub-command under it, nested ones included."""
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parser_tree(sub, (*path, name))


def test_help_at_every_level_exits_0():
    """`python -m engine --help`, `python -m engine COMMAND --help` and every nested
    sub-command's help, through main() as a user calls it. A sub-command's help text
    "95 % intervals" once crashed the top level (argparse %-formats every help string);
    a field docstring with "95 %" once crashed `run --help`."""
    import contextlib
    import io

    from engine.cli.main import build_parser, main

    paths = [path for path, _ in _parser_tree(build_parser())]
    assert () in paths and ("sweep", "create") in paths and ("speedup",) in paths
    for path in paths:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
            main([*path, "--help"])
        assert stop.value.code == 0, path
        assert "usage:" in out.getvalue(), path
    top = io.StringIO()
    with contextlib.redirect_stdout(top), pytest.raises(SystemExit):
        main(["--help"])
    assert "95 % intervals" in top.getvalue()  # the literal text, no "%%" shown
    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "95 % interval" in run_help and "%%" not in run_help


def test_escape_help_percent_keeps_argparse_placeholders():
    from engine.cli.errors import escape_help_percent

    assert escape_help_percent("95 % CI") == "95 %% CI"
    assert escape_help_percent("within this %% of") == "within this %% of"
    assert escape_help_percent("default %(default)s, 3 %") == "default %(default)s, 3 %%"
