"""When the Live page's panel redraws, and when the whole page does (no Streamlit here).

The panel is a fragment on a timer (`run_every`). Its interval is fixed when the page
is drawn, so changing it (the first step arrived, the run ended) takes a whole-page
rerun; so does a status change, whose labels and buttons sit outside the panel.
"""

from __future__ import annotations

import time

REFRESH_S = 1.0  # while a run is active
FIRST_ROW_REFRESH_S = 0.25  # while a just-launched run has logged no step yet
FIRST_ROW_WINDOW_S = 30.0  # ... for at most this long after it was created


def refresh_interval_s(run, now_s: float | None = None) -> float | None:
    """How often the panel redraws: every second, not at all once the run has ended, and
    4x a second while a run launched moments ago waits for its first logged step, so
    that step is on screen as soon as it is stored instead of up to a second later."""
    if not run.is_active:
        return None
    now_s = time.time() if now_s is None else now_s
    if run.steps_completed == 0 and now_s - run.created_at < FIRST_ROW_WINDOW_S:
        return FIRST_ROW_REFRESH_S
    return REFRESH_S


def rerun_before_drawing(refresh_at_load: float | None, interval_s: float | None) -> bool:
    """The fast timer's panel has seen the first step (or the run's end): redraw the whole
    page at once, before this panel draws anything. Drawing the charts first and
    rerunning after would mount them twice, and the second mount cancels the first
    drawing: the first point showed ~0.2-0.3 s later that way (bench.first_point_browser)."""
    return refresh_at_load == FIRST_ROW_REFRESH_S and interval_s != FIRST_ROW_REFRESH_S


def rerun_after_drawing(refresh_at_load: float | None, interval_s: float | None,
                        status_at_load: str, status: str) -> bool:
    """queued -> running -> ended: redraw the whole page once (labels, stop button), and
    without the timer once the run has ended. While the first step is awaited,
    queued -> running waits for the rerun the first step brings (rerun_before_drawing):
    one whole-page redraw instead of two."""
    if interval_s != refresh_at_load:
        return True
    return status != status_at_load and interval_s != FIRST_ROW_REFRESH_S
