"""Managing runs from the pages, through Streamlit's AppTest on real tiny CPU runs: the
Runs table and its filters, archive, delete (confirmed; refused while a run is active),
tags and notes, re-launch into a prefilled Launch form, Live's smoothing, log scale and
downloads, and the shareable URLs of Compare, Kernels and Sweep."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _real_runs import record_run, tiny_config
from streamlit.testing.v1 import AppTest

from engine.cluster.sweep import SweepGrid, cell_label, results_matrix, sweep_view
from engine.config import RunConfig
from engine.display import throughput_text
from engine.schema import FINISHED, RUNNING, SWEEP_DONE, SWEEP_LOCAL
from engine.store import Store
from tests.chart_support import chart_specs, charts_by_title

APP = str(Path(__file__).resolve().parent.parent / "app.py")
pytestmark = pytest.mark.slow


@pytest.fixture
def lab(home):
    store = Store(home)
    ids = [record_run(store, tiny_config("fp32", steps=8, name="alpha baseline")),
           record_run(store, tiny_config("bf16-amp", steps=8, batch_size=32))]
    return store, ids


def _page(path: str, query: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.switch_page(path).run()
    assert not at.exception, at.exception
    return at


def _select_rows(at: AppTest, rows: list[int]) -> None:
    """What clicking rows of the Runs table does (AppTest cannot click a grid)."""
    version = (at.session_state["runs_table_version"]
               if "runs_table_version" in at.session_state else 0)
    key = f"runs_table_{version}"
    at.session_state[key] = {"selection": {"rows": rows, "columns": [], "cells": []}}
    at.run()
    assert not at.exception, at.exception


def _table(at: AppTest):
    return at.dataframe[0].value


def test_runs_table_has_created_duration_full_label_tags_and_note(lab):
    store, (alpha, bf16) = lab
    store.set_tags(alpha, {"team": "infra"})
    store.set_note(alpha, "the baseline")
    at = _page("pages/runs.py")
    table = _table(at)
    assert {"created", "duration_s", "label", "tags", "note"} <= set(table.columns)
    row = table[table["run_id"] == alpha].iloc[0]
    assert row["label"] == "alpha baseline" and row["tags"] == "team=infra"
    assert row["note"] == "the baseline" and row["duration_s"] > 0


def test_runs_search_and_tag_filters(lab):
    store, (alpha, bf16) = lab
    store.set_tags(bf16, {"goal": "bf16"})
    at = _page("pages/runs.py")
    at.text_input(key="runs_search").set_value("ALPHA").run()
    assert _table(at)["run_id"].tolist() == [alpha]
    at.text_input(key="runs_search").set_value("").run()
    at.text_input(key="runs_tags").set_value("goal=bf16").run()
    assert _table(at)["run_id"].tolist() == [bf16]
    at.text_input(key="runs_tags").set_value("").run()
    at.multiselect(key="runs_precision").set_value(["fp32"]).run()
    assert _table(at)["run_id"].tolist() == [alpha]


def test_archive_hides_a_run_until_archived_runs_are_shown(lab):
    store, (alpha, bf16) = lab
    at = _page("pages/runs.py")
    row = _table(at)["run_id"].tolist().index(bf16)
    _select_rows(at, [row])
    at.button(key="archive").click().run()
    assert store.get_run(bf16).archived
    assert _table(at)["run_id"].tolist() == [alpha]
    assert "1 archived, hidden" in at.caption[0].value
    at.toggle(key="runs_archived").set_value(True).run()
    assert set(_table(at)["run_id"]) == {alpha, bf16}


def test_delete_needs_the_confirmation_and_removes_rows_and_files(lab):
    store, (alpha, bf16) = lab
    at = _page("pages/runs.py")
    _select_rows(at, [_table(at)["run_id"].tolist().index(bf16)])
    assert at.button(key="delete_runs").disabled  # not before the box is ticked
    at.checkbox(key="delete_confirm").check().run()
    at.button(key="delete_runs").click().run()
    assert not at.exception, at.exception
    assert [r.id for r in store.list_runs()] == [alpha]
    assert not store.run_dir(bf16).exists() and store.run_dir(alpha).exists()


def test_delete_of_a_running_run_is_refused_on_the_page(home):
    store = Store(home)
    run_id = store.create_run(RunConfig(model="mlp"), "cpu")
    store.set_status(run_id, RUNNING)
    store.update_run(run_id, pid=1)  # alive, so reconcile leaves it running
    at = _page("pages/runs.py")
    _select_rows(at, [0])
    assert any("stop them first" in w.value for w in at.warning)
    assert not [b for b in at.button if b.key == "delete_runs"]
    assert store.get_run(run_id).status == RUNNING


def test_tags_and_note_are_edited_on_the_page(lab):
    store, (alpha, _bf16) = lab
    at = _page("pages/runs.py")
    _select_rows(at, [_table(at)["run_id"].tolist().index(alpha)])
    at.text_input(key=f"tags_{alpha}").set_value("team=infra, goal=bf16")
    at.text_area(key=f"note_{alpha}").set_value("kept for the review")
    at.button[-1].click().run()  # the form's "Save tags and note"
    run = store.get_run(alpha)
    assert run.tags == {"team": "infra", "goal": "bf16"} and run.note == "kept for the review"
    _select_rows(at, [_table(at)["run_id"].tolist().index(alpha)])  # a save clears the selection
    at.text_input(key=f"tags_{alpha}").set_value("bad key!=1")
    at.button[-1].click().run()
    assert any("Not saved" in e.value for e in at.error)
    assert store.get_run(alpha).tags == {"team": "infra", "goal": "bf16"}


def test_relaunch_opens_launch_prefilled_with_the_runs_config(lab):
    store, (_alpha, bf16) = lab
    at = _page("pages/runs.py")
    _select_rows(at, [_table(at)["run_id"].tolist().index(bf16)])
    at.button(key="relaunch").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Launch a run"
    cfg = store.get_run(bf16).config
    assert at.selectbox(key="precision").value == "bf16-amp"
    assert at.selectbox(key="model").value == cfg.model
    assert at.text_input(key="batch_size").value == "32"
    assert at.text_input(key="steps").value == str(cfg.steps)
    assert at.checkbox(key="profile").value is False
    assert any(bf16 in info.value for info in at.info)
    assert len(store.list_runs()) == 2  # nothing launched by opening the form


def test_live_smoothing_log_scale_downloads_and_relaunch(lab):
    store, (alpha, _bf16) = lab
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.session_state["live_run_id"] = alpha
    at.switch_page("pages/live.py").run()
    charts = charts_by_title(at)
    assert len(charts["Loss"]["data"]) == 1
    at.slider(key="live_smoothing").set_value(0.5)
    at.toggle(key="live_log").set_value(True).run()
    assert not at.exception, at.exception
    charts = charts_by_title(at)
    loss = charts["Loss"]
    assert [t["name"] for t in loss["data"]] == ["loss (raw)", "loss (EMA 0.5)"]
    assert loss["layout"]["yaxis"]["type"] == "log"
    assert charts["Throughput (samples/s)"]["layout"]["yaxis"]["type"] == "log"
    downloads = {d.proto.label for d in at.get("download_button")}
    assert {"CSV", "Parquet"} <= downloads
    at.button(key="live_relaunch").click().run()
    assert at.title[0].value == "Launch a run"


def test_compare_url_restores_the_view_and_names_unknown_ids(lab):
    store, (alpha, bf16) = lab
    at = _page("pages/compare.py", {"runs": f"{alpha},{bf16},no-such-run", "baseline": bf16})
    assert at.multiselect(key="compare_runs").value == [alpha, bf16]
    assert at.selectbox(key="compare_baseline").value == bf16
    assert any("do not exist here" in w.value for w in at.warning)
    assert any("no-such-run" in c.value for c in at.code)
    assert at.query_params["runs"] == f"{alpha},{bf16}"  # the URL now names what is shown
    assert at.query_params["baseline"] == bf16


def test_kernels_url_selects_the_run_and_names_an_unknown_one(lab):
    store, (alpha, bf16) = lab
    for run_id in (alpha, bf16):
        store.merge_summary(
            run_id,
            {
                "cpu_evidence": {
                    "verdict": "not applicable",
                    "headline": "fp32 run",
                    "evidence": [],
                    "primitives": [],
                }
            },
        )
    at = _page("pages/kernels.py", {"run": alpha})
    assert at.selectbox(key="kernels_run").value == alpha
    at = _page("pages/kernels.py", {"run": "no-such-run"})
    assert any("no profiler window here" in w.value for w in at.warning)
    assert at.query_params["run"] == at.selectbox(key="kernels_run").value


def _finished_sweep(store: Store) -> str:
    grid = SweepGrid(models=("mlp",), precisions=("fp32", "bf16-amp"), batch_sizes=(8, 48),
                     size="tiny", steps=6, profile=False)
    sweep_id = store.create_sweep(grid.to_dict(), SWEEP_LOCAL)
    for position, cfg in enumerate(grid.configs()):
        store.link_sweep_run(sweep_id, record_run(store, cfg), position)
    store.set_sweep_status(sweep_id, SWEEP_DONE)
    return sweep_id


def test_sweep_url_free_batch_sizes_and_absolute_values_in_cells(home):
    store = Store(home)
    older, newer = _finished_sweep(store), _finished_sweep(store)
    at = _page("pages/sweep.py", {"sweep": older})
    assert at.selectbox(key="sw_select").value == older  # not the newest: the URL's
    at.text_input(key="sw_batch_sizes").set_value("8, 48").run()
    assert "**4 runs**" in " ".join(md.value for md in at.markdown)
    at.text_input(key="sw_batch_sizes").set_value("8, 4.5").run()
    assert any("Batch sizes" in e.value and "whole number" in e.value for e in at.error)
    assert at.button(key="sw_create").disabled
    heatmap = chart_specs(at)[0]
    cells = [text for row in heatmap["data"][0]["text"] for text in row]
    # "0.79x n.s.<br>..." or "1.12x [1.05-1.19]<br>...": the ratio, what it may claim, the figure
    assert all(re.search(r"\dx( (n\.s\.|busy|\[[\d.]+-[\d.]+\]))?<br>", text)
               and "samples/s" in text for text in cells), cells
    matrix = results_matrix(sweep_view(store, older), "throughput_x")
    fp32 = store.get_run(sweep_view(store, older).runs[0].id)
    assert cell_label(matrix, "mlp", "fp32", 8) == (
        f"1.00x<br>{throughput_text(fp32.summary['samples_per_s'], 'samples/s')}")
    assert store.get_run(fp32.id).status == FINISHED
    at = _page("pages/sweep.py", {"sweep": "sweep-nope"})
    assert any("does not exist here" in w.value for w in at.warning)
    assert at.selectbox(key="sw_select").value == newer


def test_two_selected_runs_open_in_compare(lab):
    store, (alpha, bf16) = lab
    at = _page("pages/runs.py")
    _select_rows(at, [0, 1])
    at.button(key="compare_selected").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Compare runs"
    assert set(at.multiselect(key="compare_runs").value) == {alpha, bf16}


def test_delete_of_a_mixed_selection_deletes_the_ended_runs_only(lab):
    store, (alpha, bf16) = lab
    running = store.create_run(RunConfig(model="mlp"), "cpu")
    store.set_status(running, RUNNING)
    store.update_run(running, pid=1)  # alive: reconcile leaves it running
    at = _page("pages/runs.py")
    ids = _table(at)["run_id"].tolist()
    _select_rows(at, [ids.index(bf16), ids.index(running)])
    assert any("not deleted" in w.value for w in at.warning)
    at.checkbox(key="delete_confirm").check().run()
    at.button(key="delete_runs").click().run()
    assert {r.id for r in store.list_runs()} == {alpha, running}


def test_a_bad_tag_filter_says_so_and_matches_nothing(lab):
    at = _page("pages/runs.py")
    at.text_input(key="runs_tags").set_value("bad key!=1").run()
    assert any("Tags filter" in e.value for e in at.error)
    assert len(_table(at)) == 0


def test_live_names_an_unknown_run_in_its_address(lab):
    store, (alpha, bf16) = lab
    at = _page("pages/live.py", {"run": "no-such-run"})
    assert any("does not exist here" in w.value for w in at.warning)
    assert any("no-such-run" in c.value for c in at.code)


def test_compare_with_nothing_selected_clears_its_address(lab):
    store, (alpha, bf16) = lab
    at = _page("pages/compare.py", {"runs": alpha, "baseline": alpha})
    at.multiselect(key="compare_runs").set_value([]).run()
    assert "runs" not in at.query_params and "baseline" not in at.query_params


def test_heatmap_cells_of_absolute_metrics_use_thousands_separators(home):
    store = Store(home)
    sweep_id = _finished_sweep(store)
    matrix = results_matrix(sweep_view(store, sweep_id), "samples_per_s")
    text = cell_label(matrix, "mlp", "fp32", 8)
    assert "e+" not in text and text.endswith("samples/s")


def test_a_running_run_without_progress_is_called_out_on_live_and_in_show(home, capsys):
    import time

    from engine.analysis.stall import silent_s, stall_of
    from engine.cli import main as cli_main

    store = Store(home)
    run_id = store.create_run(RunConfig(model="mlp"), "cpu")
    store.set_status(run_id, RUNNING)
    store.update_run(run_id, pid=1, started_at=time.time() - 300)  # alive (pid 1): not reconciled
    store.write_metrics(run_id, [{"step": 1, "loss": 1.0, "wall_time_s": 10.0}])
    assert silent_s(stall_of(store, store.get_run(run_id))) == pytest.approx(290, abs=5)
    at = _page("pages/live.py", {"run": run_id})
    assert any("No progress for 4 min" in w.value for w in at.warning)
    assert cli_main(["show", run_id, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["no_progress_s"] > 280
    assert "No progress for 4 min" in captured.err and "engine stop" in captured.err
    store.write_metrics(run_id, [{"step": 2, "loss": 1.0, "wall_time_s": 299.0}])
    assert stall_of(store, store.get_run(run_id)) is None


def test_runs_grid_download_carries_no_formula_from_user_text(lab):
    """Streamlit's own "Download as CSV" of the Runs grid writes the cells as shown: a
    note, tag or reason a spreadsheet would run as a formula is shown (and saved) quoted."""
    import io

    store, (alpha, _bf16) = lab
    store.set_note(alpha, "=1+2")
    store.set_tags(alpha, {"team": "@SUM(A1)"})
    try:
        table = _table(_page("pages/runs.py"))
        row = table[table["run_id"] == alpha].iloc[0]
        assert row["note"] == "'=1+2" and row["tags"] == "team=@SUM(A1)"  # starts with "t"
        saved = io.StringIO()
        table.to_csv(saved, index=False)  # what the grid's download writes
        cells = [cell for line in saved.getvalue().splitlines() for cell in line.split(",")]
        assert not any(cell.startswith(("=", "+", "-", "@")) for cell in cells), cells
    finally:
        store.set_note(alpha, "")
        store.set_tags(alpha, {})
