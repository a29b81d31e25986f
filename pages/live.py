"""Live: one run's loss, throughput, memory and loss scale, refreshed every second.

The refreshing part is a fragment that reads only the rows after the last step it has
seen; it stops refreshing once the run has ended.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.analysis.cpu_evidence import verdict_tone
from engine.analysis.findings import both_mfu_words, peak_words
from engine.analysis.live import (
    busy_words,
    data_wait_share,
    eta_s,
    ledger_rows,
    ledger_sentence,
    live_headline,
)
from engine.analysis.stall import stall_of, stall_words
from engine.analysis.whatif import summary_projection
from engine.display import (
    MEMORY_UNITS,
    NA,
    loss_text,
    memory_text,
    memory_unit,
    mfu_text,
    share_text,
    step_time_text,
    throughput_text,
)
from engine.report.export import metrics_csv, metrics_parquet
from engine.run.batch_search import (
    DEFAULT_MAX_PROBES,
    SEARCH_LOG,
    batch_search_progress,
    search_outcome,
    start_batch_search,
)
from engine.run.launcher import read_log_tail, reconcile, stop
from engine.run.ray_runs import is_ray_run
from engine.schema import throughput_column, throughput_unit
from engine.store import RunNotFound
from engine.store.downsample import downsample_minmax
from engine.traces.explain import window_note
from pages import charts
from pages.live_refresh import (
    REFRESH_S,
    refresh_interval_s,
    rerun_after_drawing,
    rerun_before_drawing,
)
from pages.plot_view import draw_chart
from pages.speedup_view import draw_speedup
from pages.ui import (
    LIVE_RUN_KEY,
    PREFILL_KEY,
    VERDICT_COLOURS,
    coloured,
    details,
    ensure_app_shell,
    fmt_duration,
    fmt_num,
    get_store,
    id_in_address,
    plain,
    relaunch,
    show_caveat,
    status_words,
)
from pages.whatif_view import TITLE as WHATIF_TITLE
from pages.whatif_view import draw_projection

ensure_app_shell()  # before drawing anything: see pages/ui.py

MAX_PLOT_POINTS = 2000
_CACHE_KEY = "live_metrics_cache"

store = get_store()
reconcile(store)  # a dead worker shows as failed here, not as a "running" ghost
runs = store.list_runs(limit=500)

st.title("Live")
if not runs:
    st.info("No runs yet. Start one on the Launch page.")
    st.page_link("pages/launch.py", label="Launch a run", icon=":material/rocket_launch:")
    st.stop()

run_ids = [r.id for r in runs]
# No status in the labels: they would go stale while the fragment refreshes.
labels = {r.id: f"{r.config.label} · {r.id}" for r in runs}
url_run = id_in_address("run", warn="live_select" not in st.session_state)
if url_run and url_run not in run_ids and "live_select" not in st.session_state:
    st.warning("The run in this page's address does not exist here (deleted, or from another "
               "data directory); showing the newest run instead.")
    st.code(url_run, language=None)  # as text: it comes from the URL
wanted = st.session_state.get(LIVE_RUN_KEY) or url_run
selected = st.selectbox("Run", run_ids, index=run_ids.index(wanted) if wanted in run_ids else 0,
                        format_func=labels.get, key="live_select")
if st.session_state.get(LIVE_RUN_KEY) != selected:
    st.session_state[LIVE_RUN_KEY] = selected
st.query_params["run"] = selected  # shareable URL for this run

run = store.get_run(selected)
cfg = run.config
what = (f"speedup check: {' vs '.join(cfg.speedup_mode_list)} (baseline first), budget "
        f"{cfg.speedup_budget_s:g} s" if cfg.is_speedup_check
        else f"{cfg.precision} · {cfg.steps} steps")
st.caption(
    f"{plain(cfg.model_label)} · {what} · batch {cfg.batch_size} · lr {cfg.lr:g} · "
    f"{cfg.optimizer} · device {plain(run.device_key)} "
    f"({plain(run.device_name or 'unknown')}) · seed {cfg.seed}"
    + (
        f" · {cfg.nprocs} processes ({cfg.sharding}, comm hook {cfg.comm_hook})"
        if cfg.nprocs > 1
        else ""
    )
)

on_ray = is_ray_run(store, run.id)  # a sweep run placed by a Ray cluster (device "cpu@IP")
# Chart options and run actions: outside the refreshing fragment (the fragment reads them).
if cfg.is_speedup_check:  # no metric rows: nothing to smooth or export, one action
    if st.button("Re-launch with this config", key="live_relaunch",
                 help="Opens Launch with this check's model and batch filled in"):
        relaunch(run)
else:
    opt_smooth, opt_log, opt_relaunch, opt_csv, opt_parquet = st.columns([3, 1.3, 2, 1, 1])
    opt_smooth.slider("Smoothing (EMA weight; 0 = off)", 0.0, 0.99, 0.0, 0.01, key="live_smoothing",
                      help="The smoothed line is drawn over the raw points, which stay visible")
    opt_log.toggle("Log y", key="live_log", help="Loss and throughput on a log scale")
    if opt_relaunch.button("Re-launch with this config", key="live_relaunch",
                           help="Opens Launch with this run's settings filled in"):
        relaunch(run)
    opt_csv.download_button("CSV", data=lambda: metrics_csv(store, run.id),
                            file_name=f"{run.id}-metrics.csv", mime="text/csv", key="live_csv",
                            help="Every logged step, every metric column (units in the header)",
                            on_click="ignore")
    opt_parquet.download_button("Parquet", data=lambda: metrics_parquet(store, run.id),
                                file_name=f"{run.id}-metrics.parquet",
                                mime="application/vnd.apache.parquet", key="live_parquet",
                                help="Every logged step, typed columns; units in the file metadata",
                                on_click="ignore")
if run.is_active:
    if st.button("Stop run", key="stop_run", type="secondary"):
        with st.spinner("Stopping (the Ray task is asked to stop, then cancelled)..." if on_ray
                        else "Stopping (SIGTERM, then SIGKILL after 3 s)..."):
            stop(run.id, store)
        st.rerun()


def metrics_frame(run_id: str) -> pd.DataFrame:
    """Cached rows of this run plus any new ones (incremental: step > last seen)."""
    cache = st.session_state.get(_CACHE_KEY)
    if not cache or cache["run_id"] != run_id:
        # First read is downsampled so a 100k-step run does not load every row.
        frame = store.read_metrics(run_id, max_points=MAX_PLOT_POINTS)
        cache = {"run_id": run_id, "frame": frame}
    else:
        last_step = int(cache["frame"]["step"].max()) if len(cache["frame"]) else 0
        fresh = store.read_metrics(run_id, after_step=last_step, max_points=None)
        if len(fresh):
            cache["frame"] = pd.concat([cache["frame"], fresh], ignore_index=True)
    if len(cache["frame"]) > 2 * MAX_PLOT_POINTS:
        cache["frame"] = downsample_minmax(cache["frame"], ["loss", "samples_per_s"],
                                           MAX_PLOT_POINTS).reset_index(drop=True)
    st.session_state[_CACHE_KEY] = cache
    return cache["frame"]


def progress_block(run, frame: pd.DataFrame) -> None:
    done, total = run.steps_completed, run.total_steps
    text = f"step {done} / {total}"
    if run.status == "running" and len(frame):
        remaining_s = eta_s(frame, done, total)
        if remaining_s is not None:
            text += f" · ETA {fmt_duration(remaining_s)}"
    st.progress(min(1.0, done / total) if total else 0.0, text=text)


def status_block(run) -> None:
    if run.status == "queued":
        position = store.queue_position(run.id)
        st.info(
            f"{status_words('queued')}: waiting for {plain(run.device_key)} (position {position}); "
            "one run per device at a time keeps throughput numbers honest."
        )
    elif run.status == "running":
        st.success(f"{status_words('running')} on {plain(run.device_key)}")
        stall = stall_of(store, run)
        if stall:
            st.warning(f"{stall_words(stall)} The run is still alive; runs queued behind it "
                       "wait. Stop run ends it if it does not recover.")
    elif run.status == "finished":
        st.success(f"{status_words('finished')}" + (f": {plain(run.reason)}" if run.reason else ""))
    else:
        st.error(f"{status_words(run.status)}: {plain(run.reason or 'no reason recorded')}")


def headline_metrics(run, frame: pd.DataFrame) -> None:
    summary = run.summary
    last = frame.iloc[-1] if len(frame) else None
    head = live_headline(summary, run.config.model, frame, run.device_key)
    cols = st.columns(5)
    cols[0].metric("Loss", loss_text(None if last is None else last["loss"]),
                   help="Latest logged loss (fp32, whatever the mode)")
    cols[1].metric(head.throughput_unit.capitalize(),  # "Tokens/s": short enough to show
                   throughput_text(head.throughput),
                   help="Median over steady-state steps (warm-up and profiler window "
                        "excluded): the same figure as on Runs, Compare, the report and the CLI")
    cols[2].metric("Step time", step_time_text(head.step_time_ms),
                   help="Median over steady-state steps, as on Runs, Compare and the report")
    busy = busy_words(summary, frame)
    if busy:
        st.warning(busy)
    cols[3].metric(head.peak_name.capitalize(), memory_text(head.peak_mem_bytes),
                   help=plain(head.memory_words))
    # The tile is chosen by whether a peak is known (fixed before the first step), not by
    # whether a value has arrived yet, so it does not flip between the two while running.
    # Always MFU (the same tile on every run): n/a with the achieved TFLOP/s in its help
    # where no peak is known for this precision.
    if summary.get("peak_flops"):
        cols[4].metric("MFU", mfu_text(head.mfu),
                       help=f"Against the {peak_words(summary)}. "
                            f"{summary.get('mfu_note') or ''}")
    else:
        cols[4].metric("MFU", mfu_text(None),
                       help=f"Achieved {fmt_num(head.achieved_tflops, 3)} TFLOP/s. "
                            + (summary.get("mfu_note") or "MFU is n/a until the device's peak "
                               "for this precision is known"))
    both = both_mfu_words(summary)  # the datasheet's and the measured one, each named
    if both:
        st.caption(plain(both))
    st.caption(plain(head.memory_words))  # both memory peaks by name, the tensor peak's split


def data_wait_line(run, frame: pd.DataFrame) -> None:
    """How much of each step waited for the next batch (the input pipeline)."""
    share = data_wait_share(run.summary, frame)
    if share is None:
        return
    cfg = run.config
    source = (f"DataLoader, {cfg.num_workers} workers" if cfg.data == "loader"
              else "synthetic batches on the device")
    text = f"Data wait: **{share_text(share, 1)}** of the step ({source})"
    if share > 0.5:
        st.warning(text + ": input-bound; more DataLoader workers (Input pipeline on Launch) "
                   "or a cheaper pipeline would make steps faster than any precision can.")
    else:
        st.caption(text)


def projection_expander(run) -> None:
    """The what-if of the run's profiler window, once it is analysed."""
    if not (run.summary.get("explain") or {}).get("accounting"):
        return
    with st.expander(WHATIF_TITLE):
        draw_projection(summary_projection(run), key="live_projection")


def matrix_unit_badge(run) -> None:
    """After the profiler window: did the matrix work run on the matrix unit?"""
    summary = run.summary
    if summary.get("profile_error"):
        st.error(f"Profiler: {plain(summary['profile_error'])}")
    verdict = (summary.get("kernels") or {}).get("verdict")
    if verdict:
        answer = verdict.get("tensor_cores") or "unknown"
        st.markdown(f"Tensor Cores: {coloured(answer, VERDICT_COLOURS.get(answer, 'gray'))} · "
                    f"**{plain(verdict.get('headline', ''))}**")
        if verdict.get("evidence"):
            st.caption(
                "Evidence: " + ", ".join(plain(str(name)[:80]) for name in verdict["evidence"][:3])
            )
    cpu = summary.get("cpu_evidence")
    if cpu:
        tone = verdict_tone(cpu["verdict"])
        st.markdown(f"**CPU matrix unit:** {coloured(tone, VERDICT_COLOURS.get(tone, 'orange'))} · "
                    f"{plain(cpu['headline'])}")
        if cpu.get("evidence"):
            st.caption("oneDNN evidence: " + ", ".join(plain(e) for e in cpu["evidence"][:4]))
    explain = summary.get("explain") or {}
    if explain.get("bound_by"):
        banner, bound = explain.get("banner") or {}, explain["bound_by"]
        if banner.get("headline") and verdict:
            st.caption(plain(banner["headline"]))  # the verdict with how busy the GPU was
        st.info(f"**Bound by:** {plain(bound['sentence'])}"
                + "".join(f"\n- {plain(tip)}" for tip in bound.get("advice", [])[:3]))
        note = window_note(summary)
        if note:
            show_caveat(note)
    if verdict or cpu or explain:
        st.page_link("pages/kernels.py", label="Kernel breakdown", icon=":material/memory:")


def charts_block(run, frame: pd.DataFrame) -> None:
    if frame.empty:
        if not run.is_active:  # an ended run will never log one: say why it has none
            st.info(f"No step was logged: the run ended ({run.status}) before its first "
                    "logged step. The reason is above; the worker log below has the details.")
        else:
            st.info("Waiting for the first logged step" +
                    (" (the run is queued)." if run.status == "queued" else "..."))
        return
    is_cuda = run.device_key.startswith("cuda")
    rate_col = throughput_column(run.config.model)
    unit = throughput_unit(run.config.model).removesuffix("/s")
    smoothing = float(st.session_state.get("live_smoothing", 0.0))
    log_y = bool(st.session_state.get("live_log"))
    left, right = st.columns(2)
    # The first row is what the page is opened to watch: drawn at once (plot_view: eager).
    draw_chart(container=left, figure=charts.loss_figure(frame, smoothing=smoothing, log_y=log_y),
               key="chart_loss", eager=True)
    draw_chart(container=right, figure=charts.throughput_figure(
        frame, rate_col, unit, smoothing=smoothing, log_y=log_y), key="chart_throughput",
        eager=True)
    left, right = st.columns(2)
    draw_chart(container=left, figure=charts.memory_figure(frame, is_cuda), key="chart_memory")
    if run.config.uses_grad_scaler:
        draw_chart(container=right, figure=charts.loss_scale_figure(frame), key="chart_loss_scale")
    else:
        right.info("No loss scale: only fp16-amp uses a GradScaler"
                   + (" (disabled for this run)." if run.config.precision == "fp16-amp" else "."))


def skip_ledger_block(run) -> None:
    """fp16-amp: the steps the GradScaler skipped, each with where it overflowed (at the
    run's end: the trainer writes the ledger with its result)."""
    ledger = run.summary.get("skip_ledger")
    sentence = ledger_sentence(ledger, run.summary.get("skipped_steps"))
    if not sentence:
        return
    st.subheader("Skipped steps: where fp16 overflowed")
    st.caption(plain(sentence))  # layer names are the workload's: never Markdown
    st.dataframe(pd.DataFrame(ledger_rows(ledger)), hide_index=True, width="stretch",
                 key="skip_ledger_table", placeholder=NA)


def telemetry_block(run) -> None:
    """GPU telemetry from NVML (2 Hz) or, on CPU runs, the worker's CPU % and RSS; one
    line per rank in a multi-process run (each rank samples its own process and GPU)."""
    frame = store.read_telemetry(run.id)
    if frame.empty:
        return
    st.subheader("Telemetry")
    if frame["rank"].nunique() > 1:
        st.caption(f"One line per rank ({frame['rank'].nunique()} processes).")
    reasons = frame["throttle_reasons"].dropna()
    throttled = reasons[reasons.str.len() > 0] if len(reasons) else reasons
    if len(throttled):
        from engine.hardware.telemetry import is_throttled

        flagged = [r for r in throttled.unique() if is_throttled(r)]
        if flagged:
            st.warning(f"Clocks were throttled during this run: {', '.join(flagged[:3])}. "
                       "Throughput and MFU are lower than the hardware can do.")
    if run.device_key.startswith("cuda"):
        left, right = st.columns(2)
        draw_chart(container=left, figure=charts.telemetry_figure(
            frame, [("gpu_util_pct", "GPU util %"), ("mem_util_pct", "memory util %")],
            "GPU utilisation", "%"), key="tele_util")
        draw_chart(container=right, figure=charts.telemetry_figure(
            frame, [("power_w", "power W"), ("power_limit_w", "power limit W"),
                    ("temp_c", "temperature °C"), ("sm_clock_mhz", "SM clock MHz")],
            "Power, temperature, clocks", "value"), key="tele_power")
    else:
        left, right = st.columns(2)
        draw_chart(
            container=left,
            figure=charts.telemetry_figure(
                frame, [("cpu_pct", "worker CPU %")], "CPU utilisation (100 % = one core)", "%"
            ),
            key="tele_cpu",
        )
        unit = memory_unit([frame["rss_bytes"].max()])
        rss = frame.assign(rss_in_unit=frame["rss_bytes"] / MEMORY_UNITS[unit])
        draw_chart(container=right, figure=charts.telemetry_figure(
            rss, [("rss_in_unit", f"worker RSS {unit}")], "Resident memory", unit),
            key="tele_rss")
        st.caption("No NVIDIA GPU on this run: NVML telemetry (utilisation, power, clocks, "
                   "throttling) applies to CUDA runs only.")


def live_panel(run_id: str, status_at_load: str, refresh_at_load: float | None = REFRESH_S
               ) -> None:
    try:
        current = store.get_run(run_id)
    except RunNotFound:
        st.warning("This run no longer exists.")
        return
    interval_s = refresh_interval_s(current)
    if rerun_before_drawing(refresh_at_load, interval_s):
        st.rerun()  # the first step is stored: the whole page, on the usual timer
    status_block(current)
    if current.config.is_speedup_check:
        # A speedup check logs no training steps: its rounds are the progress.
        draw_speedup(current.summary.get("speedup") or {}, key="live_speedup",
                     active=current.is_active)
        telemetry_block(current)
    else:
        frame = metrics_frame(run_id)
        progress_block(current, frame)
        headline_metrics(current, frame)
        data_wait_line(current, frame)
        matrix_unit_badge(current)
        projection_expander(current)
        charts_block(current, frame)
        skip_ledger_block(current)
        telemetry_block(current)
    if rerun_after_drawing(refresh_at_load, interval_s, status_at_load, current.status):
        st.rerun()  # new labels and buttons, or no timer once the run has ended


refresh_s = refresh_interval_s(run)
st.fragment(run_every=refresh_s)(live_panel)(run.id, run.status, refresh_s)

SEARCH_REFRESH_S = 1.0


def batch_search_block(run) -> None:
    """Offered after an OOM (and for any ended run): a bounded search of short probes in
    a background process (engine.run.batch_search), so the page never waits for it and
    the search goes on if the page is closed."""
    search = batch_search_progress(store, run.id)
    if search and search["state"] == "running":
        st.fragment(run_every=SEARCH_REFRESH_S)(batch_search_running)(run.id)
        return
    if search and search["state"] == "done":
        batch_search_result(run, search)
    elif search and search["state"] == "failed":
        st.error("The batch-size search failed: "
                 f"{plain(search.get('error') or 'no reason recorded')} (the full output is "
                 f"in {SEARCH_LOG} in the run's folder)")
    elif run.summary.get("max_batch_fit"):  # measured earlier, e.g. by `engine maxbatch`
        st.info(f"Largest batch that fits (measured): **{run.summary['max_batch_fit']}**")
    label = ("Find the largest batch that fits" if run.status == "oom"
             else "Measure the largest batch that fits")
    if st.button(label, key="find_max_batch",
                 help=f"Two training steps per batch size, at most {DEFAULT_MAX_PROBES} sizes, "
                      "in the background: you can leave this page meanwhile"):
        try:
            start_batch_search(store, run.id)
        except RunNotFound:
            st.warning("This run no longer exists.")
            return
        st.rerun()


def batch_search_running(run_id: str) -> None:
    """Probes so far, redrawn every second; the whole page once the search has ended."""
    search = batch_search_progress(store, run_id)
    if not search or search["state"] != "running":
        st.rerun()
    probes = search.get("probes") or []
    done = ", ".join(f"{p['batch_size']} {'fits' if p['fits'] else 'does not fit'}"
                     for p in probes)
    st.info(f"Finding the largest batch that fits, in the background (two training steps "
            f"per size, at most {search.get('max_probes', DEFAULT_MAX_PROBES)} sizes): "
            f"{len(probes)} probed so far" + (f": {done}." if probes
                                              else "; the first probe is loading PyTorch."))


def batch_search_result(run, search: dict) -> None:
    """The answer against the run's memory cap, and a Launch form filled in with it."""
    st.success(plain(search_outcome(search)))
    fit = (search.get("result") or {}).get("max_batch_fit")
    if fit and fit != run.config.batch_size and st.button(
            f"Launch with this batch ({fit})", key="launch_with_batch",
            help="Opens Launch with this run's settings and this batch size filled in"):
        config = {**run.config.to_dict(), "batch_size": int(fit)}
        st.session_state[PREFILL_KEY] = {"run_id": run.id, "config": config}
        st.switch_page("pages/launch.py")


if not run.is_active and on_ray:
    st.caption(f"The largest-batch search probes this machine's devices; this run trained on "
               f"a Ray node ({run.device_key}), so it is not offered here.")
elif not run.is_active and not cfg.is_speedup_check:
    batch_search_block(run)

details("Worker log", "live_worker_log",
        lambda: st.code(read_log_tail(run.id, store) or "(empty)", language="text"))
details("Run config and summary (JSON)", "live_config_json",
        lambda: st.json({"config": cfg.to_dict(), "summary": run.summary}))
