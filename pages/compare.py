"""Compare: overlaid charts, a summary table against a baseline, the config diff,
plain-language findings, an HTML report and, where recorded, the numerics view.

Everything numeric comes from engine.analysis.compare / engine.report / engine.analysis.numerics;
this
page only picks runs, draws and launches the demo preset.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.analysis.compare import (
    config_diff,
    default_baseline,
    default_selection,
    display_names,
    summary_table,
)
from engine.analysis.findings import findings
from engine.analysis.numerics import KINDS, fractions_rows, load, numerics_path, sampled_steps
from engine.analysis.steady import chart_points_per_run, metrics_frames, steady_medians
from engine.analysis.summary_text import MAIN_COLUMNS, NOTE, summary_strings
from engine.analysis.whatif import summary_projection
from engine.config import ConfigError
from engine.display import NA
from engine.presets import NUMERICS_DEMO_BASE as DEMO
from engine.presets import launch_many, numerics_demo_configs
from engine.report.figures import X_STEP, X_WALL, comparison_figures, memory_split_figure
from engine.report.html import build_html
from engine.run.launcher import reconcile
from engine.traces.explain import differs_words, explain_runs, parts_rows
from engine.traces.verdict import short_kernel_name
from pages.numerics_charts import KIND_LABELS, histogram_figure
from pages.plot_view import draw_chart
from pages.speedup_view import draw_speedup
from pages.ui import (
    details,
    ensure_app_shell,
    get_store,
    id_in_address,
    ids_in_address,
    plain,
    show_caveat,
    status_badge,
)
from pages.whatif_view import TITLE as WHATIF_TITLE
from pages.whatif_view import draw_projection

ensure_app_shell()  # before drawing anything: see pages/ui.py

PRESET_KEY = "preset_run_ids"  # written by the Launch page's comparison preset
RUNS_KEY, SEEN_PRESET_KEY, BASELINE_KEY = "compare_runs", "compare_seen_preset", "compare_baseline"

store = get_store()
reconcile(store)
all_runs = store.list_runs(limit=500)
by_id = {run.id: run for run in all_runs}


def demo_button(key: str) -> None:
    if st.button("Launch demo: fp16 without loss scaling vs fp16-amp vs bf16-amp", key=key,
                 help=f"Queues three {DEMO.model}-{DEMO.size} runs (batch "
                      f"{DEMO.batch_size}, lr {DEMO.lr:g}, {DEMO.steps} steps) "
                      "one after another on this device."):
        try:
            st.session_state[PRESET_KEY] = launch_many(numerics_demo_configs(), store)
        except ConfigError as exc:
            st.error(
                f"Demo not launched. **{exc.field}** = {plain(repr(exc.value))}: {plain(exc.fix)}"
            )
            return
        st.rerun()


def selection_from_url() -> None:
    """A shared link (?runs=ID,ID&baseline=ID) restores that view on the first visit;
    ids this store does not have are named (as text) and left out."""
    if RUNS_KEY in st.session_state or "runs" not in st.query_params:
        return
    requested = ids_in_address("runs")
    unknown = [i for i in requested if i not in by_id]
    if unknown:
        st.warning(f"{len(unknown)} run(s) in this page's address do not exist here (deleted, "
                   "or from another data directory); comparing the others.")
        st.code("\n".join(unknown[:20]), language=None)
    st.session_state[RUNS_KEY] = [i for i in requested if i in by_id]
    st.session_state[SEEN_PRESET_KEY] = tuple(st.session_state.get(PRESET_KEY) or ())
    url_baseline = id_in_address("baseline")
    if url_baseline in st.session_state[RUNS_KEY]:
        st.session_state[BASELINE_KEY] = url_baseline
    elif url_baseline:
        st.warning("The baseline in this page's address is not among the compared runs; the "
                   "default baseline is used instead.")


def sync_selection() -> None:
    """Default the run picker to the latest preset, once per new preset (not on every
    rerun, which would undo the user's own picks)."""
    selection_from_url()
    preset = tuple(st.session_state.get(PRESET_KEY) or ())
    if RUNS_KEY not in st.session_state or st.session_state.get(SEEN_PRESET_KEY) != preset:
        st.session_state[RUNS_KEY] = [i for i in default_selection(store, preset) if i in by_id]
        st.session_state[SEEN_PRESET_KEY] = preset
    else:
        st.session_state[RUNS_KEY] = [i for i in st.session_state[RUNS_KEY] if i in by_id]


st.title("Compare runs")
if not all_runs:
    st.info("No runs yet. Queue the comparison preset on the Launch page, or the demo below.")
    demo_button("demo_empty")
    st.stop()

sync_selection()
selected = st.multiselect(
    "Runs", list(by_id), key=RUNS_KEY,
    format_func=lambda i: f"{status_badge(by_id[i].status)} · {by_id[i].config.label} · {i}",
    help="Default: the latest comparison preset, else the newest finished runs of one "
         "model, size and batch at different precisions.")
if not selected:
    for key in ("runs", "baseline"):  # the address must not bring back what was cleared
        st.query_params.pop(key, None)
    st.info("Pick one or more runs to compare.")
    st.stop()

@st.cache_data(max_entries=400, show_spinner=False)
def _ended_run_frame(home: str, run_id: str, ended_at: float, max_points: int) -> pd.DataFrame:
    """An ended run's chart rows never change: read once per server, not per render.
    (`home` and `ended_at` are part of the cache key.)"""
    return metrics_frames(get_store(), [run_id], max_points)[run_id]


def chart_frames(store, runs, max_points: int) -> dict[str, pd.DataFrame]:
    return {run.id: (metrics_frames(store, [run.id], max_points)[run.id]
                     if run.is_active or run.ended_at is None
                     else _ended_run_frame(str(store.home), run.id, run.ended_at, max_points))
            for run in runs}


checks = [by_id[i] for i in selected if by_id[i].config.is_speedup_check]
if checks:
    st.subheader("Speedup checks")
    st.caption("Paired measurements: the modes ran interleaved in one process. This is the "
               "figure to quote; the run comparison below compares separate runs.")
    for check in checks:
        st.markdown(
            f"**{plain(check.config.label)}** · `{check.id}` · {status_badge(check.status)}"
        )
        draw_speedup(check.summary.get("speedup") or {}, key=f"compare_{check.id}",
                     active=check.is_active)
selected = [i for i in selected if not by_id[i].config.is_speedup_check]
if not selected:
    st.download_button(
        "Download HTML report", key="compare_download_checks", mime="text/html",
        on_click="ignore", file_name=f"precision-lab-report-{checks[0].id}.html",
        data=lambda: build_html(store, [c.id for c in checks]).encode("utf-8"),
        help="One self-contained file (plotly embedded): opens offline")
    st.stop()

runs = [by_id[i] for i in selected]
names = display_names(runs)
if st.session_state.get(BASELINE_KEY) not in selected:
    st.session_state[BASELINE_KEY] = default_baseline(runs)

left, mid, right, far = st.columns([2, 2, 3, 1])
baseline = left.selectbox("Baseline", selected, key=BASELINE_KEY, format_func=names.get,
                          help="Ratios are against this run (default: the fp32 run)")
st.query_params["runs"] = ",".join(selected)  # a shareable URL for this comparison
st.query_params["baseline"] = baseline
x_choice = mid.radio("X axis", [X_STEP, X_WALL], horizontal=True, key="compare_x",
                     format_func={X_STEP: "step", X_WALL: "wall time"}.get)
smoothing = right.slider("Smoothing (EMA weight; 0 = off)", 0.0, 0.99, 0.0, 0.01,
                         key="compare_smoothing",
                         help="The smoothed line is drawn over the raw points, which stay visible")
log_y = far.toggle("Log y", key="compare_log")

active = [r for r in runs if r.is_active]
if active:
    st.caption(
        f"{len(active)} of the runs are still {', '.join(sorted({r.status for r in active}))}: "
        "the numbers change as they progress."
    )
    st.button("Refresh", key="compare_refresh")

table = summary_table(store, selected, baseline)
frames = chart_frames(store, runs, chart_points_per_run(len(selected)))
units = dict(zip(table["run_id"], table["throughput_unit"]))
figures = comparison_figures(frames, names, units, x_choice, smoothing, log_y,
                             steady_medians=steady_medians(table))
col_a, col_b = st.columns(2)
draw_chart(container=col_a, figure=figures["loss"], key="compare_chart_loss")
draw_chart(container=col_b, figure=figures["throughput"], key="compare_chart_throughput")
draw_chart(container=col_a, figure=figures["memory"], key="compare_chart_memory")
# What holds each run's tensor peak (engine.training.memory): where a precision saves memory.
split_figure = memory_split_figure([(names[row["run_id"]], row["memory_by_kind"])
                                    for row in table.to_dict("records")
                                    if row.get("memory_by_kind")])
if split_figure is not None:
    draw_chart(container=col_b, figure=split_figure, key="compare_chart_memory_split")

st.subheader("Summary")
st.caption("Medians over steady-state steps (warm-up and profiler-window steps excluded). "
           "The throughput interval covers each run's own step-to-step spread, not the "
           "machine's drift between separate runs: for a figure to quote, run a Speedup check "
           "(Launch page). Loss tolerance: how far a final loss may differ from the "
           "baseline's and still be noise (the findings use the same figure). " + NOTE)
# The columns a person reads at 1280 px; the rest (run id, units, tolerances, batch fit...)
# in the expander. The same strings as the report's (engine.analysis.summary_text).
st.dataframe(summary_strings(table, MAIN_COLUMNS), key="compare_summary", hide_index=True,
             placeholder=NA)
details("Every summary column", "compare_every_column",
        lambda: st.dataframe(summary_strings(table), key="compare_summary_all",
                             hide_index=True, placeholder=NA))

st.subheader("Findings")
statements = findings(table, {r.id: r for r in runs}, run_dir=store.run_dir)
st.markdown("\n".join(f"- {plain(s)}" for s in statements) or "No numbers to compare yet.")

st.subheader("Why one run is faster than another")
st.caption("From the runs' profiler windows: each run's step split the same way (matrix, "
           "attention, elementwise, normalisation, copies, communication, optimizer, idle), "
           "each part's time against the baseline's, so the total is explained part by part.")


@st.cache_data(max_entries=64, show_spinner="Reading the profiler traces...")
def _diff(home: str, base_id: str, run_id: str, base_ended: float | None,
          run_ended: float | None) -> dict | None:
    """Cached per pair of ended runs (`home` and the end times are part of the key)."""
    return explain_runs(get_store(), get_store().get_run(base_id), get_store().get_run(run_id))


projected = [run for run in runs if (run.summary.get("explain") or {}).get("accounting")]
if projected:
    with st.expander(WHATIF_TITLE):
        for run in projected:
            st.markdown(f"**{plain(names[run.id])}**")
            draw_projection(summary_projection(run), key=f"compare_projection_{run.id}")
for bounded in runs:  # what limits each run's step, from its profiler window
    verdict = (bounded.summary.get("explain") or {}).get("bound_by")
    if verdict:
        st.caption(f"{plain(names[bounded.id])}: {plain(verdict['sentence'])}")
base_run = next(r for r in runs if r.id == baseline)
compared_any = False
caveats_shown: set[str] = set()  # a run's busy caveat is in every pair it is part of: once
for other in (r for r in runs if r.id != baseline):
    diff = _diff(str(store.home), base_run.id, other.id, base_run.ended_at, other.ended_at)
    if diff is None:
        continue
    compared_any = True
    if diff.get("error"):
        st.caption(f"{plain(names[other.id])}: {plain(diff['error'])}")
        continue
    st.markdown(f"**{plain(names[other.id])} vs {plain(names[baseline])}** (they differ in: "
                f"{plain(differs_words(diff))}): {plain(diff['sentence'])}")
    for caveat in diff.get("caveats") or []:
        if caveat["text"] not in caveats_shown:
            caveats_shown.add(caveat["text"])
            show_caveat(caveat)
    st.dataframe(parts_rows(diff), hide_index=True, key=f"compare_parts_{other.id}", placeholder=NA)
    only = [*(("only in " + names[baseline], r) for r in diff["only_in_a"][:5]),
            *(("only in " + names[other.id], r) for r in diff["only_in_b"][:5])]
    if only:
        st.caption("Kernels/ops in one run only: " + "; ".join(
            f"{plain(where)}: {plain(short_kernel_name(r['name'], 60))} "
            f"({r['us_per_step'] / 1000:,.3f} ms/step"
            + (f", {plain(r['note'])}" if r.get("note") else "") + ")" for where, r in only))
if not compared_any:
    st.caption("No two of these runs have a profiler window to compare (runs record one "
               "after warm-up unless profiling is off).")

st.subheader("Config differences")
diff = config_diff({r.id: r.config for r in runs})
if diff.empty:
    st.caption("The selected runs' configs are identical." if len(runs) > 1
               else "One run selected: nothing to compare.")
else:
    st.dataframe(diff, key="compare_config_diff", hide_index=True, placeholder=NA)

st.download_button(
    "Download HTML report", key="compare_download", mime="text/html", on_click="ignore",
    file_name=f"precision-lab-report-{'-'.join(r.id for r in runs[:3])}.html",
    # Built on click only: the report inlines plotly.js (~5 MB).
    data=lambda: build_html(store, selected, baseline).encode("utf-8"),
    help="One self-contained file (plotly embedded): opens offline")


# ---------------------------------------------------------------------------------------
# numerics


def numerics_section() -> None:
    st.subheader("Numerics: gradient and activation magnitudes against fp16/bf16 ranges")
    paths = {r.id: numerics_path(store.run_dir(r.id)) for r in runs}
    recorded = [run_id for run_id, path in paths.items() if path.exists()]
    if not recorded:
        st.info("None of the selected runs recorded numerics. They are sampled at a few steps "
                "(off the hot path) when a run is launched with numerics capture on; the demo "
                "below does that, and shows fp16 gradients underflowing without loss scaling.")
        demo_button("demo_numerics")
        return
    if st.session_state.get("numerics_run") not in recorded:
        st.session_state["numerics_run"] = recorded[0]
    left, mid, right = st.columns([3, 1, 3])
    run_id = left.selectbox("Run", recorded, key="numerics_run", format_func=names.get)
    try:
        records = load(paths[run_id])
    except ValueError as exc:
        st.warning(str(exc))
        return
    steps = sampled_steps(records)
    if not steps:
        st.info("The numerics file has no records yet (the run has not reached a sampled step).")
        return
    if st.session_state.get("numerics_step") not in steps:
        st.session_state["numerics_step"] = steps[-1]
    step = mid.selectbox("Sampled step", steps, key="numerics_step")
    kind = right.radio("Values", list(KINDS), horizontal=False, key="numerics_kind",
                       index=list(KINDS).index("output_grad"), format_func=KIND_LABELS.get)
    scaled_available = kind != "activation" and any(
        (r.get("loss_scale") or 1.0) != 1.0 for r in records if r["step"] == step)
    times_scale = scaled_available and st.toggle(
        "Show gradients × loss scale (what fp16-amp's GradScaler stores)", key="numerics_scaled")
    draw_chart(figure=histogram_figure(records, step, kind, times_scale), key="numerics_hist")
    rows = pd.DataFrame([r for r in fractions_rows(records, step) if r["kind"] == kind])
    st.dataframe(rows, key="numerics_table", hide_index=True, placeholder=NA)
    st.caption(
        "underflow: would round to 0 in fp16; subnormal: would keep fewer significant bits; "
        "overflow: would become inf. '_scaled' columns: the same for values × the run's loss "
        "scale. Values that already underflowed inside an fp16 backward arrive as exact "
        "zeros: compare zero_pct between runs. Percentages are of all values of the layer.")


numerics_section()

with st.expander("Demo: fp16 without loss scaling vs fp16-amp vs bf16-amp"):
    st.markdown(
        f"Three {DEMO.model}-{DEMO.size} runs, batch {DEMO.batch_size}, "
        f"lr {DEMO.lr:g}, {DEMO.steps} steps. As the model grows confident its "
        "activation gradients shrink below fp16's smallest subnormal (6e-8): without loss "
        "scaling they become exact zeros; a GradScaler (×65536) keeps most of them "
        "representable; bf16 (fp32's exponent range) does not underflow at all. On a CPU, fp16 "
        "is usually emulated "
        "and much slower than fp32."
    )
    demo_button("demo_expander")
