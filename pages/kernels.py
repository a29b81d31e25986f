"""Kernels: did the matrix work run on Tensor Cores (or the CPU's matrix unit)? With the
kernel names as evidence. For a run's profiler window, or any uploaded trace file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.analysis.cpu_evidence import primitive_summary, verdict_tone
from engine.schema import TRACE_FILENAME
from engine.store import RunNotFound
from pages.ui import LIVE_RUN_KEY, ensure_app_shell, get_store, plain, status_badge

ensure_app_shell()  # before drawing anything: see pages/ui.py

st.title("Kernels")
st.caption("Kernel names are the evidence: cuBLAS/cuDNN/CUTLASS encode the math unit and "
           "dtype in them (e.g. `s16816`, `tensorop`, `nvjet_tst`, `_ffma_`). Each verdict "
           "names the token that decided it.")

store = get_store()


@st.cache_data(show_spinner="Analysing the trace...", max_entries=16)
def analyze(path: str, mtime_ns: int) -> dict:
    """Cached per file version: re-analysing a 100 MB trace on every rerun is not an option."""
    from engine.analysis.traces import analyze_trace

    return analyze_trace(path)


def verdict_banner(result: dict) -> None:
    verdict = result.get("verdict") or {}
    answer = verdict.get("tensor_cores", "unknown")
    headline = verdict.get("headline") or "No verdict"
    {"yes": st.success, "partly": st.warning, "no": st.error}.get(answer, st.info)(
        f"**{plain(headline)}**")
    if verdict.get("evidence"):  # kernel names from the trace: shown as text
        st.caption("Evidence kernels:")
        st.code("\n".join(str(name) for name in verdict["evidence"][:5]), language=None)


def category_chart(result: dict) -> None:
    categories = {k: v for k, v in (result.get("categories") or {}).items() if v}
    if not categories:
        return
    fig = go.Figure(go.Bar(x=list(categories.values()), y=list(categories.keys()),
                           orientation="h"))
    fig.update_layout(title="GPU time per kernel category (µs)", height=320,
                      margin=dict(l=10, r=10, t=40, b=10), yaxis=dict(autorange="reversed"))
    st.plotly_chart(fig, key="kernel_categories")


def gpu_report(result: dict) -> None:
    if result.get("malformed_events"):
        st.warning(f"{result['malformed_events']} malformed event(s) in this trace (a name that "
                   "is not text, an id that is a list or an object) were left out of every sum.")
    verdict_banner(result)
    cols = st.columns(4)
    cols[0].metric("Kernel time", f"{(result.get('total_kernel_us') or 0) / 1000:,.2f} ms")
    share = result.get("tensor_core_share")
    cols[1].metric("Tensor-Core share (all)", "n/a" if share is None else f"{100 * share:.1f} %")
    mshare = result.get("matrix_tensor_core_share")
    cols[2].metric("Tensor-Core share (matrix)", "n/a" if mshare is None else f"{100 * mshare:.1f} %",
                   help="Of gemm + conv + attention kernel time")
    cols[3].metric("Device", result.get("device") or "unknown")
    category_chart(result)
    st.subheader("Top kernels")
    st.dataframe(pd.DataFrame(result.get("top_kernels") or []), hide_index=True,
                 key="top_kernels")
    could = result.get("could_have_didnt") or []
    st.subheader("Could have, didn't")
    if could:
        st.caption("Matrix ops whose kernels ran without Tensor Cores, with the likely cause.")
        st.dataframe(pd.DataFrame(could), hide_index=True, key="could_have")
    else:
        st.caption("No matrix op ran without Tensor Cores in this window.")
    with st.expander("Per CPU op"):
        st.dataframe(pd.DataFrame(result.get("per_op") or []), hide_index=True, key="per_op")


def cpu_report(evidence: dict) -> None:
    show = {"native": st.success, "neutral": st.info}.get(verdict_tone(evidence["verdict"]),
                                                           st.warning)
    show(f"**CPU matrix unit: {plain(evidence['headline'])}**")
    st.caption("CPU runs have no GPU kernels; the CPU's evidence is which oneDNN implementation "
               "(and so which ISA) ran each matrix primitive during the profiler window.")
    primitives = evidence.get("primitives") or []
    if primitives:
        st.dataframe(pd.DataFrame(primitive_summary(primitives)), hide_index=True,
                     key="onednn_primitives")
    else:
        st.caption("oneDNN recorded no matrix primitive in the window.")


runs = [r for r in store.list_runs(limit=500)
        if (store.run_dir(r.id) / TRACE_FILENAME).exists() or r.summary.get("cpu_evidence")]
source = st.radio("Source", ["A run's profiler window", "Upload a trace file"], horizontal=True,
                  key="kernels_source")

if source == "Upload a trace file":
    upload = st.file_uploader("PyTorch profiler trace (Chrome trace JSON, .json or .json.gz)",
                              type=["json", "gz"], key="trace_upload")
    if upload is not None:
        suffix = ".json.gz" if upload.name.endswith(".gz") else ".json"
        with tempfile.NamedTemporaryFile(suffix=suffix, delete=False) as handle:
            handle.write(upload.getbuffer())
        try:
            from engine.analysis.traces import analyze_trace

            gpu_report(analyze_trace(handle.name))
        except (ValueError, OSError) as exc:
            # Named by the file the user chose, not this server's temporary path.
            message = str(exc).replace(handle.name, upload.name)
            st.error(f"Cannot read {plain(upload.name)}: {plain(message)}")
        finally:
            Path(handle.name).unlink(missing_ok=True)
    st.stop()

if not runs:
    st.info("No profiled runs yet. Runs profile a short window after warm-up by default.")
    st.stop()

ids = [r.id for r in runs]
url_run = st.query_params.get("run")
if url_run and url_run not in ids and "kernels_run" not in st.session_state:
    # Shown as text: the id comes from the URL.
    st.warning("The run in this page's address has no profiler window here (unknown run, "
               "or not profiled); showing the newest profiled run instead.")
    st.code(url_run, language=None)
wanted = (url_run if url_run in ids and "kernels_run" not in st.session_state
          else st.session_state.get(LIVE_RUN_KEY))
run_id = st.selectbox("Run", ids, index=ids.index(wanted) if wanted in ids else 0,
                      format_func=lambda i: next(f"{status_badge(r.status)} · {r.config.label} · {r.id}"
                                                 for r in runs if r.id == i), key="kernels_run")
st.query_params["run"] = run_id  # shareable URL for this run's breakdown
try:
    run = store.get_run(run_id)
except RunNotFound:
    st.warning("This run no longer exists.")
    st.stop()

if run.summary.get("profile_error"):
    st.error(f"Profiler: {plain(run.summary['profile_error'])}")
if run.summary.get("gpm_tensor_util_pct") is not None:
    st.metric("Tensor-pipe activity (NVML GPM counter)",
              f"{run.summary['gpm_tensor_util_pct']:.1f} %", help=run.summary.get("gpm_note"))
elif run.summary.get("gpm_note"):
    st.caption(f"Counter-based confirmation (NVML GPM): {plain(run.summary['gpm_note'])}")
trace_path = store.run_dir(run.id) / TRACE_FILENAME
if run.device_key.startswith("cuda") and trace_path.exists():
    gpu_report(analyze(str(trace_path), trace_path.stat().st_mtime_ns))
elif run.summary.get("cpu_evidence"):
    cpu_report(run.summary["cpu_evidence"])
if trace_path.exists():
    st.download_button("Download trace (open in Perfetto or chrome://tracing)",
                       data=trace_path.read_bytes(), file_name=f"{run.id}-{TRACE_FILENAME}",
                       mime="application/gzip", key="download_trace")
