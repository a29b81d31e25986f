"""The Live panel's timer and its whole-page reruns, on runs of a real store.

AppTest runs the whole script on each run() and never fires a fragment's timer alone,
so the decisions the timer's runs take are tested here as functions; the browser
benchmark (bench.first_point_browser) times what they do in Chromium.
"""

from __future__ import annotations

import pytest

from engine.config import RunConfig
from engine.store import Store
from pages.live_refresh import (
    FIRST_ROW_REFRESH_S,
    FIRST_ROW_WINDOW_S,
    REFRESH_S,
    refresh_interval_s,
    rerun_after_drawing,
    rerun_before_drawing,
)

pytestmark = pytest.mark.fast


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "lab")


def _new_run(store):
    run_id = store.create_run(RunConfig(model="mlp", size="tiny", steps=10), "cpu")
    return store.get_run(run_id)


def test_a_just_launched_run_is_polled_fast_until_its_first_step(store):
    run = _new_run(store)
    assert run.steps_completed == 0 and run.is_active
    assert refresh_interval_s(run, now_s=run.created_at + 1.0) == FIRST_ROW_REFRESH_S
    # A run that has waited past the window (a long queue) is polled at the usual rate.
    late_s = run.created_at + FIRST_ROW_WINDOW_S + 1.0
    assert refresh_interval_s(run, now_s=late_s) == REFRESH_S


def test_an_ended_run_is_not_polled(store):
    run = _new_run(store)
    store.set_status(run.id, "failed", reason="test")
    assert refresh_interval_s(store.get_run(run.id), now_s=run.created_at + 1.0) is None


def test_the_fast_timer_seeing_the_first_step_reruns_the_page_before_drawing():
    assert rerun_before_drawing(FIRST_ROW_REFRESH_S, REFRESH_S)
    assert rerun_before_drawing(FIRST_ROW_REFRESH_S, None)  # ended before its first step
    # Still waiting, or on the usual timer: the panel draws.
    assert not rerun_before_drawing(FIRST_ROW_REFRESH_S, FIRST_ROW_REFRESH_S)
    assert not rerun_before_drawing(REFRESH_S, REFRESH_S)
    assert not rerun_before_drawing(REFRESH_S, None)  # handled after drawing, below


def test_a_status_change_reruns_the_page_once_after_drawing():
    assert rerun_after_drawing(REFRESH_S, None, "running", "completed")  # timer off
    assert rerun_after_drawing(REFRESH_S, REFRESH_S, "queued", "running")  # new labels
    assert not rerun_after_drawing(REFRESH_S, REFRESH_S, "running", "running")
    # queued -> running while the first step is awaited: the first step's rerun covers it.
    assert not rerun_after_drawing(FIRST_ROW_REFRESH_S, FIRST_ROW_REFRESH_S,
                                   "queued", "running")
