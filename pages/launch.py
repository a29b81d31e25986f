"""Launch: pick a model, a precision and a batch size; start a run in the background."""

from __future__ import annotations

import os

import streamlit as st

from engine.admission import check_parallel, max_procs_for
from engine.analysis.cpu_evidence import mode_words
from engine.architectures import HOME_MADE_TASKS, IMAGE, is_token_model, missing_extra, task_of
from engine.config import (
    MAX_SPEEDUP_MODES,
    PRECISION_LABELS,
    CommHook,
    ConfigError,
    DataMode,
    ModelName,
    ModelSize,
    OptimizerName,
    Precision,
    RunConfig,
    Sharding,
    choices,
    field_doc,
)
from engine.hardware.devices import UNSUPPORTED, mode_support
from engine.presets import (
    COMPARISON_PRESET,
    INPUT_PIPELINE_WORKERS,
    input_pipeline_configs,
    launch_many,
)
from engine.store import RunNotFound, StoreError
from engine.workloads import WORKLOADS_ENV, discover_workloads, workloads_dir
from pages.ui import (
    PREFILL_KEY,
    RELAUNCHED_KEY,
    NumberInputs,
    address_text,
    cached_devices,
    details,
    ensure_app_shell,
    get_store,
    id_in_address,
    open_in_live,
    plain,
)

ensure_app_shell()  # before drawing anything: see pages/ui.py

DEFAULTS = RunConfig()

st.title("Launch a run")
st.caption("Trains in a background process: closing this tab does not stop it. "
           "Nothing is downloaded: models are built with random weights, and data is "
           "synthetic on the device or read from files already on this machine.")

store = get_store()
devices = cached_devices()
device_keys = ["auto"] + [d.key for d in devices]
by_key = {d.key: d for d in devices}

# RunConfig field -> the key of its input below ("Re-launch with this config" fills them).
FORM_KEYS = {
    "device": "device", "model": "model", "size": "size", "precision": "precision",
    "batch_size": "batch_size", "steps": "steps", "lr": "lr", "optimizer": "optimizer",
    "seed": "seed", "seq_len": "seq_len", "image_size": "image_size",
    "channels_last": "channels_last", "compile": "compile", "nprocs": "nprocs",
    "sharding": "sharding", "comm_hook": "comm_hook", "loss_scaling": "loss_scaling",
    "grad_scaler_init_scale": "init_scale", "grad_scaler_growth_interval": "growth",
    "log_interval": "log_interval", "warmup_steps": "warmup_steps", "profile": "profile",
    "profile_steps": "profile_steps", "numerics": "numerics", "memory_cap_mb": "memory_cap_mb",
    "name": "name", "workload": "workload", "data": "data", "num_workers": "num_workers",
    "pin_memory": "pin_memory", "persistent_workers": "persistent_workers",
    "prefetch_factor": "prefetch_factor",
}
FLOAT_FIELDS = ("lr", "grad_scaler_init_scale")
# Your own workloads: only files in the folder PRECISION_LAB_WORKLOADS names (listed, not
# imported, here); never a path typed or uploaded in the browser.
WORKLOAD_FILES = discover_workloads()


def model_choice_label(name: str) -> str:
    """A model choice, marked (not selectable in effect) when it cannot run here."""
    if name == ModelName.CUSTOM.value:
        return "custom: your own workload" + ("" if WORKLOAD_FILES else " (none configured)")
    return name + (" (needs the models extra)" if missing_extra(name) else "")


def model_unavailable(name: str) -> str | None:
    """Why `name` cannot be launched from here, or None."""
    if name == ModelName.CUSTOM.value and not WORKLOAD_FILES:
        folder = workloads_dir()
        where = f"no workload files found in {folder}" if folder else f"{WORKLOADS_ENV} is not set"
        return (f"{where}: set {WORKLOADS_ENV} to a folder of workload files before starting "
                "the app (docs/workloads.md; e.g. examples/workloads)")
    return missing_extra(name)


def workload_choice(name: str) -> str:
    """The custom workload picked from the configured folder ("" for other models)."""
    if name != ModelName.CUSTOM.value or not WORKLOAD_FILES:
        return ""
    by_path = {w.path: w for w in WORKLOAD_FILES}
    return st.selectbox("Workload", list(by_path), key="workload", help=field_doc("workload"),
                        format_func=lambda path: f"{by_path[path].name}"
                        + (f": {by_path[path].summary}" if by_path[path].summary else ""))


RELAUNCH_PARAM = "relaunch"  # /?relaunch=RUN_ID: the form filled from that run (shareable)


def _prefill_from_url() -> dict | None:
    """The run named in the address, once per session and id: a shared Re-launch link."""
    wanted = st.query_params.get(RELAUNCH_PARAM)
    if not wanted or st.session_state.get(RELAUNCHED_KEY) == wanted:
        return None
    st.session_state[RELAUNCHED_KEY] = wanted
    if id_in_address(RELAUNCH_PARAM) is None:  # malformed: named as text there
        return None
    try:
        run = store.get_run(wanted)
    except RunNotFound:
        st.warning("The run in this page's address does not exist here (deleted, or from "
                   "another data directory): nothing was filled in.")
        st.code(address_text(wanted), language=None)  # as text: it comes from the URL
        return None
    return {"run_id": run.id, "config": run.config.to_dict()}


def apply_prefill() -> str | None:
    """Copy a re-launched run's config into the inputs, once; the source run id."""
    prefill = st.session_state.pop(PREFILL_KEY, None) or _prefill_from_url()
    if not prefill:
        return None
    for field_name, value in prefill["config"].items():
        key = FORM_KEYS.get(field_name)
        if key is None:
            continue
        if field_name == "device" and value not in device_keys:
            value = "auto"  # e.g. a GPU this machine does not have
        if field_name == "workload" and value not in {w.path for w in WORKLOAD_FILES}:
            continue  # not offered here (another folder): the user picks one
        st.session_state[key] = (float(value) if field_name in FLOAT_FIELDS
                                 else NumberInputs.state_value(field_name, value))
    return prefill["run_id"]


prefilled_from = apply_prefill()
if prefilled_from:
    st.info(f"Filled in from run `{prefilled_from}`: change anything, then launch.")
default_device = next((d.key for d in devices if d.kind == "cuda" and d.torch_usable), "cpu")

numbers = NumberInputs()  # out-of-range entries are named and disable the buttons below
left, right = st.columns(2)
with left:
    device_choice = st.selectbox(
        "Device", device_keys, index=0, key="device",
        format_func=lambda k: f"auto ({by_key[default_device].name})" if k == "auto"
        else f"{k}: {by_key[k].name}", help=field_doc("device"))
    device = by_key[default_device if device_choice == "auto" else device_choice]
    model = st.selectbox("Model", choices(ModelName), key="model", help=field_doc("model"),
                         index=choices(ModelName).index(DEFAULTS.model),
                         format_func=model_choice_label)
    model_problem = model_unavailable(model)
    if model_problem:
        st.error(f"**{model}** cannot run here: {plain(model_problem)}")
    workload = workload_choice(model)
    size = st.selectbox("Size", choices(ModelSize), key="size", help=field_doc("size"),
                        disabled=model not in HOME_MADE_TASKS)
    support = {mode: mode_support(device, Precision(mode)) for mode in choices(Precision)}
    # the one wording of each mode here (a CPU's: flags apart from its oneDNN probe)
    meaning = {mode: mode_words(device, mode) for mode in choices(Precision)}
    precision = st.selectbox(
        "Precision", choices(Precision), key="precision",
        index=choices(Precision).index(DEFAULTS.precision),
        # The status in words: a select box draws no colour, and a glyph needs an emoji font.
        format_func=lambda m: PRECISION_LABELS[Precision(m)]
        + (" (not on this device)" if support[m].status == UNSUPPORTED
           else f" ({meaning[m]['badge']})"))
    batch_size = numbers.number("Batch size", "batch_size", step=1, value=DEFAULTS.batch_size,
                                key="batch_size", help=field_doc("batch_size"))
    steps = numbers.number("Steps", "steps", step=10, value=DEFAULTS.steps, key="steps",
                           help=field_doc("steps"))
with right:
    lr = numbers.number("Learning rate", "lr", value=DEFAULTS.lr, format="%.5f", step=1e-4,
                        key="lr", help=field_doc("lr"))
    optimizer = st.selectbox("Optimizer", choices(OptimizerName), key="optimizer")
    seed = numbers.number("Seed", "seed", value=0, step=1, key="seed")
    seq_len, image_size, channels_last = DEFAULTS.seq_len, DEFAULTS.image_size, False
    if is_token_model(model) or model == ModelName.CUSTOM.value:
        seq_len = numbers.number("Sequence length (tokens)", "seq_len",
                                 value=DEFAULTS.seq_len, step=8, key="seq_len")
    if task_of(model) == IMAGE or model == ModelName.CUSTOM.value:
        image_size = numbers.number("Image size (px)", "image_size",
                                    value=DEFAULTS.image_size, step=8, key="image_size")
        channels_last = st.checkbox("channels_last memory format", key="channels_last",
                                    help=field_doc("channels_last"))
    compile_model = st.checkbox("torch.compile", key="compile", help=field_doc("compile"))

usable_gpus = [d.key for d in devices if d.kind == "cuda" and d.torch_usable]
max_procs = max_procs_for(device, usable_gpus, os.cpu_count())
_procs_typed = str(st.session_state.get("nprocs", "1")).strip()
if _procs_typed.isdigit() and int(_procs_typed) > max_procs:
    st.session_state["nprocs"] = str(max_procs)  # e.g. after switching to a smaller device
procs_col, sharding_col, hook_col = st.columns(3)
with procs_col:
    nprocs = numbers.number("Processes", "nprocs", high=max_procs, value=1, step=1,
                            key="nprocs",
                            help=f"{field_doc('nprocs')} Up to {max_procs} on {device.name}.")
single_process = int(nprocs) == 1
why_disabled = "Applies to runs with 2 or more processes." if single_process else ""
with sharding_col:
    sharding = st.selectbox("Sharding", choices(Sharding), key="sharding",
                            disabled=single_process,
                            help=why_disabled or field_doc("sharding"))
with hook_col:
    comm_hook = st.selectbox("Gradient communication", choices(CommHook), key="comm_hook",
                             disabled=single_process,
                             format_func=lambda h: "fp32 (no compression)" if h == "none" else h,
                             help=why_disabled or field_doc("comm_hook"))
if single_process:
    sharding, comm_hook = Sharding.DDP.value, CommHook.NONE.value
    st.caption("Sharding and gradient communication apply to runs with 2 or more processes "
               "(torchrun; one per GPU, or gloo processes on a CPU).")

with st.expander("Input pipeline"):
    data = st.radio("Batches", choices(DataMode), key="data", horizontal=True,
                    help=field_doc("data"))
    num_workers, pin_memory, persistent_workers = 0, False, False
    prefetch_factor = DEFAULTS.prefetch_factor
    if data == DataMode.LOADER.value:
        pipe_left, pipe_right = st.columns(2)
        with pipe_left:
            num_workers = numbers.number("DataLoader workers", "num_workers", step=1, value=0,
                                         key="num_workers", help=field_doc("num_workers"))
            prefetch_factor = numbers.number("Prefetch factor (batches per worker)",
                                             "prefetch_factor", step=1,
                                             value=DEFAULTS.prefetch_factor,
                                             key="prefetch_factor",
                                             help=field_doc("prefetch_factor"))
        with pipe_right:
            pin_memory = st.checkbox("pin_memory", key="pin_memory",
                                     help=field_doc("pin_memory"))
            persistent_workers = st.checkbox("persistent_workers", key="persistent_workers",
                                             help=field_doc("persistent_workers"))
    else:
        st.caption("Synthetic batches are made on the device: no input pipeline at all. "
                   "Choose loader for real files through a DataLoader (stdlib text, JPEGs).")

with st.expander("Loss scaling, logging and profiling"):
    loss_scaling = st.checkbox("Loss scaling (GradScaler) for fp16-amp", value=True,
                               key="loss_scaling", help=field_doc("loss_scaling"))
    init_scale = numbers.number("GradScaler initial scale", "grad_scaler_init_scale", low=1.0,
                                value=DEFAULTS.grad_scaler_init_scale, step=1024.0,
                                key="init_scale")
    growth_interval = numbers.number("GradScaler growth interval (steps)",
                                     "grad_scaler_growth_interval", step=100,
                                     value=DEFAULTS.grad_scaler_growth_interval, key="growth")
    log_interval = numbers.number("Log every N steps", "log_interval", step=1,
                                  value=DEFAULTS.log_interval, key="log_interval",
                                  help=field_doc("log_interval"))
    warmup_steps = numbers.number("Warm-up steps (excluded from averages)", "warmup_steps",
                                  step=1, value=DEFAULTS.warmup_steps, key="warmup_steps")
    profile = st.checkbox("Profile a window of steps (kernel breakdown)", value=True,
                          key="profile", help=field_doc("profile"))
    profile_steps = numbers.number("Profiler window (steps)", "profile_steps", step=1,
                                   value=DEFAULTS.profile_steps, key="profile_steps")
    numerics = st.checkbox("Record numerics (gradient/activation ranges vs fp16/bf16)",
                           value=False, key="numerics", help=field_doc("numerics"))
    memory_cap_mb = numbers.number("CPU memory cap (MiB, 0 = none)", "memory_cap_mb", step=256,
                                   value=0, key="memory_cap_mb",
                                   help=field_doc("memory_cap_mb"))
    name = st.text_input("Label (optional)", max_chars=80, key="name")

chosen = support[precision]
chosen_words = meaning[precision]
# What this device does with the mode comes first; fp8 tuning advice only after it (and,
# where fp8 cannot run at all, as a note for the GPU it would run on).
if chosen.status == UNSUPPORTED:
    st.error(f"**{precision}** cannot run on {plain(device.name)}: {plain(chosen.reason)}")
elif chosen.status != "native" or chosen_words["tone"] == "emulated":
    st.warning(f"**{precision}** on {plain(device.name)} is {chosen_words['badge']}: "
               f"{plain(chosen_words['words'])}")
else:
    st.info(f"**{precision}** on {plain(device.name)}: {plain(chosen_words['words'])}")
if precision == Precision.FP8.value:
    from engine.training.fp8_advice import fp8_advice  # the model's GEMM shapes import torch

    try:
        advice = fp8_advice(RunConfig(model=model, size=size, precision=precision,
                                      batch_size=int(batch_size), seq_len=int(seq_len),
                                      image_size=int(image_size)))
    except ConfigError:
        advice = None
    if advice and chosen.status == UNSUPPORTED:
        st.caption(f"On an fp8-capable GPU, fp8 may not pay here: {advice}")
    elif advice:
        st.warning(f"fp8 may not pay here: {advice}")


def build_config(precision_value: str) -> RunConfig:
    return RunConfig(
        model=model, size=size, precision=precision_value, batch_size=int(batch_size),
        steps=int(steps), lr=float(lr), optimizer=optimizer, seed=int(seed),
        device=device_choice, seq_len=int(seq_len), image_size=int(image_size),
        channels_last=bool(channels_last), compile=bool(compile_model),
        grad_scaler_init_scale=float(init_scale),
        grad_scaler_growth_interval=int(growth_interval), loss_scaling=bool(loss_scaling),
        log_interval=int(log_interval), warmup_steps=int(warmup_steps), profile=bool(profile),
        profile_steps=int(profile_steps), numerics=bool(numerics),
        memory_cap_mb=int(memory_cap_mb), name=name.strip(), nprocs=int(nprocs),
        sharding=sharding, comm_hook=comm_hook, workload=workload, data=data,
        num_workers=int(num_workers), pin_memory=bool(pin_memory),
        persistent_workers=bool(persistent_workers), prefetch_factor=int(prefetch_factor))


def parallel_problem() -> ConfigError | None:
    """Multi-process choices this machine refuses, shown before the button (not after)."""
    if single_process:
        return None
    try:
        warnings = check_parallel(build_config(precision), device, usable_gpus, os.cpu_count())
    except ConfigError as exc:
        st.error(f"**{exc.field}** = {plain(repr(exc.value))}: {plain(exc.fix)}")
        return exc
    for warning in warnings:
        st.caption(warning)
    return None


parallel_error = parallel_problem()


def launch_all(precisions: tuple[str, ...]) -> list[str]:
    return launch_configs(lambda: [build_config(p) for p in precisions])


def launch_configs(make_configs) -> list[str]:
    """Build and validate every config first, so a preset launches all of its runs or none;
    a refusal is shown as the field, the value and the fix."""
    try:
        return launch_many(make_configs(), store)
    except ConfigError as exc:
        st.error(f"Not launched. **{exc.field}** = {plain(repr(exc.value))}: {plain(exc.fix)}")
        return []
    except StoreError as exc:
        st.error(f"Not launched: {plain(exc)}")
        return []


if numbers.problems:
    st.error("Not launchable until these are in range: " + "; ".join(numbers.problems))
inputs_ok = not numbers.problems and model_problem is None
col_launch, col_preset = st.columns(2)
with col_launch:
    if st.button("Launch run", type="primary",
                 disabled=chosen.status == UNSUPPORTED or parallel_error is not None
                 or not inputs_ok,
                 key="launch", width="stretch"):
        run_ids = launch_all((precision,))
        if run_ids:
            open_in_live(run_ids[0])
with col_preset:
    preset_runnable = (all(support[p].status != UNSUPPORTED for p in COMPARISON_PRESET)
                       and parallel_error is None and inputs_ok)
    if st.button("Compare preset: fp32, fp16-amp, bf16-amp (queued in turn)",
                 key="preset", disabled=not preset_runnable, width="stretch",
                 help="Queues the same model and batch size at the three classic precisions; "
                      "they run one after another on this device so their numbers are fair."):
        run_ids = launch_all(COMPARISON_PRESET)
        if run_ids:
            st.session_state["preset_run_ids"] = run_ids
            open_in_live(run_ids[0])
workers_text = " / ".join(map(str, INPUT_PIPELINE_WORKERS))
if st.button(f"Input pipeline what-if: DataLoader workers {workers_text} at {precision} "
             "(queued in turn)", key="pipeline_preset", width="stretch",
             disabled=chosen.status == UNSUPPORTED or parallel_error is not None or not inputs_ok,
             help="The same model and precision through the DataLoader with each worker count; "
                  "Live shows how much of each step waits for data."):
    run_ids = launch_configs(lambda: input_pipeline_configs(build_config(precision)))
    if run_ids:
        st.session_state["preset_run_ids"] = run_ids
        open_in_live(run_ids[0])

st.subheader("Speedup check")
st.caption("What a precision buys on this machine, with its uncertainty: the modes run "
           "interleaved in one process (short blocks in turn, same weights and batches), so "
           "load that comes and goes hits them alike. Each speedup comes with a 95 % "
           "interval; a difference is claimed only when the interval excludes 1.0 on a quiet "
           "machine (busy: inconclusive). The A/A check runs the baseline against itself "
           "to check the method here. Uses the model, size, batch and device above.")
runnable_modes = [m for m in choices(Precision) if support[m].status != UNSUPPORTED]
check_left, check_right = st.columns(2)
with check_left:
    check_modes = st.multiselect(
        "Modes to compare (first = baseline)", runnable_modes, key="speedup_modes",
        default=[m for m in ("fp32", "bf16-amp", "fp16-amp") if m in runnable_modes],
        max_selections=MAX_SPEEDUP_MODES,
        help=f"2 to {MAX_SPEEDUP_MODES} modes; modes this device cannot run are not offered.")
with check_right:
    check_budget_s = numbers.number("Time budget (s)", "speedup_budget_s", step=10.0,
                                    value=DEFAULTS.speedup_budget_s, key="speedup_budget_s",
                                    help=field_doc("speedup_budget_s"))
    check_target_pct = numbers.number("Stop at interval half-width (%)", "speedup_target_pct",
                                      step=0.5, value=DEFAULTS.speedup_target_pct,
                                      key="speedup_target_pct",
                                      help=field_doc("speedup_target_pct"))
check_problem = ("Choose at least 2 modes." if len(check_modes) < 2 else
                 "A speedup check runs in one process: set Processes to 1."
                 if not single_process else None)
if check_problem:
    st.caption(check_problem)


def _launch_check(modes: list[str]) -> None:
    check_ids = launch_configs(lambda: [build_config(modes[0]).replace(
        speedup_modes=",".join(modes), speedup_budget_s=float(check_budget_s),
        speedup_target_pct=float(check_target_pct), profile=False, numerics=False)])
    if check_ids:
        open_in_live(check_ids[0])


run_col, aa_col = st.columns([2, 1])
with run_col:
    if st.button("Run speedup check", key="speedup_check", width="stretch",
                 disabled=check_problem is not None or not inputs_ok):
        _launch_check(check_modes)
aa_baseline = check_modes[0] if check_modes else None
with aa_col:
    # The method checked on itself: the baseline against a second copy of itself. A
    # sound check says "no measurable difference" (or "inconclusive" when busy) in at
    # least 95 % of such checks.
    if st.button(f"A/A check ({aa_baseline or 'baseline'} vs itself)", key="speedup_aa_check",
                 width="stretch",
                 disabled=aa_baseline is None or not single_process or not inputs_ok,
                 help="Runs the first mode twice, as two copies interleaved like any check: "
                      "it should find no difference. Checks the method on this machine."):
        _launch_check([aa_baseline, aa_baseline])

# Built only while open: a table is Streamlit's first use of pandas, and importing it is
# 0.4 s of a new server's first page (Launch, usually) on a 2-core machine.
details(f"Precision modes on {plain(device.name)}", "launch_mode_table",
        lambda: st.table([{"mode": m, "status": meaning[m]["badge"], "why": meaning[m]["words"]}
                          for m in support]))
