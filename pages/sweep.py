"""Sweep: a grid of runs (models x precisions x batch sizes) on this machine's device
queue or on a Ray cluster; each run's status live, stop, and the results matrix."""

from __future__ import annotations

import html
import math

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.cluster.ray_env import (
    MAX_CPUS_PER_RUN,
    MAX_GPUS_PER_RUN,
    RAY_ADDRESS_ENV,
    RAY_ANY_ADDRESS_ENV,
    RayOptions,
    default_ray_address,
    page_may_choose_address,
    ray_problem,
)
from engine.cluster.sweep import (
    MATRIX_METRICS,
    MAX_SWEEP_RUNS,
    UNCLAIMED_RATIOS,
    SweepGrid,
    cell_hover,
    cell_label,
    counts_text,
    create_sweep,
    parse_batch_sizes,
    ratio_claim,
    results_matrix,
    stop_sweep,
    sweep_view,
)
from engine.config import ConfigError, ModelName, ModelSize, Precision, bounds, choices
from engine.display import NA
from engine.run.launcher import reconcile, stop
from engine.schema import SWEEP_RUNNING
from pages.plot_view import draw_chart
from pages.ui import (
    ensure_app_shell,
    fmt_age,
    get_store,
    id_in_address,
    open_in_live,
    plain,
    status_badge,
)

ensure_app_shell()  # before drawing anything: see pages/ui.py

REFRESH_S = 2.0
SELECTED_KEY = "sweep_selected"
LOCAL, RAY = "This machine (device queue, one run at a time)", "Ray cluster"

store = get_store()
reconcile(store)  # a dead worker or sweep driver shows as failed here

st.title("Sweeps")


# ---------------------------------------------------------------------------------------
# new sweep


def grid_form() -> None:
    st.subheader("New sweep")
    left, middle, right = st.columns(3)
    models = left.multiselect("Models", choices(ModelName), default=["mlp"], key="sw_models")
    precisions = middle.multiselect("Precisions", choices(Precision), default=["fp32", "bf16-amp"],
                                    key="sw_precisions")
    batch_text = right.text_input("Batch sizes", value="8, 16", key="sw_batch_sizes",
                                  help="Any whole numbers, comma-separated, e.g. 8, 16, 48")
    try:
        batch_sizes = list(parse_batch_sizes(batch_text))
    except ConfigError as exc:
        right.error(f"Batch sizes: {plain(repr(exc.value))}: {plain(exc.fix)}")
        batch_sizes = []
    left, middle, right = st.columns(3)
    size = left.selectbox("Model size", choices(ModelSize), key="sw_size")
    steps = middle.number_input("Steps per run", *bounds("steps"), value=30,
                                key="sw_steps")
    profile = right.checkbox("Profile a few steps per run (kernel breakdown)", value=True,
                             key="sw_profile")
    where = st.radio("Where", [LOCAL, RAY], index=1 if default_ray_address() else 0,
                     key="sw_where", horizontal=True)
    address, options, ray_ok = "", None, True
    if where == RAY:
        address, options, ray_ok = ray_settings()
    count = len(models) * len(precisions) * len(batch_sizes)
    too_many = count > MAX_SWEEP_RUNS
    st.markdown(
        f"This sweep will create **{count} run{'s' if count != 1 else ''}** "
        f"({len(models)} x {len(precisions)} x "
        f"{len(batch_sizes)}: models x precisions x batch sizes)."
    )
    if too_many:
        st.error(f"{count} runs is more than the {MAX_SWEEP_RUNS} one sweep may create: "
                 "drop some models, precisions or batch sizes, or split the grid.")
    if not st.button("Create sweep", type="primary", key="sw_create",
                     disabled=too_many or count == 0 or not ray_ok):
        return
    try:
        grid = SweepGrid(models=tuple(models), precisions=tuple(precisions),
                         batch_sizes=tuple(batch_sizes), size=size, steps=int(steps),
                         profile=profile)
        sweep_id = create_sweep(grid, store, ray_address=address, ray_options=options)
    except ConfigError as exc:
        st.error(
            f"Cannot create the sweep: {plain(exc.field)} = {plain(repr(exc.value))}: "
            f"{plain(exc.fix)}"
        )
        return
    st.session_state[SELECTED_KEY] = sweep_id
    st.session_state["sw_select"] = sweep_id  # show the new sweep below (drawn after this)
    st.success(f"Sweep {sweep_id} created with {count} run{'s' if count != 1 else ''}.")


def ray_settings() -> tuple[str, RayOptions | None, bool]:
    """The Ray address and resources. The server connects to the address only when asked
    (the check button), and only to the operator's $PRECISION_LAB_RAY_ADDRESS unless
    $PRECISION_LAB_RAY_ALLOW_ANY_ADDRESS lets viewers type one."""
    left, middle, right = st.columns(3)
    configured = default_ray_address()
    if page_may_choose_address():
        address = left.text_input("Ray address (HOST:PORT of the head, or auto)",
                                  value=configured, key="sw_ray_address",
                                  help=f"Default from ${RAY_ADDRESS_ENV}. This machine must be a "
                                       "node of the cluster (README: Sweeps).").strip()
    else:
        address = configured
        left.text_input("Ray address (set by the operator)", value=configured or "not set",
                        disabled=True, key="sw_ray_address_fixed",
                        help=f"Set with ${RAY_ADDRESS_ENV} where the app is started; "
                             f"${RAY_ANY_ADDRESS_ENV}=1 lets this page take any address.")
    gpus = middle.number_input("GPUs per run", min_value=0, max_value=MAX_GPUS_PER_RUN, value=1,
                               key="sw_gpus",
                               help="On a CPU-only cluster runs are scheduled by CPUs instead.")
    cpus = right.number_input("CPUs per run", min_value=1, max_value=MAX_CPUS_PER_RUN, value=1,
                              key="sw_cpus")
    if not address:
        st.warning(f"No Ray cluster is configured for this app: start it with {RAY_ADDRESS_ENV}="
                   "HOST:PORT, or run the sweep on this machine.")
        return address, None, False
    checked = st.session_state.get("sw_ray_checked")
    if st.button("Check the Ray cluster", key="sw_ray_check",
                 help="Connects to the address once and checks that a Ray head answers"):
        checked = {"address": address, "problem": ray_problem(address)}
        st.session_state["sw_ray_checked"] = checked
    if not checked or checked["address"] != address:
        st.info("Check the Ray cluster before creating the sweep.")
        return address, None, False
    if checked["problem"]:
        st.error(f"The Ray cluster cannot be used: {plain(checked['problem'])}. Sweeps on this "
                 "machine still work.")
        return address, None, False
    st.caption(f"Ray cluster at {plain(address)} answered; each run becomes one Ray task.")
    return address, RayOptions(gpus_per_run=int(gpus), cpus_per_run=int(cpus)), True


# ---------------------------------------------------------------------------------------
# one sweep: runs, actions, results


def runs_table(view) -> pd.DataFrame:
    return pd.DataFrame([{
        "run_id": r.id, "model": f"{r.config.model}-{r.config.size}",
        "precision": r.config.precision, "batch": r.config.batch_size,
        "status": status_badge(r.status), "steps": f"{r.steps_completed}/{r.total_steps}",
        "device": r.device_key, "device_name": r.device_name or "",
        "reason": r.reason or "",
    } for r in view.runs])


# Unclaimed ratios (busy, inconclusive) are drawn in this one neutral grey, never by value:
# darker than the colour scale's white 1x, so "no claim" does not read as "no change".
UNCLAIMED_GREY = "#a3a3a3"
# Both traces answer hover from customdata only, so whichever one plotly picks for a cell
# the label is the same.
RATIO_HOVER = ("%{y} · %{x}<br>%{customdata[0]}<br>%{customdata[1]}<br>%{customdata[2]}"
               "<extra></extra>")
VALUE_HOVER = "%{y} · %{x}<br>%{customdata[0]}<br>%{customdata[2]}<extra></extra>"


def heatmap(model: str, matrix: dict) -> go.Figure:
    """One model's results matrix. A ratio is coloured by log2 around 1x; the ratios that
    claim nothing (busy, inconclusive) sit in a grey trace on top, with their word."""
    frame = matrix["values"][model]
    rows, columns = list(frame.index), list(frame.columns)
    unit = matrix["unit"]
    throughput_x = matrix["metric"] == "throughput_x"
    text = [[cell_label(matrix, model, p, b) for b in columns] for p in rows]
    grey = [[ratio_claim(matrix, model, p, b) in UNCLAIMED_RATIOS for b in columns] for p in rows]
    shared = dict(
        x=[f"bs {b}" for b in columns], y=rows, texttemplate="%{text}",
        # plotly renders a subset of HTML in hover text: the stored strings are escaped
        customdata=[[[html.escape(str(part)) for part in cell_hover(matrix, model, p, b)]
                     for b in columns] for p in rows],
        hovertemplate=RATIO_HOVER if throughput_x else VALUE_HOVER)
    if throughput_x:
        z = [[_log2(v) if not g else None for v, g in zip(values, flags)]
             for values, flags in zip(frame.values.tolist(), grey)]
        scale = ratio_scale(z)
    else:
        z = frame.astype(object).where(frame.notna(), None).values.tolist()
        scale = dict(colorscale="Viridis", colorbar=dict(title=unit or matrix["label"]))
    fig = go.Figure(go.Heatmap(z=z, text=text, **scale, **shared))
    if any(any(flags) for flags in grey):
        fig.add_trace(
            go.Heatmap(
                z=[[0 if g else None for g in flags] for flags in grey],
                text=[
                    [t if g else "" for t, g in zip(texts, flags)]
                    for texts, flags in zip(text, grey)
                ],
                colorscale=[[0, UNCLAIMED_GREY], [1, UNCLAIMED_GREY]],
                showscale=False,
                hoverongaps=False,
                **shared,
            )
        )  # its gaps are the coloured trace's cells
    title = f"{model}: {matrix['label']}" + (f" ({unit})" if unit else "")
    if throughput_x:
        title += f", baseline {matrix['baseline']}"
    fig.update_layout(title=title, xaxis_title="batch size", yaxis_title="precision",
                      yaxis_autorange="reversed", margin=dict(l=10, r=10, t=40, b=10),
                      hovermode="closest", height=120 + 45 * len(frame.index))
    return fig


def _log2(value) -> float | None:
    return math.log2(value) if isinstance(value, float) and math.isfinite(value) and value > 0 \
        else None


def ratio_scale(z: list[list[float | None]]) -> dict:
    """A diverging scale for log2 ratios, white at 1x, symmetric so that 2x and 0.5x are
    equally strong, at least 0.5x-2x wide (a 1.02x must not look like a 16x); ticks at
    powers of two, written as ratios."""
    reach = max([1.0] + [abs(v) for row in z for v in row if v is not None])
    step = max(1, math.ceil(math.floor(reach) / 4))  # at most 9 ticks
    ticks = list(range(-(math.floor(reach) // step) * step, math.floor(reach) + 1, step))
    return dict(colorscale="RdBu", zmid=0.0, zmin=-reach, zmax=reach,
                colorbar=dict(title="x (log scale)", tickvals=ticks,
                              ticktext=[f"{2.0 ** k:g}x" for k in ticks]))


def sweep_panel(sweep_id: str, status_at_load: str, metric: str) -> None:
    view = sweep_view(store, sweep_id)
    sweep = view.sweep
    where = f"Ray cluster at {sweep.ray_address}" if sweep.backend == "ray" else "this machine"
    st.markdown(f"**{view.status}** on {where} · {len(view.runs)} runs: {counts_text(view.counts)}")
    if sweep.reason:
        st.error(f"Sweep failed: {plain(sweep.reason)}")
    st.dataframe(runs_table(view), key="sweep_runs", hide_index=True, placeholder=NA)
    matrix = results_matrix(view, metric)
    for model in view.grid.models:
        draw_chart(figure=heatmap(model, matrix), key=f"heatmap_{model}")
    if view.status != status_at_load:
        st.rerun()  # running -> done: redraw once, without the refresh timer


def sweep_actions(view) -> None:
    labels = {r.id: f"{r.config.label} · {r.id}" for r in view.runs}
    left, middle, right = st.columns([3, 1, 1])
    run_id = left.selectbox("Run", list(labels), format_func=labels.get, key="sw_run")
    if middle.button("Open in Live", key="sw_open_live"):
        open_in_live(run_id)
    if right.button("Stop run", key="sw_stop_run", disabled=not store.get_run(run_id).is_active):
        with st.spinner("Stopping..."):
            stop(run_id, store)
        st.rerun()
    if view.status == SWEEP_RUNNING and st.button("Stop sweep", key="sw_stop_sweep"):
        with st.spinner("Stopping every queued and running run of the sweep..."):
            stop_sweep(view.sweep.id, store)
        st.rerun()


def sweeps_section() -> None:
    st.subheader("Sweeps")
    sweeps = store.list_sweeps()
    if not sweeps:
        st.info("No sweeps yet. Define a grid above to start one.")
        return
    ids = [s.id for s in sweeps]
    first_visit = "sw_select" not in st.session_state
    url_sweep = id_in_address("sweep", "sweep", warn=first_visit)
    if url_sweep and url_sweep not in ids and first_visit:
        st.warning("The sweep in this page's address does not exist here; showing the newest "
                   "sweep instead.")
        st.code(url_sweep, language=None)  # as text: it comes from the URL
    wanted = url_sweep if first_visit and url_sweep in ids else st.session_state.get(SELECTED_KEY)
    labels = {s.id: f"{s.id} · {s.backend} · {len(s.run_ids)} runs · {fmt_age(s.created_at)}"
              for s in sweeps}
    sweep_id = st.selectbox("Sweep", ids, index=ids.index(wanted) if wanted in ids else 0,
                            format_func=labels.get, key="sw_select")
    st.session_state[SELECTED_KEY] = sweep_id
    st.query_params["sweep"] = sweep_id  # shareable URL for this sweep
    view = sweep_view(store, sweep_id)
    sweep_actions(view)
    metric = st.selectbox("Results matrix", list(MATRIX_METRICS), key="sw_metric",
                          format_func=lambda m: MATRIX_METRICS[m][0]
                          + (f" ({MATRIX_METRICS[m][1]})" if MATRIX_METRICS[m][1] else ""))
    active = view.status == SWEEP_RUNNING
    st.fragment(run_every=REFRESH_S if active else None)(sweep_panel)(sweep_id, view.status, metric)


grid_form()
sweeps_section()
