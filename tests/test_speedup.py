"""The paired speedup check: its statistics on known inputs, the in-process measurement
on real models, and `python -m engine speedup` end to end (a real worker and trainer),
quiet and with a competing CPU hog started by the test."""

from __future__ import annotations

import json
import random

import pytest

from bench._hog import cpu_hog
from engine.analysis.speedup import (
    MIN_ROUNDS,
    half_width_pct,
    is_significant,
    paired_speedup,
    speedup_words,
    summarise,
)
from engine.cli.speedup import format_result
from engine.config import ConfigError, RunConfig
from engine.training.speedup import measure_speedup, mode_labels


def _noisy(base_ms: float, rounds: int, seed: int, drift: list[float]) -> list[float]:
    rng = random.Random(seed)
    return [base_ms * d * (1 + rng.uniform(-0.02, 0.02)) for d in drift[:rounds]]


def test_paired_ratios_cancel_load_that_hits_every_mode_of_a_round():
    # The machine's speed swings 3x from round to round (another tenant comes and goes),
    # the same for both modes of a round: the paired speedup still finds 2.0x, tightly.
    rng = random.Random(1)
    drift = [rng.choice([1.0, 1.5, 3.0]) for _ in range(20)]
    baseline = _noisy(10.0, 20, 2, drift)
    faster = _noisy(5.0, 20, 3, drift)
    stats = paired_speedup(baseline, faster)
    assert stats["rounds"] == 20
    assert 1.95 < stats["speedup"] < 2.05 and stats["ci_low"] > 1.9 and stats["ci_high"] < 2.1
    assert is_significant(stats) and half_width_pct(stats) < 3.0


def test_identical_modes_are_no_measurable_difference_and_few_rounds_no_interval():
    rng = random.Random(4)
    a = [10 * (1 + rng.uniform(-0.03, 0.03)) for _ in range(12)]
    b = [10 * (1 + rng.uniform(-0.03, 0.03)) for _ in range(12)]
    stats = paired_speedup(a, b)
    assert stats["ci_low"] < 1.0 < stats["ci_high"] and not is_significant(stats)
    words = speedup_words(stats, "fp32")
    assert words.startswith("no measurable difference vs fp32 (") and "faster" not in words
    few = paired_speedup(a[:MIN_ROUNDS - 1], b[:MIN_ROUNDS - 1])
    assert few["ci_low"] is None and "too few rounds" in speedup_words(few, "fp32")
    # The same rounds give the same interval every time (fixed bootstrap seed).
    assert paired_speedup(a, b) == stats


def test_slower_mode_is_worded_as_slower_with_its_interval():
    rows = summarise(["fp32", "bf16-amp"], {"fp32": [10.0 + 0.1 * i for i in range(8)],
                                            "bf16-amp": [14.0 + 0.1 * i for i in range(8)]},
                     batch_size=16, tokens_per_sample=64, baseline="fp32")
    base, slow = rows
    assert base["words"] == "baseline" and base["samples_per_s"] == pytest.approx(16000 / 10.35)
    assert slow["tokens_per_s"] == pytest.approx(slow["samples_per_s"] * 64)
    assert slow["significant"] and slow["speedup"] < 1
    assert slow["words"].startswith("1.39x slower") and "slower than fp32 (95 % CI" in slow["words"]


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError) as err:
        RunConfig(precision="fp32", speedup_modes="fp32")
    assert err.value.field == "speedup_modes"
    with pytest.raises(ConfigError) as err:
        RunConfig(precision="fp32", speedup_modes="bf16-amp,fp32")
    assert err.value.field == "precision" and "bf16-amp" in err.value.fix
    with pytest.raises(ConfigError) as err:
        RunConfig(precision="fp32", speedup_modes="fp32,fp33")
    assert err.value.value == "fp33"
    assert mode_labels(["fp32", "bf16-amp", "fp32"]) == ["fp32", "bf16-amp", "fp32 (2)"]


@pytest.mark.timeout(180)
def test_measurement_in_process_interleaves_modes_with_equal_blocks_and_memory():
    cfg = RunConfig(model="mlp", precision="fp32", speedup_modes="fp32,bf16-amp",
                    speedup_budget_s=5.0, batch_size=32)
    progress = []
    result = measure_speedup(cfg, "cpu", on_progress=progress.append)
    assert result["baseline"] == "fp32" and result["rounds"] >= 1
    base, other = result["modes"]
    assert base["blocks"] == other["blocks"] == result["rounds"]
    assert base["speedup"] == 1.0 and other["mode"] == "bf16-amp"
    if other["ci_low"] is not None:
        assert other["ci_low"] <= other["speedup"] <= other["ci_high"]
    # bf16-pure would halve the weights; bf16-amp keeps fp32 weights: memory measured per
    # mode, both above their resident weights.
    assert base["peak_mem_bytes"] > 0 and other["peak_mem_bytes"] > 0
    assert result["memory_method"] == "cpu profiler"
    assert result["stopped_by"] in ("budget", "target")
    assert all(p["rounds"] < result["rounds"] or p is progress[-1] for p in progress)


def _json_line(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_cli_speedup_end_to_end_quiet_and_under_a_cpu_hog(cli):
    proc = cli("speedup", "--model", "mlp", "--precisions", "fp32,bf16-amp", "--batch-size",
               "32", "--budget-s", "6", "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr
    result = _json_line(proc)
    assert result["status"] == "finished" and result["baseline"] == "fp32"
    assert set(result["modes"]) == {"fp32", "bf16-amp"}
    for row in result["modes"].values():
        assert {"median_step_ms", "samples_per_s", "speedup", "ci_low", "ci_high",
                "peak_mem_bytes", "blocks"} <= set(row)
    assert "round" in proc.stderr  # progress on stderr
    assert result["contention"]["busy"] in (True, False)

    with cpu_hog(processes=2):
        busy = cli("speedup", "--model", "mlp", "--precisions", "fp32,fp32", "--batch-size",
                   "32", "--budget-s", "6", "--json", timeout=240)
    assert busy.returncode == 0, busy.stderr
    result = _json_line(busy)
    assert result["contention"]["busy"] is True
    assert result["contention"]["words"].startswith("measured while the machine was busy (")
    text = format_result(result)
    assert "throughput figures are unreliable" in text
    twin = result["modes"]["fp32 (2)"]
    if twin["significant"]:  # an A/A difference under load is never stated as a claim
        assert "(machine busy: not a claim)" in text


def test_cli_speedup_bad_input_exits_2_naming_the_field(cli):
    for args, needle in (
        (["--precisions", "fp32"], "--speedup-modes 'fp32'"),
        (["--precisions", "fp32,tf32"], "--speedup-modes 'tf32': not supported"),
        ([], "--precisions: missing"),
        (["--precisions", "fp32,bf16-amp", "--batch-size", "0"], "--batch-size 0"),
        (["--precisions", "fp32,bf16-amp", "--budget-s", "1"], "--speedup-budget-s 1.0"),
        (["--precisions", "fp32,bf16-amp", "--precision", "bf16-amp"], "--precision 'bf16-amp'"),
    ):
        proc = cli("speedup", "--model", "mlp", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


@pytest.mark.timeout(180)
def test_the_speedup_check_measures_your_own_workload(tmp_path):
    """The example user workload through the same paired measurement (issue: the speedup
    check accepts every workload the runs accept)."""
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "workloads" / "tiny_transformer.py"
    cfg = RunConfig(model="custom", workload=str(example), precision="fp32",
                    speedup_modes="fp32,bf16-amp", speedup_budget_s=5.0, batch_size=8,
                    seq_len=32)
    result = measure_speedup(cfg, "cpu")
    base, other = result["modes"]
    assert result["rounds"] >= 1 and base["blocks"] == other["blocks"]
    assert base["median_step_ms"] > 0 and other["median_step_ms"] > 0
    assert result["flops_per_step"] and other["achieved_flops_per_s"] > 0
