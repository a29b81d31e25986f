"""The pages under hostile input and concurrent change, in Streamlit's AppTest: the Runs
table's selection follows run ids when another tab or the CLI adds a run."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from engine.config import RunConfig
from engine.schema import FINISHED
from engine.store import Store

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _ended_run(store: Store, name: str) -> str:
    run_id = store.create_run(RunConfig(model="mlp", name=name), "cpu")
    store.set_status(run_id, FINISHED)
    return run_id


def _runs_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception, at.exception
    return at


def _select_rows(at: AppTest, rows: list[int]) -> None:
    """What clicking rows of the Runs table does (AppTest cannot click a grid)."""
    try:
        version = at.session_state["runs_table_version"]
    except KeyError:  # AppTest's session state has no .get
        version = 0
    at.session_state[f"runs_table_{version}"] = {"selection": {"rows": rows, "columns": [],
                                                               "cells": []}}
    at.run()
    assert not at.exception, at.exception


def test_delete_removes_the_selected_run_after_another_run_shifted_the_rows(home):
    store = Store(home)
    older = _ended_run(store, "older")
    picked = _ended_run(store, "picked")
    at = _runs_page()
    rows = at.dataframe[0].value["run_id"].tolist()
    assert rows == [picked, older]
    _select_rows(at, [rows.index(picked)])
    assert at.subheader[0].value == f"Run {picked}"
    # Another tab (or the CLI) adds a run: it is listed first and moves every row down.
    newcomer = _ended_run(store, "newcomer")
    at.run()
    assert not at.exception, at.exception
    assert at.subheader[0].value == f"Run {picked}"
    at.checkbox(key="delete_confirm").check().run()
    at.button(key="delete_runs").click().run()
    assert not at.exception, at.exception
    assert {r.id for r in store.list_runs()} == {older, newcomer}


def test_a_selection_of_a_run_deleted_elsewhere_says_so(home):
    store = Store(home)
    keep = _ended_run(store, "keep")
    gone = _ended_run(store, "gone")
    at = _runs_page()
    _select_rows(at, [at.dataframe[0].value["run_id"].tolist().index(gone)])
    store.delete_run(gone)
    at.run()
    assert not at.exception, at.exception
    assert not [b for b in at.button if b.key == "delete_runs"]
    assert [r.id for r in store.list_runs()] == [keep]


# -- hostile values in every page's address ------------------------------------------------
PAGES = ["pages/launch.py", "pages/live.py", "pages/runs.py", "pages/compare.py",
         "pages/sweep.py", "pages/kernels.py", "pages/check.py"]
ADDRESS_PARAMS = ("run", "runs", "baseline", "relaunch", "sweep")
HOSTILE_VALUES = [
    "../../etc", "../../../../etc/passwd", "run\x00id", "x" * 5000, "a,b,,../c",
    "**bold** ![img](http://example.invalid/x.png) <script>alert(1)</script>",
    "javascript:alert(1)", "1' OR '1'='1'; DROP TABLE runs; --", "%00%2e%2e%2f", " ",
    "20260101-000000-abcdef",  # well formed, unknown here
]


def _lab_with_everything(home) -> Store:
    """A finished run with CPU evidence (Kernels lists it) and a sweep (Sweep draws it)."""
    store = Store(home)
    run_id = _ended_run(store, "target")
    store.merge_summary(run_id, {"cpu_evidence": {"verdict": "not applicable", "headline":
                                                  "fp32 run", "evidence": [], "primitives": []}})
    sweep_id = store.create_sweep({"models": ["mlp"], "precisions": ["fp32"],
                                   "batch_sizes": [8], "size": "tiny", "steps": 6}, "local")
    store.link_sweep_run(sweep_id, run_id, 0)
    return store


def test_every_page_draws_with_hostile_ids_in_its_address(home):
    _lab_with_everything(home)
    failures = []
    for page in PAGES:
        for value in HOSTILE_VALUES:
            # A fresh session per page and value: a shared link's first visit.
            at = AppTest.from_file(APP, default_timeout=60)
            for param in ADDRESS_PARAMS:
                at.query_params[param] = value
            at.run()
            at.switch_page(page).run()
            if at.exception:
                failures.append((page, value, at.exception[0].message))
                continue
            # Nothing from the address is drawn as Markdown: it may only appear as code.
            drawn = list(at.markdown) + list(at.warning) + list(at.error) + list(at.info)
            if len(value.strip()) > 3 and any(value in element.value for element in drawn):
                failures.append((page, value, "echoed as Markdown"))
    assert not failures, "\n".join(f"{page} {value[:40]!r}: {what[:200]}"
                                    for page, value, what in failures)


def test_a_malformed_relaunch_id_is_named_as_text(home):
    _lab_with_everything(home)
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.query_params["relaunch"] = "../../etc"
    at.switch_page("pages/launch.py").run()
    assert not at.exception, at.exception
    assert any("not run ids" in w.value and "no such run" in w.value for w in at.warning)
    assert any(c.value == "../../etc" for c in at.code)


# -- the Kernels page's temporary copies of uploads -----------------------------------------
TRACES = Path(__file__).resolve().parent / "data" / "traces"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("precision-lab-"))


def test_an_uploaded_trace_leaves_no_temporary_copy_and_old_ones_are_removed(
        home, tmp_path, monkeypatch):
    import os
    import tempfile
    import time

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    # What a server killed in the middle of reading an upload left behind, two hours ago.
    stale = temp / "precision-lab-upload-abc.json.gz"
    stale.write_bytes(b"\0" * 1024)
    stale_ranks = temp / "precision-lab-ranks-xyz"
    stale_ranks.mkdir()
    (stale_ranks / "rank-0.json").write_text("{}")
    two_hours_ago = time.time() - 7200
    for path in (stale, stale_ranks):
        os.utime(path, (two_hours_ago, two_hours_ago))
    fresh_of_another_session = temp / "precision-lab-upload-now.json"
    fresh_of_another_session.write_text("{}")

    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/kernels.py").run()
    at.radio(key="kernels_source").set_value("Upload a trace file").run()
    data = (TRACES / "gp100_pascal_hta.json.gz").read_bytes()
    at.file_uploader(key="trace_upload").set_value(("pascal.json.gz", data,
                                                    "application/gzip")).run()
    assert not at.exception, at.exception
    assert any("Tensor Cores" in e.value for e in at.error)  # the report drew ("no": red)
    assert _leftovers(temp) == [fresh_of_another_session.name]


def test_a_trace_dropped_on_a_full_disk_is_said_on_live_and_kernels(home):
    store = Store(home)
    run_id = _ended_run(store, "full disk")
    reason = "the trace could not be written: the data directory's disk is full"
    store.merge_summary(run_id, {"profile_error": reason})
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    for page in ("pages/live.py", "pages/kernels.py"):
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception)
        shown = " ".join(e.value for e in at.error).replace("\\", "")
        assert reason in shown, (page, shown)
