"""The skipped-step ledger: a deliberately broken fp16-amp run (a layer that multiplies
its incoming gradient by 1e4, so the gradient below it overflows fp16) names the layer
below it in every skip, with the loss scale halving; a healthy run records none; Live
shows the table and `show --json` carries it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.analysis.live import ledger_rows, ledger_sentence
from engine.config import RunConfig
from engine.training.loop import train

OVERFLOW = Path(__file__).resolve().parent / "data" / "workloads" / "fp16_overflow_workload.py"
APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _train(cfg: RunConfig):
    rows: list[dict] = []
    return train(cfg, "cpu", emit=rows.extend), rows


@pytest.fixture(scope="module")
def broken_run():
    cfg = RunConfig(model="custom", workload=str(OVERFLOW), precision="fp16-amp", steps=30,
                    batch_size=8, profile=False, device="cpu", log_interval=5)
    return _train(cfg)


def test_a_layer_that_overflows_is_named_in_every_skip(broken_run):
    result, rows = broken_run
    ledger = result.skip_ledger
    entries = ledger["entries"]
    assert result.skipped_steps >= 5 and entries
    # the run's own steps only: the FLOP count before step 1 trains nothing, skips nothing
    assert [e["step"] for e in entries] == sorted(e["step"] for e in entries)
    assert entries[0]["step"] >= 1 and len(entries) == result.skipped_steps
    assert ledger["entries_total"] == len(entries)
    for entry in entries:
        assert entry["origin"] == "encoder"  # below the amplifier: where inf appeared
        assert entry["nonfinite_layers"] == ["encoder"]
        assert entry["loss_finite"] is True  # the forward pass was fine
        assert entry["scale_after"] == entry["scale_before"] / 2  # GradScaler backed off
        head = next(layer for layer in entry["layers"] if layer["layer"] == "head")
        assert head["nonfinite"] is False and head["max_abs_grad_scaled"] > 0
    assert entries[0]["scale_before"] == 65536.0  # the configured initial scale
    assert rows[-1]["skipped_steps"] == result.skipped_steps


def test_the_ledger_reads_as_rows_and_one_sentence(broken_run):
    result, _rows = broken_run
    rows = ledger_rows(result.skip_ledger)
    assert rows[0]["step"] == "1" and rows[0]["loss scale"] == "65536 -> 32768"
    # the parameters where the overflow entered, by their names in named_parameters()
    assert all(row["overflow entered at"] in ("encoder.weight", "encoder.weight, encoder.bias")
               for row in rows)
    assert all(row["non-finite layers"] == "1 of 2" for row in rows)
    assert all(row["largest finite gradient (scaled)"].endswith(" in head") for row in rows)
    sentence = ledger_sentence(result.skip_ledger, result.skipped_steps)
    assert sentence.startswith(f"The GradScaler skipped {result.skipped_steps} step(s) of the "
                               "run:")
    assert "FLOP-count" not in sentence and "encoder.weight" in sentence


def test_a_healthy_fp16_run_records_no_skip_and_other_modes_no_ledger():
    cfg = RunConfig(model="mlp", size="tiny", precision="fp16-amp", steps=10, batch_size=8,
                    profile=False, device="cpu", grad_scaler_init_scale=256.0)
    result, _rows = _train(cfg)
    assert result.skipped_steps == 0 and result.skip_ledger["entries"] == []
    assert ledger_sentence(result.skip_ledger, 0) is None
    result, _rows = _train(cfg.replace(precision="bf16-amp"))
    assert result.skip_ledger is None  # no GradScaler, nothing to skip


def test_live_shows_the_ledger_and_show_json_carries_it(broken_run, home, monkeypatch, capsys):
    from streamlit.testing.v1 import AppTest

    from engine.cli import main as cli_main
    from engine.store import Store

    result, rows = broken_run
    store = Store(home)
    cfg = RunConfig(model="custom", workload=str(OVERFLOW), precision="fp16-amp", steps=30,
                    batch_size=8, profile=False, device="cpu")
    run_id = store.create_run(cfg, "cpu", "CPU")
    store.set_status(run_id, "running")
    store.write_metrics(run_id, rows)
    store.merge_summary(run_id, {"skip_ledger": result.skip_ledger,
                                 "skipped_steps": result.skipped_steps})
    store.set_status(run_id, "finished", "finished after 30 steps")
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.query_params["run"] = run_id
    at.switch_page("pages/live.py").run()
    assert not at.exception
    assert any(h.value == "Skipped steps: where fp16 overflowed" for h in at.subheader)
    table = next(frame.value for frame in at.dataframe
                 if "overflow entered at" in frame.value.columns)
    assert set(table["overflow entered at"]) <= {"encoder.weight", "encoder.weight, encoder.bias"}
    assert any("The GradScaler skipped" in c.value for c in at.caption)
    assert cli_main(["show", run_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["summary"]["skip_ledger"]["entries"][0]["origin"] == "encoder"


GRADSCALER_CASE = OVERFLOW.parent / "gradscaler_pytorch_case.py"


def test_pytorchs_own_gradscaler_case_gives_pytorchs_scale_series_and_names_the_parameter():
    """PyTorch's test expects 128 -> 256 -> 512 -> (skip) 256 -> 512: the FLOP count must
    not train (it once grew the scale to 1024 before the skip)."""
    cfg = RunConfig(model="custom", workload=str(GRADSCALER_CASE), precision="fp16-amp",
                    steps=4, batch_size=8, profile=False, device="cpu", log_interval=1,
                    optimizer="sgd", grad_scaler_init_scale=128.0,
                    grad_scaler_growth_interval=1)
    result, rows = _train(cfg)
    assert [row["loss_scale"] for row in rows] == [256.0, 512.0, 256.0, 512.0]
    assert result.loss_scale_final == 512.0 and result.skipped_steps == 1
    (entry,) = result.skip_ledger["entries"]
    assert entry["step"] == 3 and (entry["scale_before"], entry["scale_after"]) == (512.0, 256.0)
    assert entry["origin"] == "1" and entry["origin_parameters"] == ["1.weight"]
    (row,) = ledger_rows(result.skip_ledger)
    assert row["overflow entered at"] == "1.weight" and row["loss scale"] == "512 -> 256"


def test_the_flop_count_trains_nothing():
    """Step 1 after the count sees the same weights, batch and random state as without it."""
    import torch

    from engine.training.loop import Trainer, measure_flops_per_step
    cfg = RunConfig(model="resnet", size="tiny", precision="fp32", steps=2, batch_size=4,
                    profile=False, device="cpu")
    counted, plain = Trainer(cfg, torch.device("cpu")), Trainer(cfg, torch.device("cpu"))
    try:
        assert measure_flops_per_step(counted) > 0
        for name, value in counted.module.state_dict().items():
            assert torch.equal(value, plain.module.state_dict()[name]), name
        assert all(p.grad is None for p in counted.params)
        loss_counted, _ = counted.step(1)
        loss_plain, _ = plain.step(1)
        assert torch.equal(loss_counted, loss_plain)
    finally:
        counted.close()
        plain.close()
