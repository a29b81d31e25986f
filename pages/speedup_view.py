"""A paired speedup check drawn: progress, the busy-machine verdict, the forest plot, the
per-mode table and the findings. Shared by Live (while it runs: intervals narrowing) and
Compare; the HTML report draws the same stored result with the same figure."""

from __future__ import annotations

import streamlit as st

from engine.analysis.drift import drift_cell
from engine.analysis.speedup import method_words, stored_verdict
from engine.report.figures import memory_by_kind_figure, speedup_forest_figure
from pages.ui import fmt_bytes, fmt_num, plain


def _row_cells(row: dict, result: dict) -> dict:
    baseline = result.get("baseline")
    interval = (f"{row['ci_low']:.3f}-{row['ci_high']:.3f}" if row.get("ci_low") is not None
                and row["mode"] != baseline else "")
    _verdict, verdict = stored_verdict(row, result)  # one rule: busy -> inconclusive
    return {"mode": row["mode"], "median step (ms)": fmt_num(row.get("median_step_ms"), 4),
            "throughput (samples/s)": fmt_num(row.get("samples_per_s"), 5),
            "speedup": fmt_num(row.get("speedup"), 3), "95 % interval": interval,
            "peak memory": fmt_bytes(row.get("peak_mem_bytes")),
            "loss vs baseline": "" if row["mode"] == baseline else drift_cell(row.get("drift"), "drift" in row),
            "blocks": row.get("blocks"), "verdict": verdict}


def draw_speedup(result: dict, key: str, active: bool = False) -> None:
    """One check's result (the run summary's "speedup"); `key` keeps chart ids unique."""
    if not result:
        st.info("Waiting for the first round (every mode warms up and is calibrated first)...")
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
    st.plotly_chart(theme=None, figure_or_data=speedup_forest_figure(result), key=f"{key}_forest")
    memory = memory_by_kind_figure(result)
    if memory is not None:
        st.plotly_chart(theme=None, figure_or_data=memory, key=f"{key}_memory")
    baseline = result.get("baseline")
    st.dataframe([_row_cells(row, result) for row in result.get("modes", [])],
                 hide_index=True, width="stretch")
    st.caption(method_words(result))
    for finding in result.get("findings") or []:
        st.markdown(f"- {plain(finding)}")
