"""Kernels: did the matrix work run on Tensor Cores (or the CPU's matrix unit)? With the
kernel names as evidence. For a run's profiler window, or any uploaded trace file."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.analysis.cpu_evidence import primitive_summary, verdict_tone
from engine.analysis.whatif import run_projection
from engine.display import NA, ratio_text, share_text
from engine.report.figures import roofline_figure
from engine.schema import TRACE_FILENAME
from engine.store import RunNotFound
from engine.traces.accounting import launch_words, part_shares
from engine.traces.explain import analyze as analyze_trace_file
from engine.traces.explain import (
    differs_words,
    explain_diff,
    explain_runs,
    only_in_rows,
    parts_rows,
    run_rank_traces,
    window_note,
)
from engine.traces.op_rates import witness_sentence
from engine.traces.parser import load_trace
from engine.traces.verdict import short_kernel_name
from pages.plot_view import draw_chart
from pages.ui import (
    LIVE_RUN_KEY,
    details,
    ensure_app_shell,
    get_store,
    id_in_address,
    plain,
    show_caveat,
    status_badge,
)
from pages.whatif_view import TITLE as WHATIF_TITLE
from pages.whatif_view import draw_projection

ensure_app_shell()  # before drawing anything: see pages/ui.py

st.title("Kernels")
st.caption("Kernel names are the evidence: cuBLAS/cuDNN/CUTLASS encode the math unit and "
           "dtype in them (e.g. `s16816`, `tensorop`, `nvjet_tst`, `_ffma_`). Each verdict "
           "names the token that decided it.")

store = get_store()


@st.cache_data(show_spinner="Analysing the trace...", max_entries=16)
def analyze(path: str, mtime_ns: int, cpu_evidence_json: str | None = None,
            step: int | None = None) -> dict:
    """Cached per file version: re-analysing a 100 MB trace on every rerun is not an option."""
    evidence = json.loads(cpu_evidence_json) if cpu_evidence_json else None
    return analyze_trace_file(path, cpu_evidence=evidence, step=step)


def _upload_error(exc: Exception, saved: list[tuple[str, str]], what: str) -> str:
    """The error named by the files the user chose, not this server's temporary paths, and
    prefixed with what failed only when the message does not already name a file."""
    message = str(exc)
    for name, temporary in saved:
        message = message.replace(temporary, name)
    return message if any(name in message for name, _ in saved) else f"{what}: {message}"


def step_choice(result: dict, key: str) -> int | None:
    """A trace with several ProfilerStep#N spans: pick one step, or the whole window."""
    steps = [row["step"] for row in (result.get("accounting") or {}).get("steps") or []]
    if len(steps) < 2:
        return None
    return st.selectbox("Profiler step", [None, *steps], key=key,
                        format_func=lambda n: "the whole window (every step)" if n is None
                        else f"ProfilerStep#{n} only")


@st.cache_data(show_spinner="Reading every rank's trace...", max_entries=8)
def analyze_rank_set(members: tuple[tuple[str, str], ...], newest_mtime_ns: int) -> dict:
    """A multi-process run's ranks side by side, cached per set of trace versions."""
    # late: trace_sets is only for runs and uploads with several ranks
    from engine.traces.sets import analyze_set

    return analyze_set([(label, Path(path)) for label, path in members])


@st.cache_data(show_spinner="Comparing the two runs' windows...", max_entries=8)
def compare_runs(home: str, run_a: str, run_b: str, ended_a: float | None,
                 ended_b: float | None) -> dict | None:
    """explain_runs (the Compare page's comparison, with its caveats), cached per pair of
    runs as they ended (`home` and the end times are part of the key)."""
    store = get_store()
    return explain_runs(store, store.get_run(run_a), store.get_run(run_b))


def header_words(column: str) -> str:
    """A table key as a person reads it: "time_ms" -> "time (ms)", "tensor_core" ->
    "tensor core" (the keys stay snake_case in the data)."""
    for unit in ("ms", "us", "mb", "gb"):
        if column.endswith(f"_{unit}"):
            return f"{column[:-len(unit) - 1].replace('_', ' ')} ({unit.replace('mb', 'MB')})"
    return column.replace("_", " ")


def table(data, **kwargs) -> None:
    """st.dataframe with every snake_case column shown in words, unless configured."""
    config = {column: st.column_config.Column(header_words(str(column)))
              for column in getattr(data, "columns", []) if "_" in str(column)}
    config.update(kwargs.pop("column_config", None) or {})
    st.dataframe(data, column_config=config, placeholder=kwargs.pop("placeholder", NA),
                 **kwargs)


_SHOW = {"success": st.success, "warning": st.warning, "error": st.error, "info": st.info}


def verdict_banner(result: dict) -> None:
    """The verdict, how busy the GPU was, what bounds the step and what to try: one box,
    so the advice is where the eye lands (trace text escaped, never Markdown)."""
    banner = result.get("banner") or {}
    verdict = result.get("verdict") or {}
    headline = banner.get("headline") or verdict.get("headline") or "No verdict"
    text = f"**{plain(headline)}**"
    if banner.get("sentence"):
        text += f"\n\n{plain(banner['sentence'])}"
    if banner.get("advice"):
        text += "\n\nTry:\n" + "\n".join(f"- {plain(advice)}" for advice in banner["advice"])
    _SHOW.get(banner.get("tone"), st.info)(text)
    evidence = [str(name) for name in verdict.get("evidence") or []][:5]
    if evidence:  # kernel names from the trace: shown as text, never as Markdown
        st.caption("Evidence kernels (template arguments elided):")
        # st.text, not st.code: a code block loads Streamlit's 1.5 MB syntax highlighter,
        # 0.2 s of a 2-core machine's browser before the page was ready (a Chromium CPU
        # profile of Kernels); the full names below stay a code block, drawn when opened.
        st.text("\n".join(short_kernel_name(name) for name in evidence))
        details("Full kernel names", "kernels_full_names",
                lambda: st.code("\n\n".join(evidence), language=None))


def defects_warning(result: dict) -> None:
    if result.get("malformed_events"):
        st.warning(f"{result['malformed_events']} malformed event(s) in this trace (a name that "
                   "is not text, an id that is a list or an object) were left out of every sum.")
    if result.get("bad_duration_events"):
        st.warning(f"{result['bad_duration_events']} event(s) with a missing, negative or "
                   "impossible time (a defect of the trace) were left out of every sum.")


def _ms(us) -> str:
    return f"{(us or 0) / 1000:,.3f} ms"


def _pct(share) -> str:
    return "n/a" if share is None else share_text(share, 1)


def parts_table(accounting: dict, key: str) -> None:
    shares = part_shares(accounting)
    rows = [{"part": part, "time_ms_per_step": round(us / 1000, 3),
             "share_of_step": _pct(shares.get(part))}
            for part, us in (accounting.get("parts_per_step_us") or {}).items() if us]
    table(pd.DataFrame(rows), hide_index=True, key=key, placeholder=NA)


def gpu_accounting(accounting: dict) -> None:
    st.subheader("Where the step's time went")
    window = accounting["window"]
    st.caption(f"Window {_ms(accounting['window_us'])} ({window['source']}, "
               f"{window['step_count']} step(s) of {_ms(accounting['step_time_us'])}): the GPU "
               f"was busy {_pct(accounting['busy_share'])} of it and idle "
               f"{_pct(accounting['idle_share'])}. Busy = any kernel, memcpy or memset running "
               "on any stream (the union, not the sum).")
    if window["source"] != "profiler steps":
        counted = (f"its {window['step_count']} steps are counted from the Optimizer.step# "
                   "spans" if window["step_count"] > 1 else
                   "with no Optimizer.step# spans either, it counts as one step")
        st.caption(f"The trace has no ProfilerStep#N markers: the window runs from its first "
                   f"to its last event, and {counted}. No step can be picked on its own.")
    for row in ((("GPU busy", _ms(accounting["busy_us"]), None),
                 ("GPU idle", _ms(accounting["idle_us"]), None)),
                (("Copy-engine transfers (memcpy/memset)", _ms(accounting["copy_us"]),
                  "The whole window's copy-engine time; the parts table's 'copies' is per "
                  "step and also counts copy kernels (dtype casts, .contiguous())"),
                 ("Communication hidden under compute", _ms(accounting["overlap_us"]),
                  f"of {_ms(accounting['communication_us'])} communication"))):
        for column, (label, value, help_text) in zip(st.columns(2), row):
            column.metric(label, value, help=help_text)
    st.caption("Per step, by part (they add up to the step; idle = nothing running on the GPU)")
    parts_table(accounting, "gpu_parts")
    for sentence in launch_words(accounting):
        st.caption(sentence)
    if accounting.get("steps"):
        st.caption("Per profiler step: in the step's CPU span, and by launch (the work the "
                   "step launched, over its own GPU span; lag = how long after the step began "
                   "its first GPU work started)")
        table(pd.DataFrame([_step_row(row) for row in accounting["steps"]]),
                     hide_index=True, key="gpu_steps", placeholder=NA)
        details("Communication and copies per step", "kernels_step_comm", lambda: table(
            pd.DataFrame([_step_comm_row(row) for row in accounting["steps"]]),
            hide_index=True, key="gpu_steps_comm", placeholder=NA))
    st.caption("Per stream")
    table(pd.DataFrame([_stream_row(row) for row in accounting["streams"]]),
                 hide_index=True, key="gpu_streams", placeholder=NA)
    if accounting.get("copies"):
        st.caption("Copies by direction")
        table(pd.DataFrame([_copy_row(row) for row in accounting["copies"]]),
                     hide_index=True, key="gpu_copies", placeholder=NA)


# The same columns, units and share wording as `python -m engine kernels TRACE`.
def _step_row(row: dict) -> dict:
    launched = row.get("launched") or {}

    def ms(us: float | None) -> str:
        return "n/a" if us is None else f"{us / 1000:,.3f}"
    return {"step": row["step"], "time_ms": ms(row["step_time_us"]),
            "busy_ms": ms(row["busy_us"]), "idle": _pct(row["idle_share"]),
            "gpu_span_ms": ms(launched.get("gpu_span_us")),
            "launched_busy_ms": ms(launched.get("busy_us")),
            "idle_in_gpu_span": _pct(launched.get("idle_in_gpu_span_share")),
            "lag_ms": ms(launched.get("gpu_lag_us"))}


def _step_comm_row(row: dict) -> dict:
    return {"step": row["step"], "communication_ms": row["communication_us"] / 1000,
            "hidden_under_compute_ms": row["overlap_us"] / 1000,
            "copy_ms": row["copy_us"] / 1000}


def _stream_row(row: dict) -> dict:
    return {"stream": str(row["stream"]), "kernels": row["kernel_count"],
            "kernel_ms": row["kernel_us"] / 1000,
            "copy_ms": (row["memcpy_us"] + row["memset_us"]) / 1000,
            "busy_ms": row["busy_us"] / 1000, "busy": _pct(row["busy_share"])}


def _copy_row(row: dict) -> dict:
    return {"direction": row["direction"], "count": row["count"],
            "MB": None if row["bytes"] is None else row["bytes"] / 1e6,
            "time_ms": row["us"] / 1000, "GB/s": row["gb_per_s"]}


# Key columns first (what, how long, on Tensor Cores?), the full kernel name last.
TOP_KERNEL_COLUMNS = ["kernel", "time_ms", "count", "tensor_core", "dtype", "category"]


def _kernel_row(row: dict) -> dict:
    return {"kernel": short_kernel_name(row["name"]), "time_ms": row["total_us"] / 1000,
            "count": row["count"], "tensor_core": row["tensor_core"], "dtype": row["dtype"],
            "category": row["category"], "why": row["reason"], "name": row["name"]}


def _could_row(row: dict) -> dict:
    return {"cpu_op": row["cpu_op"], "likely_causes": "; ".join(row["likely_causes"]),
            "without_tensor_cores_ms": row["without_tensor_core_us"] / 1000,
            "share_of_its_matrix_time": _pct(row["without_tensor_core_share"]),
            "dtypes": ", ".join(row["dtypes"]),
            "kernels": ", ".join(short_kernel_name(name) for name in row["kernels"])}


def _op_row(row: dict) -> dict:
    return {"cpu_op": row["cpu_op"], "kernel_ms": row["kernel_us"] / 1000,
            "on_tensor_cores": _pct(row["tensor_core_share"]),
            "matrix_ms": row["matrix_us"] / 1000, "kernels": row["kernel_count"]}


def category_chart(result: dict) -> None:
    categories = {k: v for k, v in (result.get("categories") or {}).items() if v}
    if not categories:
        return
    fig = go.Figure(go.Bar(x=[us / 1000 for us in categories.values()],
                           y=list(categories.keys()), orientation="h"))
    fig.update_layout(title="GPU time per kernel category (ms, summed over streams)", height=320,
                      margin=dict(l=10, r=10, t=40, b=10), yaxis=dict(autorange="reversed"))
    draw_chart(figure=fig, key="kernel_categories")


def gpu_report(result: dict) -> None:
    defects_warning(result)
    verdict_banner(result)
    cols = st.columns(3)
    cols[0].metric("Kernel time (summed)", f"{(result.get('total_kernel_us') or 0) / 1000:,.2f} ms")
    unit = "Matrix Cores" if result.get("vendor") == "amd" else "Tensor Cores"
    cols[1].metric(f"On {unit} (all)", _pct(result.get("tensor_core_share")),
                   help=f"Share of all kernel time in {unit} kernels")
    cols[2].metric(f"On {unit} (matrix)", _pct(result.get("matrix_tensor_core_share")),
                   help=f"Share of gemm + conv + attention kernel time in {unit} kernels")
    capability = result.get("compute_capability")
    device = result.get("device") or "unknown GPU"
    device += f" (compute capability {capability})" if capability else (
        f" (AMD {result['arch']})" if result.get("arch") else "")
    scope = result.get("breakdown_scope") or "every kernel in the trace"
    st.caption(f"{plain(device)}. Kernel time, Tensor-Core shares, categories and the tables below "
               f"cover {scope}.")
    category_chart(result)
    st.subheader("Top kernels")
    top = pd.DataFrame([_kernel_row(row) for row in result.get("top_kernels") or []])
    # What fits 1280 px; the rule that decided each verdict and the full names below it.
    table(top, hide_index=True, key="top_kernels", column_order=TOP_KERNEL_COLUMNS,
                 placeholder=NA,
                 column_config={"time_ms": st.column_config.NumberColumn("time (ms)",
                                                                         format="%.3f"),
                                "tensor_core": st.column_config.TextColumn("Tensor Cores")})
    details("Why each verdict, and the full kernel names", "kernels_why",
            lambda: table(top, hide_index=True, key="top_kernels_why",
                                 column_order=["kernel", "why", "name"], placeholder=NA))
    could = result.get("could_have_didnt") or []
    st.subheader("Could have, didn't")
    if could:
        st.caption("Matrix ops whose kernels ran without Tensor Cores, with the likely cause.")
        for row in could:  # op names and causes come from the trace: plain text
            st.markdown(
                f"- **{plain(row['cpu_op'])}**: {row['without_tensor_core_us'] / 1000:,.3f} ms "
                f"without Tensor Cores ({_pct(row['without_tensor_core_share'])} of its "
                f"matrix time{plain(''.join(', ' + d for d in row['dtypes']))}). "
                f"{plain('; '.join(row['likely_causes']))}"
            )
        details("As a table, with the kernels", "kernels_could_table",
                lambda: table(pd.DataFrame([_could_row(row) for row in could]),
                                     hide_index=True, key="could_have", placeholder=NA))
    else:
        st.caption("No matrix op ran without Tensor Cores in this window.")
    op_rates_section(result)
    details("Per CPU op", "kernels_per_op", lambda: table(
        pd.DataFrame([_op_row(row) for row in result.get("per_op") or []]),
        hide_index=True, key="per_op", placeholder=NA))
    if (result.get("accounting") or {}).get("kind") == "gpu":
        gpu_accounting(result["accounting"])


_WITNESS_TONE = {"confirms": st.success, "decides": st.success, "contradicts": st.warning,
                 "cannot decide": st.info}


def _rate_row(row: dict) -> dict:
    return {"op": row["op"], "shape": row["shape"], "dtype": row["compute_dtype"],
            "calls": row["calls"], "GFLOP/call": row["flops_per_call"] / 1e9,
            "time (ms)": row["kernel_us"] / 1000, "TFLOP/s": row["tflops_per_s"],
            "TB/s": row["tb_per_s"], "FLOP/B": row["flop_per_byte"],
            "of peak": share_text(row["share_of_peak"]) if row["share_of_peak"] else NA,
            "bound": row["bound"] or NA}


def op_rates_section(result: dict) -> None:
    """Per-op FLOPs and achieved rates from the recorded shapes, the roofline, and what the
    arithmetic says about the name-based verdict (engine.traces.op_rates)."""
    st.subheader("How well: per-op FLOPs and rates")
    rows = result.get("op_rates") or []
    witness = result.get("rate_witness")
    if witness:  # op names and shapes come from the trace: plain text
        _WITNESS_TONE.get(witness["witness"], st.info)(plain(witness_sentence(witness)))
    if not rows:
        st.caption(result.get("op_rates_note") or "No op with recorded shapes.")
        return
    basis = rows[0]["time_basis"]
    st.caption(f"FLOPs from the recorded shapes (torch.utils.flop_counter's formulas) over the "
               f"{basis}' time; TFLOP/s is the mean of the calls' rates. 'of peak': the "
               "datasheet peak of the dtype on this device.")
    table(pd.DataFrame([_rate_row(row) for row in rows]), hide_index=True,
                 key="op_rates", placeholder=NA,
                 column_config={name: st.column_config.NumberColumn(name, format=fmt)
                                for name, fmt in (("GFLOP/call", "%.4f"), ("time (ms)", "%.3f"),
                                                  ("TFLOP/s", "%.2f"), ("TB/s", "%.3f"),
                                                  ("FLOP/B", "%.1f"))})
    figure = roofline_figure(rows, result.get("device_spec"))
    if figure is not None:
        draw_chart(figure=figure, key="roofline")


def other_kind_report(result: dict) -> None:
    """A range-profiler or other-accelerator trace: what it is, and its evidence."""
    verdict_banner(result)
    st.caption(f"Trace kind: {plain(result['trace_kind'])}; device: "
               f"{plain(result.get('device') or 'unknown')}.")
    evidence = result.get("range_profiler")
    if evidence and evidence["kernels"]:
        agree = evidence["counters_agree_with_names"]
        st.caption("Matrix kernels with their SASS counters: a matrix kernel that executed no "
                   "FFMA/HFMA/DFMA did its multiply-adds on the Tensor Cores. The counters "
                   + ("agree with" if agree else "contradict" if agree is False
                      else "cannot check") + " the kernel names.")
        table(pd.DataFrame([{
            "kernel": short_kernel_name(k["name"]), "names say": k["name_verdict"],
            "counters say": k["counter_verdict"] or NA, "FFMA": k["ffma"], "HFMA": k["hfma"],
            "dtype": k["dtype"] or NA} for k in evidence["kernels"]]),
            hide_index=True, key="range_kernels", placeholder=NA)


def cpu_accounting(result: dict) -> None:
    """A CPU run's step from its CPU ops' self time: no GPU wording, no cuBLAS tokens."""
    defects_warning(result)
    accounting = result["accounting"]
    verdict_banner({"banner": result.get("banner"), "verdict": {}})
    st.subheader("Where the step's time went (CPU ops, self time)")
    cols = st.columns(3)
    cols[0].metric("Step", _ms(accounting["step_time_us"]))
    # metric labels are Markdown: the op names' underscores would turn to italics
    cols[1].metric("Casts (dtype conversions)", _pct(accounting["cast_share"]),
                   help="Share of the window in the cast ops `aten::to`, `aten::_to_copy` "
                        "and `aten::copy_`")
    cols[2].metric("Outside any op (Python, framework)", _pct(accounting["idle_share"]))
    parts_table(accounting, "cpu_parts")
    steps = accounting["window"]["step_count"]
    if accounting.get("matrix_ops"):
        st.caption(f"Matrix ops and the oneDNN primitive behind them (self time over the whole "
                   f"window, {steps} step(s))")
        table(pd.DataFrame([_ms_columns(row) for row in accounting["matrix_ops"]]),
                     hide_index=True, key="cpu_matrix_ops", placeholder=NA)
    st.caption(f"CPU ops by self time over the whole window ({steps} step(s); the parts table "
               "above is per step)")
    table(pd.DataFrame([_ms_columns(row) for row in accounting["ops"]]),
                 hide_index=True, key="cpu_ops", placeholder=NA)


def _ms_columns(row: dict) -> dict:
    """`*_us` columns as `*_ms` (3 decimals), the unit of every other table here."""
    return {(key[:-3] + "_ms" if key.endswith("_us") else key):
            (round(value / 1000, 3) if key.endswith("_us") and value is not None else value)
            for key, value in row.items()}


def diff_report(diff: dict, files: tuple[str, str] | None = None) -> None:
    """Why B against A: the Amdahl sentence, what to keep in mind, the steps, the parts
    table (the Compare page's and the report's rows), what bounds each, one-sided kernels."""
    # labels are the runs' (user-typed) labels: text, never Markdown
    label_a, label_b = plain(diff["label_a"]), plain(diff["label_b"])
    st.subheader(f"Why B ({label_b}) against A ({label_a})")
    # what differs comes before any ratio: a ratio across models is not a precision's
    st.markdown(f"**A and B differ in:** {plain(differs_words(diff))}")
    if files:
        st.caption(f"A: {plain(files[0])} · B: {plain(files[1])}")
    st.info(plain(diff["sentence"]))
    for caveat in diff.get("caveats") or []:
        show_caveat(caveat)
    cols = st.columns(3)
    cols[0].metric(f"Step, A ({label_a})", _ms(diff["step_time_a_us"]))
    cols[1].metric(f"Step, B ({label_b})", _ms(diff["step_time_b_us"]))
    speedup = diff.get("step_speedup")
    cols[2].metric("B against A (profiled steps)", ratio_text(speedup),
                   help="A's step time over B's: above 1, B is faster")
    table(pd.DataFrame(parts_rows(diff)), hide_index=True, key="diff_parts", placeholder=NA)
    st.caption(f"A is {diff['bound_by_a']['label']}; B is {diff['bound_by_b']['label']}.")
    for key, who in (("only_in_a", "A"), ("only_in_b", "B")):
        if diff[key]:
            st.caption(f"Only in {who} (kernels or ops the other run does not have)")
            table(pd.DataFrame(only_in_rows(diff[key])), hide_index=True,
                         key=f"diff_{key}", placeholder=NA)


def report(result: dict) -> None:
    if result.get("trace_kind") in ("range profiler", "other accelerator"):
        other_kind_report(result)  # no kernel timeline: no step to project
        return
    if (result.get("accounting") or {}).get("kind") == "cpu":
        cpu_accounting(result)
        op_rates_section(result)
    else:
        gpu_report(result)
    projection_block(result)


def projection_block(result: dict, run=None) -> None:
    """What-if (engine.analysis.whatif): the step at another matrix rate, always
    labelled a projection, with what it assumes."""
    st.subheader(WHATIF_TITLE)
    draw_projection(run_projection(dict(result), run, read_cache=False), key="kernels_projection")


UPLOAD_PREFIX = "precision-lab-upload-"  # the temporary copies of uploaded traces
STALE_UPLOAD_S = 3600.0


def _saved_upload(upload) -> str:
    """The upload as a temporary file (the trace reader reads files); the caller removes it
    in a `finally`. A copy left by a server that was killed mid-read is removed by the next
    upload, once it is an hour old."""
    _remove_stale_uploads()
    suffix = ".json.gz" if upload.name.endswith(".gz") else ".json"
    with tempfile.NamedTemporaryFile(prefix=UPLOAD_PREFIX, suffix=suffix, delete=False) as handle:
        try:
            handle.write(upload.getbuffer())
        except BaseException:  # a full temp disk, an interrupted script: no half copy kept
            Path(handle.name).unlink(missing_ok=True)
            raise
    return handle.name


def _remove_stale_uploads() -> None:
    import shutil
    import time

    cutoff = time.time() - STALE_UPLOAD_S
    for leftover in Path(tempfile.gettempdir()).glob("precision-lab-*"):
        try:
            if leftover.lstat().st_mtime < cutoff and leftover.name.startswith(
                    (UPLOAD_PREFIX, "precision-lab-ranks-")):
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink()
        except OSError:
            continue  # another server's, or gone already


def cpu_report(evidence: dict) -> None:
    show = {"native": st.success, "neutral": st.info}.get(verdict_tone(evidence["verdict"]),
                                                           st.warning)
    show(f"**CPU matrix unit: {plain(evidence['headline'])}**")
    st.caption("CPU runs have no GPU kernels; the CPU's evidence is which oneDNN implementation "
               "(and so which ISA) ran each matrix primitive during the profiler window.")
    primitives = evidence.get("primitives") or []
    if primitives:
        table(pd.DataFrame(primitive_summary(primitives)), hide_index=True,
                     key="onednn_primitives", placeholder=NA)
    else:
        st.caption("oneDNN recorded no matrix primitive in the window.")
    by_kind = evidence.get("by_kind") or []  # the verdict's per-kind table (cpu_evidence)
    if by_kind:
        st.caption(f"By kind of op: the implementation that ran most of its time; "
                   f"{share_text(evidence.get('reference_share'))} of the matrix time ran "
                   "oneDNN's reference code.")
        table(pd.DataFrame([{"kind": row["label"], "time_ms": row["exec_ms"],
                                    "share": share_text(row["share"], 1),
                                    "implementation": f"{row['src_dtype']} {row['implementation']}",
                                    "unit": row["unit"]} for row in by_kind]),
                     hide_index=True, key="onednn_by_kind", placeholder=NA)


# A run whose window could not be kept (a full disk) is listed too: its reason is the answer.
runs = [r for r in store.list_runs(limit=500)
        if (store.run_dir(r.id) / TRACE_FILENAME).exists() or r.summary.get("cpu_evidence")
        or r.summary.get("profile_error")]
source = st.radio("Source", ["A run's profiler window", "Upload a trace file",
                            "Upload one job's rank traces"], horizontal=True,
                  key="kernels_source")


def _safe_name(name: str) -> str:
    """The upload's base name with only ordinary characters: its rank may be in it."""
    base = Path(name).name
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)[:120]
    return cleaned or "trace.json"


def _rank_file_row(row: dict) -> dict:
    return {"rank": row["rank"], "trace": row["source"], "steps": row["step_count"],
            "busy (ms)": _ms_or_na(row["busy_us"]), "busy": _pct(row["busy_share"]),
            "world size": row["world_size"] if row["world_size"] is not None else "n/a"}


def _ms_or_na(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1000:,.2f}"


def trace_set_report(result: dict) -> None:
    """One job's ranks side by side (engine.traces.sets)."""
    st.subheader("Ranks side by side")
    st.text(result["sentence"])
    st.caption(
        f"Rank numbers from {result['rank_from']}. Times per step. Idle in step: within the "
        "CPU-side "
        "profiler steps. Idle over GPU span: first to last kernel, the figure "
        "HolisticTraceAnalysis reports. Waiting: communication kernel time beyond the "
        "shortest rank's for the same collective (matched by order and name), time "
        "spent waiting for the other ranks."
    )
    slowest = (result.get("slowest") or {}).get("rank")
    # the columns a person compares fit at 1280 px; the files and totals are one click away
    rows = [{"rank": f"{row['rank']} (slowest)" if row["rank"] == slowest else str(row["rank"]),
             "step (ms)": _ms_or_na(row["step_time_us"]),
             "idle in step": _pct(row["idle_share"]),
             "idle over GPU span": _pct(row["idle_in_gpu_span_share"]),
             "comm. (ms)": _ms_or_na(row["communication_us"]),
             "exposed comm. (ms)": _ms_or_na(row["exposed_communication_us"]),
             "waiting (ms)": _ms_or_na(row.get("waiting_us"))} for row in result["ranks"]]
    table(pd.DataFrame(rows), hide_index=True, key="rank_table", placeholder=NA)
    details("Per-rank files and totals", "kernels_rank_files", lambda: table(
        pd.DataFrame([_rank_file_row(row) for row in result["ranks"]]),
        hide_index=True, key="rank_files", placeholder=NA))
    if result.get("collectives_note"):
        st.caption(plain(result["collectives_note"]))
    skew = result.get("collective_skew")
    if skew:  # collective names come from the traces: plain text
        most = skew["most_often_last"]
        st.caption(plain(
            f"Collective start skew across ranks ({skew['collectives']} matched): median "
            f"{_ms(skew['median_us'])} ms, max {_ms(skew['max_us'])} ms; rank {most['rank']} "
            f"arrived last {most['count']} time(s). Starts are on the traces' own clocks: "
            "ranks on several hosts need them in step."))
        details("The most skewed collectives", "kernels_collective_skew", lambda: table(
            pd.DataFrame([{"collective #": e["index"], "skew (ms)": e["skew_us"] / 1000,
                           "last rank": e["last_rank"], "kernel": short_kernel_name(e["name"])}
                          for e in skew["worst"]]),
            hide_index=True, key="collective_skew", placeholder=NA))
    if result.get("collective_bandwidth"):
        st.caption("Bus bandwidth per collective (nccl-tests' definition, the time of the "
                   "rank that waited least):")
        table(pd.DataFrame([{"collective": row["collective"], "count": row["count"],
                             "median MB": row["median_bytes"] / 1e6,
                             "median bus GB/s": row["median_bus_gb_per_s"],
                             "max bus GB/s": row["max_bus_gb_per_s"]}
                            for row in result["collective_bandwidth"]]),
              hide_index=True, key="collective_bandwidth")
    figure = go.Figure(go.Bar(
        x=[f"rank {row['rank']}" for row in result["ranks"]],
        y=[(row["step_time_us"] or 0) / 1000 for row in result["ranks"]],
        marker_color=["#d62728" if row["rank"] == slowest else "#1f77b4"
                      for row in result["ranks"]],
        hovertemplate="%{x}: %{y:.2f} ms per step<extra></extra>"))
    figure.update_layout(title="Step time per rank (slowest in red)", yaxis_title="ms per step",
                         height=320, margin=dict(t=50, b=40, l=60, r=20))
    draw_chart(figure, key="rank_step_chart")


if source == "Upload one job's rank traces":
    # late: trace_sets is only for this view (it reads several traces)
    from engine.traces.sets import analyze_set, set_members

    uploads = st.file_uploader("The ranks' traces (.json or .json.gz, several files) or one "
                               "zip of them", type=["json", "gz", "zip"],
                               accept_multiple_files=True, key="trace_set_upload")
    if uploads:
        with tempfile.TemporaryDirectory(prefix="precision-lab-ranks-") as folder:
            saved = []
            for index, upload in enumerate(uploads):
                name = _safe_name(upload.name)
                if any(Path(t).name == name for _, t in saved):  # two files of one name
                    name = f"{index}-{name}"
                target = Path(folder) / name
                target.write_bytes(upload.getbuffer())
                saved.append((upload.name, str(target)))
            try:
                with st.spinner("Reading the rank traces..."):
                    trace_set_report(analyze_set(set_members([Path(t) for _, t in saved])))
            except (ValueError, OSError) as exc:
                st.error(plain(_upload_error(exc, saved + [("the upload", folder)],
                                             "Cannot read the rank traces")))
    else:
        st.caption("Several traces of one job (a torchrun or Slurm job writes one per rank): a "
                   "per-rank table, the slowest rank and by how much, and the communication "
                   "time spent waiting for the other ranks.")
    st.stop()

if source == "Upload a trace file":
    upload = st.file_uploader("PyTorch profiler trace (Chrome trace JSON, .json or .json.gz)",
                              type=["json", "gz"], key="trace_upload")
    upload_b = st.file_uploader("Optional: a second trace (B) to compare with the first (A)",
                                type=["json", "gz"], key="trace_upload_b")
    saved = []
    # finally: a rerun or stop interrupts the script with an exception at any st call, and
    # the copies (100 MiB and more) must not outlive it.
    try:
        if upload is not None:
            saved.append((upload.name, _saved_upload(upload)))
            if upload_b is not None:
                saved.append((upload_b.name, _saved_upload(upload_b)))
            chosen_step, parsed_a = None, None
            try:
                parsed_a = load_trace(saved[0][1])  # once: the step view and the diff reuse it
                result = analyze_trace_file(parsed_a)
                chosen_step = step_choice(result, "trace_upload_step")
                if chosen_step is not None:
                    result = analyze_trace_file(parsed_a, step=chosen_step)
                report(result)
            except (ValueError, OSError) as exc:
                st.error(plain(_upload_error(exc, saved, f"Cannot read {upload.name}")))
                upload_b = None  # nothing to compare B with
            if upload_b is not None:
                try:
                    # a chosen step of A is A's side of the comparison too
                    diff_report(explain_diff(parsed_a, saved[1][1], step_a=chosen_step),
                                files=(upload.name, upload_b.name))
                except (ValueError, OSError) as exc:
                    st.error(plain(_upload_error(exc, saved,
                                                 f"Cannot compare with {upload_b.name}")))
    finally:
        for _name, temporary in saved:
            Path(temporary).unlink(missing_ok=True)
    st.stop()

if not runs:
    st.info("No profiled runs yet. Runs profile a short window after warm-up by default.")
    st.stop()

ids = [r.id for r in runs]
url_run = id_in_address("run", warn="kernels_run" not in st.session_state)
if url_run and url_run not in ids and "kernels_run" not in st.session_state:
    # Shown as text: the id comes from the URL.
    st.warning("The run in this page's address has no profiler window here (unknown run, "
               "or not profiled); showing the newest profiled run instead.")
    st.code(url_run, language=None)
wanted = (url_run if url_run in ids and "kernels_run" not in st.session_state
          else st.session_state.get(LIVE_RUN_KEY))
run_id = st.selectbox(
    "Run",
    ids,
    index=ids.index(wanted) if wanted in ids else 0,
    format_func=lambda i: next(
        f"{status_badge(r.status)} · {r.config.label} · {r.id}" for r in runs if r.id == i
    ),
    key="kernels_run",
)
st.query_params["run"] = run_id  # shareable URL for this run's breakdown
try:
    run = store.get_run(run_id)
except RunNotFound:
    st.warning("This run no longer exists.")
    st.stop()

if run.summary.get("profile_error"):
    st.error(f"Profiler: {plain(run.summary['profile_error'])}")
note = window_note(run.summary)  # what the window covers, and whether it represents the run
if note:
    show_caveat(note)
if run.summary.get("gpm_tensor_util_pct") is not None:
    st.metric("Tensor-pipe activity (NVML GPM counter)",
              f"{run.summary['gpm_tensor_util_pct']:.1f} %", help=run.summary.get("gpm_note"))
elif run.summary.get("gpm_note") and run.device_key.startswith("cuda"):
    st.caption(f"Counter-based confirmation (NVML GPM): {plain(run.summary['gpm_note'])}")
trace_path = store.run_dir(run.id) / TRACE_FILENAME
evidence = run.summary.get("cpu_evidence")
if run.device_key.startswith("cuda") and trace_path.exists():
    gpu_result = analyze(str(trace_path), trace_path.stat().st_mtime_ns)
    chosen_step = step_choice(gpu_result, "kernels_step")
    if chosen_step is not None:
        gpu_result = analyze(str(trace_path), trace_path.stat().st_mtime_ns, None, chosen_step)
    if gpu_result.get("trace_kind") in ("range profiler", "other accelerator"):
        other_kind_report(gpu_result)
    else:
        gpu_report(gpu_result)
        projection_block(gpu_result, run)
elif evidence:
    cpu_report(evidence)
if not run.device_key.startswith("cuda") and trace_path.exists():
    cpu_result = analyze(str(trace_path), trace_path.stat().st_mtime_ns,
                         json.dumps(evidence) if evidence else None)
    cpu_accounting(cpu_result)
    op_rates_section(cpu_result)
    projection_block(cpu_result, run)
rank_traces = run_rank_traces(store, run)
if rank_traces:
    try:
        trace_set_report(analyze_rank_set(
            tuple((label, str(path)) for label, path in rank_traces),
            max(path.stat().st_mtime_ns for _, path in rank_traces)))
    except (ValueError, OSError) as exc:  # a rank's trace unreadable: said, the page stays
        st.error(plain(f"Ranks side by side: {exc}"))
if trace_path.exists():
    others = [r for r in runs if r.id != run.id and (store.run_dir(r.id) / TRACE_FILENAME).exists()]
    other_id = st.selectbox(
        "Compare with another run's window (B)",
        [None] + [r.id for r in others],
        format_func=lambda i: (
            "nothing"
            if i is None
            else next(f"{r.config.label} · {r.id}" for r in others if r.id == i)
        ),
        key="kernels_compare_run",
    )
    if other_id is not None:
        other = next(r for r in others if r.id == other_id)
        diff = compare_runs(str(store.home), run.id, other.id, run.ended_at, other.ended_at)
        if diff and diff.get("error"):  # e.g. a GPU run against a CPU run: the message says so
            st.error(plain(diff["error"]))
        elif diff:
            diff_report(diff)
    st.download_button("Download trace (open in Perfetto or chrome://tracing)",
                       data=trace_path.read_bytes(), file_name=f"{run.id}-{TRACE_FILENAME}",
                       mime="application/gzip", key="download_trace")
