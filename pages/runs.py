"""Runs: every run in the store; search and filter, open one in Live, re-launch its config,
tag it, write a note, archive or delete it."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import streamlit as st

from engine.analysis.runs import (
    RunFilter,
    filter_runs,
    grid_row,
    parse_tag_filter,
    parse_tags_text,
    run_row,
    tags_text,
)
from engine.config import ConfigError, ModelName, Precision, choices
from engine.display import (
    LOSS_PRINTF,
    NA,
    PROCESS_PEAK_NAME,
    TENSOR_PEAK_NAME,
    THROUGHPUT_PRINTF,
    memory_printf,
    memory_unit,
    memory_value,
)
from engine.run.launcher import reconcile
from engine.schema import STATUSES
from engine.store import RunActive, RunNotFound
from pages.ui import ensure_app_shell, get_store, open_in_live, plain, relaunch, status_badge

ensure_app_shell()  # before drawing anything: see pages/ui.py

store = get_store()
reconcile(store)
runs = store.list_runs(limit=5000)

st.title("Runs")
if not runs:
    st.info("No runs yet. Start one on the Launch page.")
    st.page_link("pages/launch.py", label="Launch a run", icon=":material/rocket_launch:")
    st.stop()

# -- filters ---------------------------------------------------------------------------
top_left, top_right = st.columns([3, 2])
search = top_left.text_input("Search", key="runs_search", placeholder="run id, label, note, tag",
                             help="Case-insensitive, in the run id, label, note and tags")
tag_text = top_right.text_input("Tags", key="runs_tags", placeholder="team=infra, baseline",
                                help="key=value, or a bare key for any value; comma-separated")
cols = st.columns(5)
status_filter = cols[0].multiselect("Status", STATUSES, key="runs_status", placeholder="any")
precision_filter = cols[1].multiselect("Precision", choices(Precision), key="runs_precision",
                                       placeholder="any")
model_filter = cols[2].multiselect("Model", choices(ModelName), key="runs_model",
                                   placeholder="any")
since = cols[3].date_input("Created from", value=None, key="runs_since")
until = cols[4].date_input("Created until", value=None, key="runs_until")
show_archived = st.toggle("Show archived", key="runs_archived",
                          help="Archived runs are hidden from this list unless this is on")
try:
    tag_filter = parse_tag_filter(tag_text)
except ConfigError as exc:
    st.error(f"Tags filter {plain(repr(exc.value))}: {plain(exc.fix)}")
    tag_filter = {"": None}  # matches nothing: a wrong filter must not look like "all runs"
flt = RunFilter(text=search, tags=tag_filter, models=tuple(model_filter),
                precisions=tuple(precision_filter), statuses=tuple(status_filter),
                since=since if isinstance(since, dt.date) else None,
                until=until if isinstance(until, dt.date) else None, archived=show_archived)
shown = filter_runs(runs, flt)
if flt.since and flt.until and flt.since > flt.until:
    st.warning("'Created from' is after 'Created until': no run can match.")
archived_count = sum(1 for r in runs if r.archived)
st.caption(
    f"{len(shown)} of {len(runs)} runs"
    + (f" ({archived_count} archived, hidden)" if archived_count and not show_archived else "")
    + ". Select rows to act on them."
)

# -- the table -------------------------------------------------------------------------
# grid_row: the grid's own "Download as CSV" must not carry a note "=1+2" as a formula.
rows = [grid_row(r) for r in shown]
table = pd.DataFrame(rows, columns=list(run_row(runs[0]).keys()))
if len(table):
    table["status"] = [status_badge(s) for s in table["status"]]
    table["archived"] = ["archived" if a else "" for a in table["archived"]]
# The two peaks by name (engine.analysis.memory_peaks), each column in one unit (MiB, or
# GiB once a run reaches 1 GiB) named in its header: a tensor peak of a few MiB beside a
# process peak over 1 GiB keeps its digits.
memory_units = {name: memory_unit(table[f"{name}_bytes"])
                for name in ("tensor_peak", "process_peak")}
for name, unit in memory_units.items():
    table[name] = [memory_value(v, unit) for v in table[f"{name}_bytes"]]
for column in ("duration_s", "throughput", "tensor_peak", "process_peak", "final_loss",
               "mfu_pct"):
    table[column] = pd.to_numeric(table[column], errors="coerce")  # NaN: the grid's "n/a"
# What a person scans at 1280 px; the label carries model, precision and batch size.
MAIN_COLUMNS = ["label", "status", "steps", "throughput", "unit", "tensor_peak", "final_loss",
                "mfu", "created"]
MORE_COLUMNS = ["run_id", "device", "model", "precision", "batch_size", "duration_s",
                "process_peak", "tags", "note", "reason"]
with st.expander("More columns"):
    more = st.multiselect("Also show", MORE_COLUMNS, key="runs_more_columns",
                          help="Columns beyond the ones that fit a laptop screen")
shown_columns = MAIN_COLUMNS + more + (["archived"] if show_archived else [])
# The grid reports its selection as row positions, in the rows the browser drew. Another
# tab or the CLI adding or deleting a run moves the rows under those positions, so the
# positions are read against the run ids of the drawing the user saw (kept per table key),
# and once the rows have moved the table starts afresh with the selection carried by id:
# an action only ever reaches a run the user picked.
TABLE_VERSION_KEY = "runs_table_version"
DRAWN_IDS_KEY = "runs_table_drawn_ids"  # (table key, run ids in row order) of the last draw
CARRIED_KEY = "runs_selection_carried"  # (table key, run ids) kept across a fresh table


def table_key() -> str:
    return f"runs_table_{st.session_state.get(TABLE_VERSION_KEY, 0)}"


def changed_rows() -> None:
    st.session_state[TABLE_VERSION_KEY] = st.session_state.get(TABLE_VERSION_KEY, 0) + 1
    st.session_state.pop(CARRIED_KEY, None)
    st.rerun()


event = st.dataframe(
    table, key=table_key(), column_order=shown_columns,
    hide_index=True, on_select="rerun",
    selection_mode="multi-row",
    column_config={
        "created": st.column_config.DatetimeColumn("created", format="MM-DD HH:mm",
                                                   help="Local time; the year and seconds "
                                                        "are in the run's details"),
        "run_id": st.column_config.TextColumn("run id"),
        "duration_s": st.column_config.NumberColumn("duration (s)", format="%.1f"),
        "label": st.column_config.TextColumn("label", help="The run's label (full text on "
                                                          "hover)"),
        "throughput": st.column_config.NumberColumn(
            "throughput", format=THROUGHPUT_PRINTF,
            help="Median over steady-state steps: the same figure as on Live, Compare, the "
                 "report and the CLI"),
        "tensor_peak": st.column_config.NumberColumn(
            f"{TENSOR_PEAK_NAME} ({memory_units['tensor_peak']})",
            format=memory_printf(memory_units["tensor_peak"]),
            help="Bytes held by tensors at the step's peak (a CPU run: its last warm-up "
                 "step, profiled)"),
        "process_peak": st.column_config.NumberColumn(
            f"{PROCESS_PEAK_NAME} ({memory_units['process_peak']})",
            format=memory_printf(memory_units["process_peak"]),
            help="CPU: the process's peak resident set; GPU: the allocator's peak reserved "
                 "memory"),
        "final_loss": st.column_config.NumberColumn("final loss", format=LOSS_PRINTF),
        "mfu_pct": st.column_config.NumberColumn("MFU %", format="%.1f"),
        "mfu": st.column_config.TextColumn("MFU"),
        "tags": st.column_config.TextColumn("tags", width="medium"),
        "note": st.column_config.TextColumn("note", width="medium"),
        "reason": st.column_config.TextColumn("reason", width="medium"),
    }, placeholder=NA)
key_now = table_key()
row_ids = [str(run_id) for run_id in table["run_id"]]
positions = list(event.selection.rows) if event else []
drawn_key, drawn_ids = st.session_state.get(DRAWN_IDS_KEY) or (None, None)
seen_ids = drawn_ids if drawn_key == key_now else row_ids
selected_ids = [seen_ids[i] for i in positions if 0 <= i < len(seen_ids)]
st.session_state[DRAWN_IDS_KEY] = (key_now, row_ids)
if positions and seen_ids != row_ids:
    # The rows moved under the selection: the browser would now mark other runs.
    st.session_state[TABLE_VERSION_KEY] = st.session_state.get(TABLE_VERSION_KEY, 0) + 1
    st.session_state[CARRIED_KEY] = (table_key(), selected_ids)
    st.rerun()
carried_key, carried_ids = st.session_state.get(CARRIED_KEY) or (None, [])
if positions or carried_key != key_now:
    st.session_state.pop(CARRIED_KEY, None)  # a selection made in this table replaces it
elif carried_ids:
    selected_ids = carried_ids
    st.caption("The run list changed while runs were selected (a run was added or deleted "
               "elsewhere); the selection is kept by run id: " + ", ".join(carried_ids))
selected = []
for run_id in selected_ids:
    try:
        selected.append(store.get_run(run_id))
    except RunNotFound:
        st.info(f"Run {run_id} is no longer in the store (deleted elsewhere).")
if not selected:
    st.stop()

# -- actions on the selection ----------------------------------------------------------
st.subheader(f"{len(selected)} selected" if len(selected) > 1 else f"Run {selected[0].id}")
one = selected[0] if len(selected) == 1 else None
action_cols = st.columns(4)
if one is not None:
    if action_cols[0].button("Open in Live", type="primary", key="open_live"):
        open_in_live(one.id)
    if action_cols[1].button("Re-launch with this config", key="relaunch",
                             help="Opens Launch with this run's settings filled in"):
        relaunch(one)
if one is None and action_cols[0].button("Compare these", type="primary", key="compare_selected",
                                         help="Opens Compare with the selected runs"):
    st.session_state["compare_runs"] = [r.id for r in selected]
    st.session_state["compare_seen_preset"] = tuple(st.session_state.get("preset_run_ids") or ())
    st.switch_page("pages/compare.py")
any_archived = any(r.archived for r in selected)
if action_cols[2].button("Unarchive" if any_archived else "Archive", key="archive",
                         help="Archived runs are hidden unless 'Show archived' is on; nothing is "
                              "deleted"):
    for run in selected:
        store.set_archived(run.id, not any_archived)
    changed_rows()

with action_cols[3].popover("Delete", help="Removes the runs' rows and files for good"):
    active = [r for r in selected if r.is_active]
    ended = [r for r in selected if not r.is_active]
    if active:
        st.warning(f"{len(active)} of these runs are queued or running: stop them first "
                   "(Live page); they are not deleted.")
    if ended:
        st.write(f"Delete {len(ended)} ended run(s), their metrics, logs and traces? This "
                 "cannot be undone.")
        st.text(", ".join(r.id for r in ended))  # by id: exactly the runs that go
        confirm = st.checkbox("Yes, delete them", key="delete_confirm")
        if st.button("Delete", type="primary", disabled=not confirm, key="delete_runs"):
            deleted, refused = [], []
            for run in ended:
                try:
                    store.delete_run(run.id)
                    deleted.append(run.id)
                except (RunActive, RunNotFound) as exc:
                    refused.append(str(exc))
            st.session_state.pop("delete_confirm", None)
            for message in refused:
                st.error(message)
            if deleted:
                st.toast(f"Deleted {len(deleted)} run(s)")
                changed_rows()

if one is not None:
    with st.form(f"annotate_{one.id}"):
        st.caption("Tags and note")
        tags_in = st.text_input("Tags", value=tags_text(one.tags), key=f"tags_{one.id}",
                                help="key=value pairs, comma-separated, e.g. team=infra, goal=bf16")
        note_in = st.text_area("Note", value=one.note, key=f"note_{one.id}", max_chars=4000)
        if st.form_submit_button("Save tags and note"):
            try:
                store.set_tags(one.id, parse_tags_text(tags_in))
                store.set_note(one.id, note_in)
            except ConfigError as exc:
                st.error(
                    f"Not saved: {plain(exc.field)} {plain(repr(exc.value))}: {plain(exc.fix)}"
                )
            else:
                st.toast("Saved")
                changed_rows()
