"""engine.analysis.compare: steady-state statistics, ratios, findings wording, config diff and the
default selection, on runs with hand-written metric rows (exact numbers) and on real
tiny CPU runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from _real_runs import record_run, speed_word, tiny_config, write_rows

from engine.analysis.compare import config_diff, default_selection, display_names, summary_table
from engine.analysis.findings import findings
from engine.analysis.steady import BASIS_NON_WARMUP, BASIS_STEADY, ema, steady_stats
from engine.config import RunConfig
from engine.store import RunNotFound

MIB = 2**20
BATCH = 16
EMULATED_EVIDENCE = {
    "verdict": "no native low-precision matrix unit: emulated",
    "headline": "no native low-precision matrix unit: emulated: no oneDNN fp16 matrix "
                "primitive ran (this CPU lacks avx512_fp16 and amx_fp16)",
}


def _rows(steady_ms: list[float], losses: list[float], warmup_ms: float = 1000.0,
          profile_ms: float = 500.0) -> list[dict]:
    """2 warm-up steps, 3 profiler-window steps, then the steady steps (slow on purpose
    outside steady state: an average that let them in would be visibly wrong)."""
    phases = ["warmup"] * 2 + ["profile"] * 3 + ["steady"] * len(steady_ms)
    times = [warmup_ms] * 2 + [profile_ms] * 3 + list(steady_ms)
    assert len(losses) == len(phases)
    return [{"step": i + 1, "phase": phase, "step_time_ms": ms,
             "samples_per_s": BATCH * 1000.0 / ms, "loss": loss, "wall_time_s": 0.1 * (i + 1),
             "mem_peak_bytes": 100 * MIB}
            for i, (phase, ms, loss) in enumerate(zip(phases, times, losses))]


BASE_LOSSES = [2.3, 2.2, 2.1, 2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.4]
STEADY_BASE = [100.0, 110.0, 90.0, 100.0, 100.0]  # median 100 ms -> 160 samples/s


@pytest.fixture
def three_runs(store):
    base = write_rows(store, tiny_config("fp32"), _rows(STEADY_BASE, BASE_LOSSES),
                      summary={"peak_mem_bytes": 1300 * MIB, "tensor_peak_bytes": 1000 * MIB,
                               "process_peak_bytes": 1300 * MIB,
                               "final_loss": BASE_LOSSES[-1]})
    # bf16: twice as fast, 40 % less memory (tensor peaks; the process peaks, which count
    # PyTorch's own libraries, differ by 4 %), loss consistently 1 % higher (same batches).
    bf16_losses = [v * 1.01 for v in BASE_LOSSES]
    fast = write_rows(store, tiny_config("bf16-amp"),
                      _rows([50.0, 55.0, 45.0, 50.0, 50.0], bf16_losses, warmup_ms=1.0),
                      summary={"peak_mem_bytes": 1250 * MIB, "tensor_peak_bytes": 600 * MIB,
                               "process_peak_bytes": 1250 * MIB, "final_loss": bf16_losses[-1],
                               "kernels": {"tensor_core_share": 0.85}, "mfu": 0.42})
    # fp16: four times slower (emulated on this CPU), loss wobbling around the baseline.
    wobble = [v * (1.004 if i % 2 else 0.996) for i, v in enumerate(BASE_LOSSES)]
    slow = write_rows(store, tiny_config("fp16-amp"), _rows([400.0] * 5, wobble),
                      summary={"peak_mem_bytes": 1302 * MIB, "tensor_peak_bytes": 1005 * MIB,
                               "process_peak_bytes": 1302 * MIB, "final_loss": wobble[-1],
                               "skipped_steps": 3, "loss_scale_final": 8192.0,
                               "cpu_evidence": EMULATED_EVIDENCE})
    return base, fast, slow


def test_steady_stats_use_steady_rows_only():
    frame = pd.DataFrame(_rows(STEADY_BASE, BASE_LOSSES))
    stats = steady_stats(frame)
    assert stats["basis"] == BASIS_STEADY and not stats["fallback"] and stats["rows"] == 5
    assert stats["step_time_ms"] == 100.0  # all rows' median would be 300 ms
    assert stats["samples_per_s"] == pytest.approx(160.0)
    assert stats["tokens_per_s"] is None


def test_steady_stats_fall_back_to_non_warmup_rows_and_say_so():
    frame = pd.DataFrame(_rows([], BASE_LOSSES[:5]))
    stats = steady_stats(frame)
    assert stats["basis"] == BASIS_NON_WARMUP and stats["fallback"]
    assert stats["rows"] == 3 and stats["step_time_ms"] == 500.0  # the profile rows
    empty = steady_stats(pd.DataFrame(_rows([], BASE_LOSSES[:5])[:2]))
    assert empty["basis"] == "none" and empty["step_time_ms"] is None


def test_summary_table_ratios_against_the_fp32_baseline(store, three_runs):
    base, fast, slow = three_runs
    table = summary_table(store, [fast, slow, base]).set_index("run_id")
    assert bool(table.loc[base, "is_baseline"])  # the fp32 run, wherever it is listed
    assert table.loc[base, "throughput_x"] == 1.0
    assert table.loc[fast, "throughput_x"] == pytest.approx(2.0)
    assert table.loc[slow, "throughput_x"] == pytest.approx(0.25)
    assert table.loc[fast, "step_time_ms"] == 50.0
    assert table.loc[fast, "mem_saved_pct"] == pytest.approx(40.0)
    assert table.loc[slow, "mem_saved_pct"] == pytest.approx(-0.5)
    assert table.loc[fast, "mem_saved_basis"] == "tensor peak"
    assert table.loc[fast, "process_peak_bytes"] == 1250 * MIB
    assert table.loc[fast, "final_loss_diff_pct"] == pytest.approx(1.0)
    assert table.loc[fast, "loss_noise_basis"] == "paired"
    assert table.loc[slow, "skipped_steps"] == 3
    assert table.loc[fast, "tensor_core_share"] == 0.85
    assert table.loc[base, "tensor_core_share"] is None  # unknown stays unknown
    assert table.loc[fast, "mfu"] == 0.42
    assert table.loc[base, "max_batch_fit"] is None
    assert table.loc[slow, "cpu_verdict"] == EMULATED_EVIDENCE["verdict"]
    # Another baseline: ratios follow it.
    other = summary_table(store, [base, fast], baseline_id=fast).set_index("run_id")
    assert other.loc[base, "throughput_x"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="baseline_id"):
        summary_table(store, [base], baseline_id=fast)
    with pytest.raises(RunNotFound):
        summary_table(store, [base, "no-such-run"])


def test_findings_say_faster_slower_and_why_with_the_tables_numbers(store, three_runs):
    base, fast, slow = three_runs
    table = summary_table(store, [base, fast, slow])
    runs = {run_id: store.get_run(run_id) for run_id in (base, fast, slow)}
    text = findings(table, runs)
    by_name = {line.split(":")[0]: line for line in text}
    assert by_name["Baseline fp32"].startswith("Baseline fp32: 160.0 samples/s, 100.00 ms per step")

    bf16 = by_name["bf16-amp"]
    assert "2.0x faster than fp32" in bf16
    assert "40 % less memory (tensor peak)" in bf16
    # A constant 1 % offset on the same batches is real, not noise.
    assert "final loss 1 % higher (worse) than fp32" in bf16
    assert "85 % of GPU kernel time on Tensor Cores" in bf16
    assert "MFU 42.0 %" in bf16

    fp16 = by_name["fp16-amp"]
    assert "4.0x slower than fp32" in fp16 and "faster" not in fp16
    assert "skipped 3 steps to overflow" in fp16 and "final loss scale 8192" in fp16
    assert "about the same tensor peak" in fp16
    assert "final loss within noise" in fp16  # a ±0.4 % wobble, final diff +0.4 %
    assert (
        f"Why, from the CPU evidence of its profiler window: {EMULATED_EVIDENCE['headline']}"
        in fp16
    )
    assert "Tensor Cores" not in fp16 and "Tensor Cores" not in by_name["Baseline fp32"]
    assert any(line.startswith("Fastest: bf16-amp (2.00x") for line in text)


def test_findings_do_not_explain_a_slowdown_without_evidence(store):
    base = write_rows(store, tiny_config("fp32"), _rows(STEADY_BASE, BASE_LOSSES))
    slow = write_rows(store, tiny_config("bf16-amp"), _rows([300.0] * 5, BASE_LOSSES))
    table = summary_table(store, [base, slow])
    (line,) = [s for s in findings(table, [store.get_run(base), store.get_run(slow)])
               if s.startswith("bf16-amp")]
    assert "3.0x slower" in line and "emulated" not in line
    assert "No CPU evidence was recorded" in line


def test_findings_explain_a_slowdown_by_oneDNN_reference_code_from_a_real_log(store):
    """A fp16 run whose convolutions ran oneDNN's reference code (the verdict from a real
    Xeon log, tests/data/onednn): the slowdown's "why" is that evidence."""
    from pathlib import Path

    from engine.analysis.cpu_evidence import REFERENCE, cpu_verdict, parse_onednn_verbose

    log = (Path(__file__).parent / "data" / "onednn"
           / "xeon-amx-bf16-avx512-fp16_fp16.transcribed.log").read_text()
    evidence = cpu_verdict(parse_onednn_verbose(log), "fp16",
                           frozenset({"avx512f", "avx512_fp16", "amx_bf16", "amx_tile"}))
    assert evidence["verdict"] == REFERENCE
    base = write_rows(store, tiny_config("fp32"), _rows(STEADY_BASE, BASE_LOSSES))
    slow = write_rows(store, tiny_config("fp16-amp"), _rows([1600.0] * 5, BASE_LOSSES),
                      summary={"cpu_evidence": evidence})
    table = summary_table(store, [base, slow])
    (line,) = [s for s in findings(table, [store.get_run(base), store.get_run(slow)])
               if s.startswith("fp16-amp")]
    assert "16x slower than fp32" in line
    assert (f"Why, from the CPU evidence of its profiler window: {evidence['headline']}"
            in line)
    assert "oneDNN's reference code: 97 % of matrix time" in line


def test_findings_flag_fallback_timing_failed_runs_and_different_workloads(store):
    base = write_rows(store, tiny_config("fp32"), _rows(STEADY_BASE, BASE_LOSSES))
    stopped = write_rows(store, tiny_config("bf16-amp", batch_size=32),
                         _rows([], BASE_LOSSES[:5]), status="failed",
                         reason="worker exited with signal 9 (SIGKILL) at step 5")
    table = summary_table(store, [base, stopped])
    assert table.set_index("run_id").loc[stopped, "steady_basis"] == BASIS_NON_WARMUP
    text = findings(table, [store.get_run(base), store.get_run(stopped)])
    assert text[0].startswith("Caution: the runs differ in batch_size (16, 32)")
    (line,) = [s for s in text if s.startswith("bf16-amp")]
    assert "run failed: worker exited with signal 9" in line
    assert "timing from non-warm-up steps" in line


def test_config_diff_lists_only_differing_fields():
    configs = {"a": RunConfig(model="mlp", precision="fp32", batch_size=16),
               "b": RunConfig(model="mlp", precision="bf16-amp", batch_size=32),
               "c": RunConfig(model="mlp", precision="fp16-amp", batch_size=16,
                              loss_scaling=False)}
    diff = config_diff(configs)
    assert list(diff["field"]) == ["precision", "batch_size", "loss_scaling"]
    assert list(diff.columns) == ["field", "a", "b", "c"]
    assert diff.set_index("field").loc["batch_size"].tolist() == ["16", "32", "16"]
    assert config_diff({"a": configs["a"], "z": configs["a"]}).empty


def test_default_selection_prefers_the_preset_then_the_newest_group(store):
    old_group = [write_rows(store, tiny_config(p), _rows(STEADY_BASE, BASE_LOSSES))
                 for p in ("fp32", "bf16-amp")]
    new_group = [write_rows(store, tiny_config(p, batch_size=8), _rows(STEADY_BASE, BASE_LOSSES))
                 for p in ("fp32", "fp16-amp", "bf16-amp")]
    write_rows(store, tiny_config("fp32", batch_size=4), _rows(STEADY_BASE, BASE_LOSSES))
    write_rows(store, tiny_config("fp16-amp", batch_size=4), _rows(STEADY_BASE, BASE_LOSSES),
               status="failed")  # a failed partner does not make a group
    assert default_selection(store) == new_group
    assert default_selection(store, preset_ids=old_group) == old_group
    assert default_selection(store, preset_ids=["gone-1", old_group[1]]) == [old_group[1]]
    assert default_selection(store, preset_ids=["gone-1"]) == new_group


def test_default_selection_of_an_empty_store(store):
    assert default_selection(store) == []


def test_ema_smooths_and_keeps_gaps():
    assert ema([1.0, 2.0, 3.0], 0.0).tolist() == [1.0, 2.0, 3.0]
    smoothed = ema([0.0, 1.0, 1.0, float("nan"), 1.0], 0.5).tolist()
    assert smoothed[:3] == pytest.approx([0.0, 1 / 1.5, 1.5 / 1.75])  # bias-corrected
    assert math.isnan(smoothed[3]) and 0.857 < smoothed[4] < 1.0
    with pytest.raises(ValueError, match="alpha"):
        ema([1.0], 1.0)


@pytest.mark.slow
def test_summary_of_real_tiny_cpu_runs(store):
    base = record_run(store, tiny_config("fp32", steps=8))
    other = record_run(store, tiny_config("bf16-amp", steps=8))
    table = summary_table(store, [base, other]).set_index("run_id")
    stored = store.read_metrics(other, max_points=None)
    steady = stored[stored["phase"] == "steady"]
    assert table.loc[other, "steady_rows"] == len(steady) == 8 - 2  # warm-up excluded
    assert table.loc[other, "step_time_ms"] == pytest.approx(steady["step_time_ms"].median())
    assert table.loc[other, "throughput_x"] == pytest.approx(
        steady["samples_per_s"].median() / table.loc[base, "samples_per_s"])
    text = findings(table.reset_index(), [store.get_run(base), store.get_run(other)])
    assert speed_word(table.loc[other], table.loc[base]) in text[1]


def _long_rows(steady_ms: float, loss_scale: float, steps: int = 40) -> list[dict]:
    """Enough logged steps for a full loss tail (LOSS_TAIL_ROWS) after warm-up."""
    losses = [2.5 * loss_scale * (0.98 ** i) * (1.003 if i % 3 else 0.997) for i in range(steps)]
    return _rows([steady_ms + (i % 4) for i in range(steps - 5)], losses)


def _drop_metric_rows(store, run_id: str) -> None:
    with store.transaction() as conn:
        conn.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))
        conn.execute("DELETE FROM metrics_overview WHERE run_id = ?", (run_id,))


def test_finished_runs_compare_from_stored_stats_without_reading_rows(store):
    from engine.analysis.steady import COMPARE_STATS_KEY
    from engine.run.finalize import finalize_run_data

    base = write_rows(store, tiny_config("fp32"), _long_rows(100.0, 1.0))
    fast = write_rows(store, tiny_config("bf16-amp"), _long_rows(50.0, 1.01))
    from_rows = summary_table(store, [base, fast])
    for run_id in (base, fast):
        finalize_run_data(store, run_id)
        assert store.get_run(run_id).summary[COMPARE_STATS_KEY]["steady"]["rows"] == 35
        _drop_metric_rows(store, run_id)  # from here on only the summary can answer
    from_stats = summary_table(store, [base, fast])
    pd.testing.assert_frame_equal(from_rows, from_stats)
    fast_row = from_stats.set_index("run_id").loc[fast]
    assert fast_row["throughput_x"] == pytest.approx(101.0 / 51.0)  # medians 101 / 51 ms
    assert fast_row["loss_noise_basis"] == "paired"


def test_active_runs_and_misaligned_tails_are_computed_from_rows(store):
    from engine.run.finalize import finalize_run_data
    from engine.schema import RUNNING

    base = write_rows(store, tiny_config("fp32"), _long_rows(100.0, 1.0))
    finalize_run_data(store, base)
    # Stopped early: its tail ends before the baseline's, so the paired noise needs the
    # shared steps from every row, not the stored tails.
    short = write_rows(store, tiny_config("bf16-amp"), _long_rows(50.0, 1.01)[:30])
    finalize_run_data(store, short)
    table = summary_table(store, [base, short]).set_index("run_id")
    assert table.loc[short, "loss_noise_basis"] == "paired"
    # A running run's stored stats (none yet, or stale) are never used.
    live = write_rows(store, tiny_config("fp16-amp"), _long_rows(80.0, 1.0)[:10],
                      status=RUNNING)
    finalize_run_data(store, live)  # stale from the next write on
    store.write_metrics(live, _long_rows(80.0, 1.0)[10:])
    assert summary_table(store, [base, live]).set_index("run_id").loc[live, "steady_rows"] == 35


def test_multi_process_runs_are_named_by_their_communication_and_flagged_by_process_count(store):
    two = dict(nprocs=2, precision="bf16-amp")
    rows = _rows(STEADY_BASE, BASE_LOSSES)
    single = write_rows(store, tiny_config("bf16-amp"), rows)
    plain = write_rows(store, tiny_config(**two), rows)
    hooked = write_rows(store, tiny_config(**two, comm_hook="fp16"), rows)
    sharded = write_rows(store, tiny_config(**two, sharding="fsdp2", comm_hook="bf16"), rows)
    runs = [store.get_run(i) for i in (single, plain, hooked, sharded)]
    assert list(display_names(runs).values()) == [
        "bf16-amp", "bf16-amp (2x ddp)", "bf16-amp (2x ddp, fp16 gradients)",
        "bf16-amp (2x fsdp2, bf16 gradients)"]
    table = summary_table(store, [single, plain])
    notes = findings(table, runs[:2])
    assert any("Caution: the runs differ in nprocs (1, 2)" in n for n in notes), notes
    # Same process count, different gradient communication: a comparison, no caution.
    notes = findings(summary_table(store, [plain, hooked]), runs[1:3])
    assert not any(n.startswith("Caution") for n in notes), notes


@pytest.mark.slow
def test_numerics_demo_findings_speak_of_underflow_not_speed(store):
    """Runs that sample numerics (the demo: fp16 without loss scaling vs fp16-amp):
    the findings are about zero gradients with and without the scale, never a speedup."""
    no_scale = record_run(store, tiny_config("fp16-amp", loss_scaling=False, numerics=True,
                                             steps=12, name="fp16 no scaling"))
    scaled = record_run(store, tiny_config("fp16-amp", numerics=True, steps=12,
                                           name="fp16-amp"))
    table = summary_table(store, [no_scale, scaled])
    runs = [store.get_run(no_scale), store.get_run(scaled)]
    text = findings(table, runs, run_dir=store.run_dir)
    assert text[0].startswith("fp16 no scaling: at step ")
    assert "of activation gradients were exactly zero" in text[0]
    assert "with the loss scale 65536" in text[1]
    assert text[-1].startswith("Speed is not compared here")
    joined = " ".join(text)
    assert "faster" not in joined and "slower" not in joined


def test_no_fastest_run_is_named_when_a_run_was_measured_on_a_busy_machine(store, three_runs):
    base, fast, slow = three_runs
    busy = {"busy": True, "busy_share": 1.0, "samples": 9, "cores": 2,
            "words": "measured while the machine was busy (load 3.0 on 2 cores): throughput "
                     "figures are unreliable"}
    store.merge_summary(fast, {"contention": busy})
    table = summary_table(store, [base, fast, slow])
    text = findings(table, {i: store.get_run(i) for i in (base, fast, slow)})
    assert not any(line.startswith("Fastest:") for line in text)
    assert any(line.startswith("No fastest run is named") for line in text)
    bf16 = next(line for line in text if line.startswith("bf16-amp:"))
    assert bf16.startswith("bf16-amp: throughput 2.00x fp32's, not a speedup figure: bf16-amp "
                           "was measured while the machine was busy")
    assert "faster than" not in bf16


def test_the_unpaired_interval_is_kept_per_pair_of_step_times_and_bounded():
    import numpy as np

    from engine.analysis import compare

    rng = np.random.default_rng(7)
    base = list(100.0 + rng.normal(0, 2, 400))
    mode = list(80.0 + rng.normal(0, 2, 400))
    fresh = compare._bootstrap_interval(np.asarray(base), np.asarray(mode))
    first = compare.unpaired_ratio_interval(base, mode)
    again = compare.unpaired_ratio_interval(base, mode)
    assert first == fresh == again  # kept, and the same figure as computed afresh
    assert first[0] < 100.0 / 80.0 < first[1]
    # one more step time is another pair of runs (a run still logging): computed anew
    grown = compare.unpaired_ratio_interval(base, mode + [80.0])
    assert grown == compare._bootstrap_interval(np.asarray(base), np.asarray(mode + [80.0]))
    for shift in range(compare._INTERVALS_KEPT + 5):  # the oldest are dropped
        compare.unpaired_ratio_interval(base, [m + shift for m in mode[:20]])
    assert len(compare._INTERVALS) == compare._INTERVALS_KEPT
