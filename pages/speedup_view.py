"""A paired speedup check drawn: progress, the busy-machine verdict, the forest plot, the
per-mode table and the findings. Shared by Live (while it runs: intervals narrowing) and
Compare; the HTML report draws the same stored result with the same figure."""

from __future__ import annotations

import streamlit as st

from engine.analysis.speedup import dropped_words, method_words, setup_words
from engine.analysis.summary_text import speedup_rows
from engine.display import NA
from engine.report.figures import memory_by_kind_figure, speedup_forest_figure
from pages.plot_view import draw_chart
from pages.ui import plain


def draw_speedup(result: dict, key: str, active: bool = False) -> None:
    """One check's result (the run summary's "speedup"); `key` keeps chart ids unique."""
    if not result:
        st.info("Waiting for the first round (every mode warms up and is calibrated first)...")
        return
    setup = setup_words(result)
    if setup:  # building, warming up, calibrating: the check at work, not stalled
        budget = result.get("budget_s") or 1.0
        st.progress(min(1.0, (result.get("elapsed_s") or 0.0) / budget), text=setup)
        for reason in dropped_words(result):
            st.warning(plain(reason))
        return
    contention = result.get("contention") or {}
    busy = bool(contention.get("busy"))
    if active or result.get("running"):
        budget = result.get("budget_s") or 1.0
        done = min(1.0, (result.get("elapsed_s") or 0.0) / budget)
        width = result.get("widest_half_width_pct")
        text = (f"round {result.get('rounds')} · {result.get('elapsed_s', 0):.0f} / {budget:.0f} s"
                + (f" · widest interval ±{width:.1f} % (stops at ±{result.get('target_pct'):g} %)"
                   if width is not None else " · intervals after 5 rounds"))
        st.progress(done, text=text)
    if busy:
        st.warning(plain(contention["words"]))
    elif contention.get("words"):
        st.caption(plain(contention["words"]))
    draw_chart(figure=speedup_forest_figure(result), key=f"{key}_forest")
    memory = memory_by_kind_figure(result)
    if memory is not None:
        draw_chart(figure=memory, key=f"{key}_memory")
    st.dataframe(speedup_rows(result), hide_index=True, width="stretch", placeholder=NA)
    st.caption(method_words(result))
    for finding in result.get("findings") or []:
        st.markdown(f"- {plain(finding)}")
