"""Runs: every run in the store, filterable; open one in Live."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from engine.config import Precision, choices
from engine.run.launcher import reconcile
from engine.schema import STATUSES, throughput_column, throughput_unit
from pages.ui import ensure_app_shell, get_store, open_in_live, status_badge

ensure_app_shell()  # before drawing anything: see pages/ui.py

store = get_store()
reconcile(store)
runs = store.list_runs(limit=5000)

st.title("Runs")
if not runs:
    st.info("No runs yet. Start one on the Launch page.")
    st.page_link("pages/launch.py", label="Launch a run", icon="🚀")
    st.stop()


def _finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def runs_table(records) -> pd.DataFrame:
    rows = []
    for r in records:
        s = r.summary
        rate = s.get(throughput_column(r.config.model))
        rows.append({
            "run_id": r.id, "status": status_badge(r.status), "model": f"{r.config.model}-{r.config.size}",
            "precision": r.config.precision, "batch": r.config.batch_size,
            "steps": f"{r.steps_completed}/{r.total_steps}",
            "throughput": _finite(rate),
            "unit": throughput_unit(r.config.model),
            "peak_mem_GiB": (s["peak_mem_bytes"] / 2**30) if s.get("peak_mem_bytes") else None,
            "final_loss": _finite(s.get("final_loss")),
            "MFU_%": 100 * s["mfu"] if s.get("mfu") else None,
            "device": r.device_key, "label": r.config.name,
            "reason": r.reason or "",
        })
    table = pd.DataFrame(rows)
    # NaN, not None, so empty numeric cells render blank rather than as "None".
    for column in ("throughput", "peak_mem_GiB", "final_loss", "MFU_%"):
        table[column] = pd.to_numeric(table[column], errors="coerce")
    return table


left, right = st.columns(2)
status_filter = left.multiselect("Status", STATUSES, key="runs_status")
precision_filter = right.multiselect("Precision", choices(Precision), key="runs_precision")
shown = [r for r in runs
         if (not status_filter or r.status in status_filter)
         and (not precision_filter or r.config.precision in precision_filter)]
st.caption(f"{len(shown)} of {len(runs)} runs. Select a row to open it in Live.")

table = runs_table(shown)
event = st.dataframe(
    table, key="runs_table", hide_index=True, on_select="rerun", selection_mode="single-row",
    column_config={
        "throughput": st.column_config.NumberColumn(format="%.1f"),
        "peak_mem_GiB": st.column_config.NumberColumn("peak mem (GiB)", format="%.3f"),
        "final_loss": st.column_config.NumberColumn(format="%.4f"),
        "MFU_%": st.column_config.NumberColumn("MFU (%)", format="%.1f"),
    })
selected_rows = event.selection.rows if event else []
if selected_rows:
    run_id = table.iloc[selected_rows[0]]["run_id"]
    if st.button(f"Open {run_id} in Live", type="primary", key="open_live"):
        open_in_live(run_id)
