"""Every error a user can cause on `export`, `kernels` and `speedup` is one line and exit 2,
like the run flags': each flag that takes a value is given values no such flag accepts
(empty, NUL, not a number, non-finite, out of range, a path that cannot be written), one
flag at a time, through main() as `python -m engine` calls it. In process: nothing here
trains or starts a process (a value let through would, and the test would fail)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
from pathlib import Path

import pytest

from engine.cli.main import build_parser, main
from engine.config import RunConfig
from engine.store import Store

DATA = Path(__file__).resolve().parent / "data"
NOT_A_NUMBER = ["", "abc", "nan", "inf", "-inf", "1e999", "0x10", "\x00", "1 2"]
NOT_A_PATH = ["", "\x00", "a" * 5000, "/nonexistent-precision-lab/x/y.out"]


def _flags(command: str) -> dict[str, argparse.Action]:
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return {action.option_strings[0]: action for action in sub._actions
            if action.option_strings and action.nargs is None
            and not isinstance(action, argparse._HelpAction)}


def _call(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def _assert_one_line_usage_error(argv: list[str], names: tuple[str, ...]) -> None:
    code, out, err = _call(argv)
    shown = [repr(part)[:60] for part in argv[-2:]]
    assert code == 2, (shown, code, out[-500:], err[-1500:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (shown, err[-1500:])
    assert "Traceback" not in err
    assert any(name in lines[0] for name in names), (shown, lines[0])


@pytest.fixture
def finished_run(home, monkeypatch) -> str:
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    store = Store(home)
    run_id = store.create_run(RunConfig(model="mlp", size="tiny", steps=3, profile=False,
                                        device="cpu"), "cpu", "CPU")
    store.set_status(run_id, "running")
    store.write_metrics(run_id, [{"step": s, "loss": 1.0 / s, "wall_time_s": 0.1 * s,
                                  "step_time_ms": 100.0, "samples_per_s": 80.0}
                                 for s in (1, 2, 3)])
    store.set_status(run_id, "finished", "finished after 3 steps")
    return run_id


# ---------------------------------------------------------------------------------------
# export


EXPORT_PATHS = ("--html", "--csv", "--parquet", "--tensorboard")


@pytest.mark.parametrize("flag", EXPORT_PATHS)
def test_export_path_flags_refuse_what_cannot_be_written(finished_run, tmp_path, flag):
    a_folder = tmp_path / "a_folder"
    a_folder.mkdir()
    values = NOT_A_PATH + ([str(a_folder)] if flag != "--tensorboard" else [str(tmp_path / "f")])
    if flag == "--tensorboard":
        (tmp_path / "f").write_text("a file where a folder must be")
    for value in values:
        _assert_one_line_usage_error(["export", finished_run, flag, value], (flag,))
    assert os.listdir(a_folder) == []  # nothing half-written into the folder


def test_export_mlflow_and_its_options_refuse_bad_values(finished_run, tmp_path):
    for value in ["", "\x00", "ftp://example.invalid/x", "a" * 5000]:
        _assert_one_line_usage_error(["export", finished_run, "--mlflow", value], ("--mlflow",))
    store = f"file:{tmp_path / 'mlruns'}"
    for value in NOT_A_NUMBER + ["0", "-5", "99999"]:
        _assert_one_line_usage_error(["export", finished_run, "--mlflow", store,
                                      "--mlflow-timeout-s", value], ("--mlflow-timeout-s",))
    for value in ["", "\x00"]:
        _assert_one_line_usage_error(["export", finished_run, "--mlflow", store,
                                      "--experiment", value], ("--experiment",))
    assert not (tmp_path / "mlruns").exists()  # refused before anything was written


def test_export_run_ids_and_baseline_refuse_bad_values(finished_run, tmp_path):
    target = str(tmp_path / "out.csv")
    for value in ["", "\x00", "../etc", "a" * 5000, "no-such-run"]:
        _assert_one_line_usage_error(["export", value, "--csv", target], ("RUN_ID", value[:20]))
        _assert_one_line_usage_error(["export", finished_run, "--html", target + ".html",
                                      "--baseline", value], ("--baseline",))
    assert not Path(target).exists()


def test_export_flags_are_all_fuzzed():
    fuzzed = {*EXPORT_PATHS, "--mlflow", "--mlflow-timeout-s", "--experiment", "--baseline"}
    assert set(_flags("export")) == fuzzed


# ---------------------------------------------------------------------------------------
# kernels


@pytest.fixture
def small_trace(tmp_path) -> Path:
    traces = sorted((DATA / "traces").glob("*.json*"), key=lambda p: p.stat().st_size)
    path = tmp_path / traces[0].name
    shutil.copy(traces[0], path)
    return path


def test_kernels_step_and_traces_refuse_bad_values(small_trace, tmp_path):
    for value in NOT_A_NUMBER + ["0", "-1", "99999999999999999999"]:
        _assert_one_line_usage_error(["kernels", str(small_trace), "--step", value], ("--step",))
    not_json = tmp_path / "not_a_trace.json"
    not_json.write_text("{ this is not json")
    for value in ["", "\x00", "a" * 5000, str(tmp_path / "missing.json"), str(tmp_path),
                  str(not_json)]:
        _assert_one_line_usage_error(["kernels", value], ("trace", value[:20]))
        _assert_one_line_usage_error(["kernels", str(small_trace), value, "--diff"],
                                     ("trace", value[:20]))


def test_kernels_set_flags_refuse_bad_values(tmp_path):
    for name in ("rank-0.json", "rank-1.json"):
        (tmp_path / name).write_text('{"traceEvents": []}')
    for value in ["0", "-1", "abc", "1e9", "257", "", "\x00"]:
        _assert_one_line_usage_error(["kernels", str(tmp_path), "--workers", value],
                                     ("--workers",))
    for value in ["", "ray://head:10001", "host", "host:99999", "\x00", "a" * 5000]:
        _assert_one_line_usage_error(["kernels", str(tmp_path), "--ray", value], ("--ray",))


def test_kernels_flags_are_all_fuzzed():
    assert set(_flags("kernels")) == {"--step", "--workers", "--ray"}


# ---------------------------------------------------------------------------------------
# speedup: every flag is refused before anything trains


SPEEDUP_CHOICES = {
    "--precisions": ["", "fp17", "fp32", "\x00", ",", "fp32,bf16-amp,fp16-amp,fp32,bf16-pure"],
    "--require": [
        "",
        "bf16-amp",
        "bf16-amp>=",
        "bf16-amp>=abc",
        "bf16-amp>=nan",
        "fp17>=1.3",
        "fp32>=1.1",
        "bf16-amp>=-1",
        "bf16-amp>=0",
    ],
    "--require-mem": [
        "",
        "bf16-amp<=",
        "bf16-amp<=nan",
        "bf16-amp<=inf",
        "fp17<=0.8",
        "bf16-amp=0.8",
    ],
    "--model": ["", "foo", "\x00"],
    "--size": ["", "huge"],
    "--precision": ["", "fp17"],
    "--optimizer": ["", "lion2"],
    "--device": ["", "gpu", "cuda:99", "\x00"],
    "--data": ["", "disk"],
    "--sharding": ["", "zero9"],
    "--comm-hook": ["", "int3"],
    "--speedup-modes": ["", "fp17"],
    "--workload": ["\x00", "a\nb", "x" * 5000],
    "--model-file": ["", "\x00", "/nonexistent-precision-lab/m.py"],
    "--name": ["\x00", "a" * 5000],
}


def _speedup_flags_and_values():
    for flag, action in _flags("speedup").items():
        if flag in SPEEDUP_CHOICES:
            values = SPEEDUP_CHOICES[flag]
        elif getattr(action.type, "__name__", "") in ("int", "float") or action.type in (
            int,
            float,
        ):
            values = NOT_A_NUMBER + ["-1", "-1e308", "99999999999999999999"]
        else:
            values = NOT_A_NUMBER
        for value in values:
            yield flag, value


def test_speedup_flags_refuse_bad_values_before_anything_trains(home, monkeypatch):
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    cases = list(_speedup_flags_and_values())
    assert len(cases) > 200
    base = {"--precisions": "fp32,bf16-amp", "--model": "mlp", "--device": "cpu",
            "--budget-s": "30"}
    for flag, value in cases:
        given = {**base, flag: value}
        if flag == "--speedup-modes":  # the other name of --precisions: one of the two
            del given["--precisions"]
        if flag == "--speedup-budget-s":  # and of --budget-s (both: refused, tested below)
            del given["--budget-s"]
        argv = ["speedup", *[part for pair in given.items() for part in pair]]
        _assert_one_line_usage_error(argv, (flag,))
    assert Store(home).list_runs() == []


def test_a_speedup_setting_given_under_both_its_names_is_refused(home, monkeypatch):
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    for argv, flag in (
            (["--budget-s", "30", "--speedup-budget-s", "60"], "--speedup-budget-s"),
            (["--target-pct", "3", "--speedup-target-pct", "5"], "--speedup-target-pct"),
            (["--speedup-modes", "fp32,bf16-amp"], "--precisions")):
        _assert_one_line_usage_error(["speedup", "--precisions", "fp32,bf16-amp", "--model",
                                      "mlp", "--device", "cpu", *argv], (flag,))
    assert Store(home).list_runs() == []
