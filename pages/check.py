"""GPU check: is each precision as fast as this hardware should be, and did the matrix
work run on Tensor Cores? On a machine without a GPU it is the CPU check, and says so.

The check runs in a child process (engine.diagnostics.check.run_check_subprocess): the server keeps
no CUDA context or test buffers, and the page only draws the result.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.diagnostics.check import CheckFailed, run_check_subprocess
from engine.display import NA, memory_text
from pages.plot_view import draw_chart
from pages.ui import cached_devices, details, ensure_app_shell, plain

ensure_app_shell()  # before drawing anything: see pages/ui.py

VERDICT_BADGES = {"ok": "ok", "slow": "slow", "not supported": "not supported",
                  "skipped": "skipped"}  # words: the table's colour (VERDICT_COLOURS) says the rest
VERDICT_COLOURS = {"ok": "#d4edda", "slow": "#fff3cd", "not supported": "#e2e3e5",
                   "skipped": "#e2e3e5"}
RESULTS_KEY = "check_results"  # {device_key: result dict}


@st.cache_resource(show_spinner=False)
def gpu_absence_reason() -> str | None:
    from engine.diagnostics.check import no_gpu_reason

    return no_gpu_reason()


def device_label(dev) -> str:
    return f"{dev.name} ({dev.key}, {dev.capability})"


def busy_runs(device_key: str) -> list[str]:
    """Runs training on this device now: they and the check would skew each other."""
    from pages.ui import get_store

    try:
        return [run.id for run in get_store().list_runs(statuses=("running",))
                if run.device_key == device_key]
    except Exception:  # the store is optional for this page
        return []


def _peak_kept_text(record: dict | None) -> str:
    """Whether this measurement became the peak MFU is relative to, and why not."""
    if not record:
        return ""
    if record.get("kept"):
        return "kept (quiet)"
    return f"not kept: {record.get('not_kept_because') or 'unknown'}"


def lines_frame(result: dict) -> pd.DataFrame:
    rows = []
    for line in result["lines"]:
        rows.append({
            "verdict": VERDICT_BADGES.get(line["verdict"], line["verdict"]),
            "test": line["test"], "dtype": line["dtype"] or "",
            "achieved": line["value"], "unit": line["unit"], "peak": line["peak"],
            "% of peak": line["ratio_to_peak"] * 100 if line["ratio_to_peak"] is not None else None,
            "× fp32": line["speedup_vs_fp32"],
            "Tensor Cores": line.get("tensor_core") or "",
            "MFU peak": _peak_kept_text(line.get("peak_record")),
            "reason": line["reason"], "_verdict": line["verdict"],
        })
    return pd.DataFrame(rows)


def styled(frame: pd.DataFrame):
    colours = frame["_verdict"].map(VERDICT_COLOURS).fillna("")
    shown = frame.drop(columns=["_verdict"])
    return shown.style.apply(lambda col: [f"background-color: {c}" for c in colours],
                             subset=["verdict"]).format(
        {"achieved": "{:,.4g}", "peak": "{:,.4g}", "% of peak": "{:.0f}%", "× fp32": "{:.3g}"},
        na_rep="–")


def achieved_vs_peak_figure(result: dict) -> go.Figure | None:
    lines = [line for line in result["lines"]
             if line["test"] == "matmul" and line["value"] is not None]
    if not lines:
        return None
    unit = lines[0]["unit"]
    dtypes = [line["dtype"] for line in lines]
    fig = go.Figure()
    fig.add_bar(name="achieved", x=dtypes, y=[line["value"] for line in lines],
                text=[f"{line['value']:,.3g}" for line in lines], textposition="outside")
    if any(line["peak"] for line in lines):
        is_cpu = result["device"].get("kind") == "cpu"  # a CPU's peak is its ISA peak
        fig.add_bar(name="ISA peak" if is_cpu else "datasheet peak", x=dtypes,
                    y=[line["peak"] for line in lines], marker_color="lightgray")
    values = [line["value"] for line in lines if line["value"]]
    log_y = len(values) > 1 and max(values) / max(min(values), 1e-12) > 20
    fig.update_layout(barmode="group", height=360, margin=dict(l=10, r=10, t=40, b=10),
                      title=f"Matmul throughput ({unit})" + (", log scale" if log_y else ""),
                      yaxis_title=unit, yaxis_type="log" if log_y else "linear")
    return fig


def show_nvml(result: dict) -> None:
    nvml = result.get("nvml")
    if not nvml:
        st.info(f"NVML not available: {plain(result.get('nvml_reason') or 'unknown reason')}")
        return
    clocks = nvml.get("clocks_mhz") or {}
    cols = st.columns(4)
    cols[0].metric("SM clock", f"{clocks.get('sm') or 'n/a'} MHz",
                   help=f"max {clocks.get('max_sm') or 'n/a'} MHz")
    cols[1].metric("Power", f"{_n(nvml.get('power_w'))} W",
                   help=f"enforced limit {_n(nvml.get('power_limit_w'))} W")
    cols[2].metric("Temperature", f"{_n(nvml.get('temp_c'))} °C",
                   help=f"slowdown at {nvml.get('temp_slowdown_c') or 'n/a'} °C")
    cols[3].metric("Memory used", memory_text(nvml.get("gpu_mem_used_bytes")))
    reasons = nvml.get("throttle_reasons")
    if nvml.get("throttled"):
        st.warning(f"Clocks held down: {', '.join(reasons)}")
    else:
        st.caption(f"Throttle reasons: {', '.join(reasons) if reasons else 'none'}")
    if nvml.get("ecc_errors"):
        st.caption(f"ECC errors: {nvml['ecc_errors']}")
    details("Full NVML snapshot", "check_nvml_json", lambda: st.json(nvml))


def _kernel_evidence(line: dict) -> None:
    st.dataframe(pd.DataFrame(line["kernels"]), hide_index=True, width="stretch", placeholder=NA)
    if line.get("gpm_note"):
        st.caption(f"NVML GPM: {line['gpm_note']}")


def cpu_evidence(result: dict, lines: list[dict]) -> None:
    """Per dtype, the oneDNN implementation that ran its matmul and convolution in the
    probe (engine.diagnostics.onednn_probe), as a GPU check shows kernel names."""
    st.subheader("oneDNN evidence")
    st.caption("Which oneDNN implementation ran a small matmul and a convolution forward + "
               "backward in each dtype on this CPU (oneDNN's verbose report): the flags say "
               "what the CPU could do, this says what it did.")
    if result.get("onednn_probe_error"):
        st.warning(plain(result["onednn_probe_error"]))
    for line in lines:
        title = f"{line['dtype']}: " + ("reference code or far slower than fp32"
                                        if line.get("cpu_tone") == "emulated"
                                        else "oneDNN implementations")
        details(title, f"check_onednn_{line['dtype']}", lambda line=line: st.dataframe(
            pd.DataFrame(line["kernels"]).drop(columns=["tensor_core"], errors="ignore"),
            hide_index=True, width="stretch", placeholder=NA))


def _n(value) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def show_result(result: dict) -> None:
    verdicts = [line["verdict"] for line in result["lines"]]
    cols = st.columns(4)
    for col, verdict in zip(cols, ("ok", "slow", "not supported", "skipped")):
        col.metric(VERDICT_BADGES[verdict], verdicts.count(verdict))
    st.caption(f"{plain(result['device']['name'])} · checked in {result['elapsed_s']:.1f} s "
               f"(budget {result.get('time_budget_s', 0):.0f} s) · slow = under half the "
               "datasheet peak, or emulated, or matrix work off the Tensor Cores")
    st.dataframe(styled(lines_frame(result)), hide_index=True, width="stretch", placeholder=NA)
    figure = achieved_vs_peak_figure(result)
    if figure is not None:
        draw_chart(figure, key="check_peak_bars")
        if not any(line["peak"] for line in result["lines"]):
            st.caption("No datasheet peak for this device: the bars compare the dtypes with "
                       "each other (a CPU's real peak is what it measures).")
        elif result["device"].get("kind") == "cpu":
            peak_source = next((line.get("peak_source") for line in result["lines"]
                                if line.get("peak_source")), "")
            st.caption(plain(f"The peak is this CPU's {peak_source}, the one Live's MFU "
                             "uses."))
    kernel_lines = [line for line in result["lines"] if line.get("kernels")]
    if kernel_lines and result["device"].get("kind") == "cpu":
        cpu_evidence(result, kernel_lines)
    elif kernel_lines:
        st.subheader("Kernel evidence")
        for line in kernel_lines:
            details(f"{line['dtype']}: Tensor Cores {line.get('tensor_core', 'unknown')}"
                    + (f" · GPM tensor util {line['gpm_tensor_util_pct']:.0f}%"
                       if line.get("gpm_tensor_util_pct") is not None else ""),
                    f"check_kernels_{line['dtype']}", lambda line=line: _kernel_evidence(line))
    st.subheader("NVML snapshot")
    show_nvml(result)


# ---------------------------------------------------------------------------------------
# page

st.title("GPU check")
devices = list(cached_devices())
usable_gpus = [d for d in devices if d.kind == "cuda" and d.torch_usable]
if not usable_gpus:
    st.info(f"**No GPU on this machine, so this is the CPU check.** Why: "
            f"{gpu_absence_reason() or 'no CUDA device found'}. It measures fp32, bf16 and "
            "fp16 matmuls and memory bandwidth on the CPU and says which precisions are "
            "native and which are emulated.")
else:
    st.caption("Matmul microbenchmarks per precision against the datasheet peak, the kernel "
               "names that prove Tensor Cores ran them, memory bandwidth and an NVML snapshot.")

choices = [d for d in devices if d.kind == "cpu" or d.torch_usable]
default_index = choices.index(usable_gpus[0]) if usable_gpus else 0
device = st.selectbox("Device", choices, index=default_index, format_func=device_label)
budget_s = st.slider("Time budget (s)", min_value=10, max_value=120, value=45, step=5,
                     help="Upper bound for the whole check; most devices finish well inside it.")
busy = busy_runs(device.key)
if busy:
    st.warning(f"Run {', '.join(busy)} is training on {device.key}: the check and the run "
               "would share the device and both numbers would be off. Wait, or stop it first.")

results = st.session_state.setdefault(RESULTS_KEY, {})
if st.button("Run check", type="primary"):
    bar = st.progress(0.0, text="starting the check process…")
    try:
        results[device.key] = run_check_subprocess(
            device.key, progress=lambda fraction, message: bar.progress(fraction, text=message),
            time_budget_s=budget_s)
        bar.progress(1.0, text="done")
    except CheckFailed as exc:
        bar.empty()
        st.error(str(exc))

if device.key in results:
    show_result(results[device.key])
else:
    st.caption("Press **Run check** to measure this device.")
