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
