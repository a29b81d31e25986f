"""The speedup check as a CI gate: requirements read and refused with the flag named, each
judged on the interval (pass / fail / inconclusive, busy first), the exit codes, and the
real CLI: 0, 1 and 3, the inconclusive one under a CPU hog."""

from __future__ import annotations

import json

import pytest

from bench._hog import cpu_hog
from engine.analysis.gate import (
    GATE_FAIL,
    GATE_INCONCLUSIVE,
    GATE_PASS,
    MEMORY,
    SPEED,
    RequirementError,
    check_modes,
    gate,
    gate_lines,
    parse_requirement,
)

MIB = 2**20


def _result(low, high, speedup=1.5, busy=False, mem=(400 * MIB, 300 * MIB)):
    return {
        "baseline": "fp32",
        "contention": {"busy": busy},
        "modes": [  # the shape `speedup --json` prints: a list, baseline first
            {"mode": "fp32", "speedup": 1.0, "ci_low": 1.0, "ci_high": 1.0,
             "peak_mem_bytes": mem[0]},
            {
                "mode": "bf16-amp",
                "speedup": speedup,
                "ci_low": low,
                "ci_high": high,
                "peak_mem_bytes": mem[1],
            },
        ],
    }


def test_a_requirement_reads_mode_operator_and_ratio():
    req = parse_requirement(" bf16-amp >= 1.3 ", SPEED)
    assert (req.kind, req.mode, req.op, req.bound, req.text) == (
        SPEED,
        "bf16-amp",
        ">=",
        1.3,
        "bf16-amp>=1.3",
    )
    assert parse_requirement("fp32 (2)<=0.8", MEMORY).mode == "fp32 (2)"


@pytest.mark.parametrize("text, words", [
    ("bf16-amp>1.3", "--require 'bf16-amp>1.3': write MODE>=RATIO or MODE<=RATIO"),
    ("bf16-amp>=fast", "write MODE>=RATIO"), ("", "write MODE>=RATIO"),
    ("bf16-amp>=0", "the ratio must be a positive number"),
])
def test_an_unreadable_requirement_names_the_flag_the_text_and_the_form(text, words):
    with pytest.raises(RequirementError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_requirement(text, SPEED)


def test_a_requirement_on_the_baseline_or_an_absent_mode_is_refused_before_the_check():
    with pytest.raises(RequirementError, match="'fp32' is the baseline; require one of bf16-amp"):
        check_modes([parse_requirement("fp32>=1", SPEED)], ["fp32", "bf16-amp"])
    with pytest.raises(
        RequirementError, match="--require-mem 'fp16-amp<=0.8': 'fp16-amp' is not a mode"
    ):
        check_modes([parse_requirement("fp16-amp<=0.8", MEMORY)], ["fp32", "bf16-amp"])


@pytest.mark.parametrize("low, high, outcome, code", [
    (1.35, 1.50, "pass", GATE_PASS),            # the lower end clears 1.3
    (1.10, 1.25, "fail", GATE_FAIL),            # the whole interval is below
    (1.20, 1.40, "inconclusive", GATE_INCONCLUSIVE),  # straddles: too wide
    (None, None, "inconclusive", GATE_INCONCLUSIVE),  # no interval yet
])
def test_a_speed_requirement_is_judged_on_the_interval(low, high, outcome, code):
    verdict = gate([parse_requirement("bf16-amp>=1.3", SPEED)], _result(low, high))
    assert verdict["exit_code"] == code and verdict["requirements"][0]["outcome"] == outcome


def test_busy_is_inconclusive_whatever_the_interval_says():
    verdict = gate([parse_requirement("bf16-amp>=1.3", SPEED)], _result(1.8, 1.9, busy=True))
    assert verdict["exit_code"] == GATE_INCONCLUSIVE
    assert "the machine was busy" in verdict["requirements"][0]["words"]


def test_one_failure_fails_the_gate_even_beside_an_inconclusive_one():
    reqs = [parse_requirement("bf16-amp>=1.3", SPEED), parse_requirement("bf16-amp<=0.5", MEMORY)]
    verdict = gate(reqs, _result(1.2, 1.4))  # speed straddles; memory 0.75 > 0.5 fails
    assert verdict["exit_code"] == GATE_FAIL and verdict["verdict"] == "failed"
    lines = gate_lines(verdict)
    assert (
        lines[1]
        == "gate: bf16-amp<=0.5: fail (tensor peak 0.750x the baseline's (300.0 vs 400.0 MiB))"
    )
    assert lines[-1] == "gate: failed (exit 1)"


def test_a_memory_requirement_passes_on_the_ratio_of_the_peaks_and_needs_both():
    req = parse_requirement("bf16-amp<=0.8", MEMORY)
    assert gate([req], _result(1.0, 1.1))["exit_code"] == GATE_PASS  # 0.75
    assert gate([req], _result(1.0, 1.1, mem=(400 * MIB, None)))["exit_code"] == GATE_INCONCLUSIVE


# ---------------------------------------------------------------------------------------
# the real CLI


def _json_line(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_cli_gate_exits_0_1_and_3_under_a_hog(cli):
    # 12 s: a round (two 0.25 s blocks and the noise copy's) took up to 1 s on a slow 2-core
    # machine, and a 5 s budget then ended before the 6 rounds an interval needs.
    common = ["speedup", "--model", "mlp", "--precisions", "fp32,fp32", "--batch-size", "32",
              "--budget-s", "12", "--json"]
    # An A/A check: the twin's interval sits around 1.0, far from both bounds below.
    proc = cli(*common, "--require", "fp32 (2)>=0.2", "--require", "fp32 (2)<=5", timeout=240)
    result = _json_line(proc)
    if result["contention"]["busy"]:
        assert proc.returncode == 3  # this machine was busy: the gate claims nothing
    else:
        assert proc.returncode == 0, proc.stderr
        assert result["gate"]["verdict"] == "passed"
    assert "gate: fp32 (2)>=0.2:" in proc.stderr

    failing = cli(*common, "--require", "fp32 (2)>=50", timeout=240)
    if not _json_line(failing)["contention"]["busy"]:
        assert failing.returncode == 1, failing.stderr
        assert "gate: failed (exit 1)" in failing.stderr

    with cpu_hog(processes=2):
        busy = cli(*common, "--require", "fp32 (2)>=0.2", timeout=240)
    assert busy.returncode == 3, busy.stderr
    gate_result = _json_line(busy)["gate"]
    assert gate_result["verdict"] == "inconclusive"
    assert "the machine was busy" in gate_result["requirements"][0]["words"]


@pytest.mark.slow
def test_the_cli_refuses_a_bad_requirement_before_launching(cli, store):
    proc = cli("speedup", "--model", "mlp", "--precisions", "fp32,bf16-amp", "--require", "bf16>=1")
    assert (
        proc.returncode == 2
        and "--require 'bf16>=1': 'bf16' is not a mode of this check" in proc.stderr
    )
    assert store.list_runs() == []


def test_a_requirement_on_a_mode_left_out_of_the_check_is_inconclusive_with_the_reason():
    reason = ("bf16-amp left out: one step takes 2.27 s, so its set-up and 6 rounds of 2 steps "
              "need about 61 s with the modes before it, and 45 s of the 60 s budget were left; "
              "raise speedup_budget_s (--budget-s) to measure it")
    result = {"baseline": "fp32", "contention": {"busy": False}, "dropped": [
        {"mode": "bf16-amp", "reason": reason}], "modes": {"fp32": {"speedup": 1.0}}}
    for text, kind in (("bf16-amp>=1.3", SPEED), ("bf16-amp<=0.8", MEMORY)):
        verdict = gate([parse_requirement(text, kind)], result)
        assert verdict["exit_code"] == GATE_INCONCLUSIVE
        assert verdict["requirements"][0]["words"] == reason
