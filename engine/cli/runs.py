"""The run commands: run (foreground), launch (background), show, list, stop, maxbatch.

Every RunConfig field is an option (generated from the dataclass, so the CLI never lags
the config); a bad value exits 2 naming the flag (engine.cli.errors).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Any

from engine.admission import check_runnable
from engine.analysis.memory_peaks import memory_peaks
from engine.analysis.runs import (
    RunFilter,
    filter_runs,
    parse_tag_filter,
    progress_text,
    tags_text,
)
from engine.analysis.stall import silent_s, stall_of, stall_words
from engine.cli.errors import EXIT_OK, EXIT_RUN_FAILED, UsageError, flag_for, typed
from engine.cli.standby import running_note
from engine.config import (
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
from engine.display import (
    NA,
    PROCESS_PEAK_NAME,
    TENSOR_PEAK_NAME,
    loss_scale_text,
    loss_text,
    memory_split_text,
    memory_text,
    mfu_text,
    step_time_text,
    throughput_text,
)
from engine.run.batch_search import find_max_batch
from engine.run.launcher import launch, reconcile, stop
from engine.schema import (
    FINAL_STATUSES,
    FINISHED,
    STATUSES,
    throughput_column,
    throughput_unit,
)
from engine.store import Store, validate_run_id

_ENUM_CHOICES = {"model": ModelName, "size": ModelSize, "precision": Precision,
                 "optimizer": OptimizerName, "sharding": Sharding, "comm_hook": CommHook,
                 "data": DataMode}
# `--model NAME` prefixes of the known architectures: a typo after them is a wrong name,
# not a module:function of the user's.
_ARCHITECTURE_PREFIXES = ("torchvision:", "hf:")


def add_subparsers(sub) -> None:
    """The run commands, on the top-level parser's sub-command set."""
    run_parser = sub.add_parser("run", help="train in the foreground; recorded like any other run")
    _add_config_options(run_parser)
    run_parser.add_argument("--from-run", metavar="RUN_ID", default=None,
                            help="start from this run's config (flags given override it)")
    run_parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    run_parser.set_defaults(func=cmd_run)

    launch_parser = sub.add_parser(
        "launch", help="start a run in the background and return at once"
    )
    _add_config_options(launch_parser)
    launch_parser.add_argument("--from-run", metavar="RUN_ID", default=None,
                               help="start from this run's config (flags given override it)")
    launch_parser.add_argument("--json", action="store_true")
    launch_parser.set_defaults(func=cmd_launch)

    show_parser = sub.add_parser("show", help="one run's status and config")
    show_parser.add_argument("run_id")
    show_parser.add_argument("--json", action="store_true")
    show_parser.set_defaults(func=cmd_show)

    listing_parser = sub.add_parser("list", help="runs, newest first (archived ones hidden)")
    listing_parser.add_argument("--json", action="store_true")
    listing_parser.add_argument("--search", default="", metavar="TEXT",
                                help="in run id, label, note and tags")
    listing_parser.add_argument("--tag", default="", metavar="KEY=VALUE[,KEY]",
                                help="runs with these tags (a bare KEY: any value)")
    listing_parser.add_argument("--model", action="append", default=[], choices=choices(ModelName))
    listing_parser.add_argument("--precision", action="append", default=[],
                                choices=choices(Precision))
    listing_parser.add_argument("--status", action="append", default=[], choices=STATUSES)
    listing_parser.add_argument("--since", type=_date("--since"), default=None,
                                metavar="YYYY-MM-DD", help="created on or after")
    listing_parser.add_argument("--until", type=_date("--until"), default=None,
                                metavar="YYYY-MM-DD", help="created on or before")
    listing_parser.add_argument("--archived", action="store_true", help="include archived runs")
    listing_parser.set_defaults(func=cmd_list)

    stop_parser = sub.add_parser("stop", help="stop a queued or running run")
    stop_parser.add_argument("run_id")
    stop_parser.add_argument("--json", action="store_true")
    stop_parser.set_defaults(func=cmd_stop)

    maxbatch_parser = sub.add_parser("maxbatch", help="find the largest batch size that fits "
                              "(bounded search of short probes)")
    _add_config_options(maxbatch_parser)
    maxbatch_parser.add_argument("--run", dest="run_id", default=None,
                          help="search with this run's config and device; stores the result "
                               "in the run (other config options are then ignored)")
    maxbatch_parser.add_argument("--max-batch", type=typed(int, "--max-batch"), default=4096,
                          help="upper bound of the search (default 4096)")
    maxbatch_parser.add_argument("--max-probes", type=typed(int, "--max-probes"), default=10)
    maxbatch_parser.add_argument("--json", action="store_true")
    maxbatch_parser.set_defaults(func=cmd_maxbatch)


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per RunConfig field, generated so the CLI never lags the config."""
    for fld in dataclasses.fields(RunConfig):
        flag = flag_for(fld.name)
        # argparse %-formats help strings: a docstring's "95 % interval" would crash --help
        help_text = field_doc(fld.name).replace("%", "%%")
        if fld.name in _ENUM_CHOICES:
            help_text += f" Choices: {', '.join(choices(_ENUM_CHOICES[fld.name]))}."
        if isinstance(fld.default, bool):
            parser.add_argument(flag, dest=fld.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        else:
            default = fld.default.value if isinstance(fld.default, Enum) else fld.default
            # Enum fields take the string; RunConfig names the choices when it is wrong.
            kind = type(default) if default is not None else str
            parser.add_argument(flag, dest=fld.name, type=typed(kind, flag), default=None,
                                help=f"{help_text} Default: {default!r}.")
    parser.add_argument("--model-file", dest="model_file", metavar="PATH.py", default=None,
                        help="your own workload file (its build(cfg) returns a Workload; "
                             "docs/workloads.md): sets --model custom --workload PATH. "
                             "--model my_pkg.module:function does the same for a module.")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The flags given, on top of RunConfig's defaults or, with --from-run, of that run's
    config (re-launch: the same run again, with any flag changed)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunConfig)
             if getattr(args, f.name, None) is not None}
    given.update(_workload_from_args(args, given.get("model")))
    base = RunConfig()
    if getattr(args, "from_run", None):
        try:
            source = Store().get_run(validate_run_id(args.from_run))
        except ValueError as exc:  # a malformed id, or RunNotFound
            raise UsageError(f"--from-run {args.from_run!r}: {exc}") from None
        except KeyError:
            raise UsageError(f"--from-run {args.from_run!r}: no such run; `python -m engine "
                             "list` shows the runs") from None
        if source.config_error:
            raise UsageError(f"--from-run {args.from_run!r}: {source.config_error}")
        base = source.config
    try:
        return base.replace(**given)
    except ConfigError as exc:
        raise UsageError(f"{flag_for(exc.field)} {exc.value!r}: {exc.fix}") from None




def _workload_from_args(args: argparse.Namespace, model: str | None) -> dict[str, str]:
    """--model-file PATH, or --model module:function: a custom workload (model custom)."""
    path = getattr(args, "model_file", None)
    if path is not None:
        if model not in (None, ModelName.CUSTOM.value):
            raise UsageError(f"--model-file {path!r} with --model {model!r}: give one of them")
        resolved = Path(path).expanduser().resolve()
        if resolved.suffix != ".py" or not resolved.is_file():
            raise UsageError(f"--model-file {path!r}: not a .py file here; give the path of "
                             "your workload file (docs/workloads.md)")
        # absolute: the trainer runs in the project root, not in this directory
        return {"model": ModelName.CUSTOM.value, "workload": str(resolved)}
    if (model and model not in choices(ModelName) and ":" in model
            and not model.startswith(_ARCHITECTURE_PREFIXES)):
        return {"model": ModelName.CUSTOM.value, "workload": model}
    return {}


def cmd_launch(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    run_id = _launch_checked(cfg, Store())
    print(json.dumps({"run_id": run_id}) if args.json else run_id)
    return EXIT_OK


def _launch_checked(cfg: RunConfig, store: Store) -> str:
    try:
        _device, warnings = check_runnable(cfg)
    except ConfigError as exc:
        raise UsageError(f"{flag_for(exc.field)} {exc.value!r}: {exc.fix}") from None
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return launch(cfg, store)


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    store = Store()
    run_id = _launch_checked(cfg, store)
    print(f"run {run_id}: {cfg.label}", file=sys.stderr)
    try:
        _follow(run_id, store)
    except KeyboardInterrupt:
        print(f"\nstopping run {run_id} ...", file=sys.stderr)
        stop(run_id, store)
    summary = run_summary(run_id, store)
    if args.json:
        print(json.dumps(summary))
    else:
        print(_format_summary(summary))
    return EXIT_OK if summary["status"] == FINISHED else EXIT_RUN_FAILED


def _follow(run_id: str, store: Store):
    """Print progress to stderr until the run reaches a final status."""
    last_step, last_reconcile = 0, time.monotonic()
    while True:
        run = store.get_run(run_id)
        row = store.last_metric(run_id)
        if row and row["step"] != last_step:
            last_step = row["step"]
            rate = row.get("samples_per_s")
            loss = row["loss"]  # NaN is stored as NULL: a diverged step reads back as None
            print(f"  step {row['step']:>6}/{run.total_steps}  loss "
                  + (f"{loss:.4f}" if loss is not None else "nan")
                  + (f"  {rate:,.1f} samples/s" if rate else ""), file=sys.stderr)
        if run.status in FINAL_STATUSES:
            return run
        if time.monotonic() - last_reconcile > 2.0:
            reconcile(store)
            last_reconcile = time.monotonic()
        time.sleep(0.2)


def run_summary(run_id: str, store: Store) -> dict[str, Any]:
    run = store.get_run(run_id)
    s = run.summary
    last = store.last_metric(run_id) or {}
    uses_scaler = run.config.uses_grad_scaler
    return {
        "run_id": run.id,
        "status": run.status,
        "reason": run.reason,
        "steps_completed": run.steps_completed,
        "first_loss": _finite_or_none(s.get("first_loss")),
        "final_loss": _finite_or_none(s.get("final_loss", last.get("loss"))),
        "samples_per_s": s.get("samples_per_s"),
        "tokens_per_s": s.get("tokens_per_s"),
        "step_time_ms": s.get("step_time_ms"),
        "peak_mem_bytes": s.get("peak_mem_bytes", last.get("mem_peak_bytes")),
        # the two peaks by name and the tensor peak's split (engine.analysis.memory_peaks)
        **memory_peaks(s, run.device_key, last.get("mem_peak_bytes")),
        "loss_scale_final": (s.get("loss_scale_final", last.get("loss_scale"))
                             if uses_scaler else None),
        "skipped_steps": int(s.get("skipped_steps", last.get("skipped_steps") or 0) or 0),
        "achieved_tflops": s.get("achieved_tflops"),
        "mfu": s.get("mfu"),  # the steady median, as on Live, Compare and the report
        "mfu_peak": s.get("peak_label") or s.get("peak_source"),  # what MFU is relative to
        "mfu_peaks": s.get("mfu_peaks"),  # MFU against the datasheet and the measured peak
        "flops_per_step": s.get("flops_per_step"),
        "param_count": s.get("param_count"),
        "device": run.device_key,
        "device_name": run.device_name,
        "precision": run.config.precision,
        "model": run.config.model,
        "size": run.config.size,
        "batch_size": run.config.batch_size,
    }


def _finite_or_none(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _format_summary(summary: dict[str, Any]) -> str:
    """`show` as text: each figure in the words and digits Live, Runs, Compare and the report
    use for it (engine.display); `--json` keeps the raw numbers."""
    model = summary["model"]
    throughput = summary.get(throughput_column(model))
    scale = summary.get("loss_scale_final")
    lines = [f"run {summary['run_id']}: {summary['status']}"
             + (f" ({summary['reason']})" if summary.get("reason") else "")]
    for label, value in (
            ("steps", summary.get("steps_completed")),
            ("first loss", loss_text(summary.get("first_loss"))),
            ("final loss", loss_text(summary.get("final_loss"))),
            ("throughput", throughput_text(throughput, throughput_unit(model))),
            ("step time", step_time_text(summary.get("step_time_ms"))),
            (TENSOR_PEAK_NAME, memory_text(summary.get("tensor_peak_bytes"))
             + (f" ({summary['tensor_peak_note']})" if summary.get("tensor_peak_note")
                else "")),
            (PROCESS_PEAK_NAME, memory_text(summary.get("process_peak_bytes"))),
            ("tensor peak split", memory_split_text(summary.get("memory_by_kind"))),
            ("MFU", mfu_text(summary.get("mfu"))
             + (f" (against {summary['mfu_peak']})" if summary.get("mfu_peak") else "")),
            ("final loss scale", loss_scale_text(scale)),
            ("skipped steps", summary.get("skipped_steps")),
            ("device", summary.get("device"))):
        lines.append(f"  {label:<18} {value}")
    return "\n".join(lines)


def cmd_maxbatch(args: argparse.Namespace) -> int:
    if args.max_batch < 1 or args.max_probes < 1:
        raise UsageError(f"--max-batch {args.max_batch} / --max-probes {args.max_probes}: "
                         "both must be at least 1")
    store = Store()
    if args.run_id:
        run = store.get_run(_valid_run_id(args.run_id))
        cfg, device_key = run.config, run.device_key
    else:
        cfg = config_from_args(args)
        try:
            device_key = check_runnable(cfg)[0].key
        except ConfigError as exc:
            raise UsageError(f"{flag_for(exc.field)} {exc.value!r}: {exc.fix}") from None

    def progress(message: dict) -> None:
        verdict = "fits" if message["fits"] else f"does not fit ({message['reason'][:80]})"
        print(f"  batch {message['probe']:>6}: {verdict}", file=sys.stderr)

    result = find_max_batch(cfg, device_key, args.max_batch, args.max_probes, progress)
    if args.run_id:
        store.merge_summary(args.run_id, {"max_batch_fit": result["max_batch_fit"],
                                          "max_batch_search": result})
    if args.json:
        print(json.dumps(result))
    else:
        print(f"largest batch that fits: {result['max_batch_fit']}"
              + ("" if result.get("complete") else " (search incomplete)"))
    return EXIT_OK if result["max_batch_fit"] else EXIT_RUN_FAILED


def cmd_show(args: argparse.Namespace) -> int:
    run_id = _valid_run_id(args.run_id)
    store = Store()
    reconcile(store)
    run = store.get_run(run_id)
    info = {
        "run_id": run.id, "status": run.status, "reason": run.reason, "pid": run.pid,
        "steps_completed": run.steps_completed, "total_steps": run.total_steps,
        "metrics_rows": store.metrics_count(run_id), "device": run.device_key,
        "device_name": run.device_name, "created_at": run.created_at,
        "started_at": run.started_at, "ended_at": run.ended_at,
        "created": _local_time(run.created_at), "duration_s": run.duration_s,
        "tags": run.tags, "note": run.note, "archived": run.archived,
        "no_progress_s": silent_s(stall := stall_of(store, run)),
        "config": run.config.to_dict(), "summary": run.summary,
    }
    if stall:
        print(f"warning: run {run.id}: {stall_words(stall)} Runs queued behind it wait: "
              f"`python -m engine stop {run.id}` if it does not recover", file=sys.stderr)
    if args.json:
        print(json.dumps(info))
    else:
        print(_format_show(info, run_summary(run_id, store)))
    return EXIT_OK


def _format_show(info: dict[str, Any], summary: dict[str, Any]) -> str:
    """`show` as text: who and where, then the figures as every page writes them (the full
    summary and the config are in `--json`)."""
    lines = []
    for key, value in info.items():
        if key in ("config", "summary", "run_id", "status", "reason", "steps_completed",
                   "device", "created"):  # in the figures above, or twice
            continue
        if key == "tags":
            value = tags_text(value)
        if key in ("created_at", "started_at", "ended_at"):
            value = _local_time(value) if value else None  # readable; --json has epochs
        if key == "duration_s" and value is not None:
            value = f"{value:,.1f}"
        lines.append(f"  {key:<18} {NA if value is None or value == '' else value}")
    contention = info["summary"].get("contention") or {}
    machine = contention.get("words") or ("busy" if contention.get("busy") else
                                           "quiet" if contention.get("busy") is False else NA)
    return "\n".join([_format_summary(summary), f"  {'machine':<18} {machine}", *lines,
                      "  config and summary: `python -m engine show RUN_ID --json`"])


def _date(flag: str):
    def parse(text: str) -> dt.date:
        try:
            return dt.date.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected a date, e.g. "
                                             "2026-12-01") from None
    return parse


def cmd_list(args: argparse.Namespace) -> int:
    store = Store()
    reconcile(store)
    try:
        flt = RunFilter(text=args.search, tags=parse_tag_filter(args.tag),
                        models=tuple(args.model), precisions=tuple(args.precision),
                        statuses=tuple(args.status), since=args.since, until=args.until,
                        archived=args.archived)
    except ConfigError as exc:
        raise UsageError(f"--tag {exc.value!r}: {exc.fix}") from None
    runs = filter_runs(store.list_runs(limit=100_000), flt)
    note = running_note(store)
    if note:
        print(note, file=sys.stderr)  # stderr: --json keeps stdout one JSON value
    rows = [{"run_id": r.id, "status": r.status, "model": r.config.model, "size": r.config.size,
             "precision": r.config.precision, "batch_size": r.config.batch_size,
             "steps_completed": r.steps_completed, "total_steps": r.total_steps,
             # the Runs page's words: "412/1000", or a speedup check's "23 rounds, 4 modes"
             "progress": progress_text(r),
             "device": r.device_key, "final_loss": _finite_or_none(r.summary.get("final_loss")),
             "samples_per_s": r.summary.get("samples_per_s"), "created_at": r.created_at,
             "duration_s": r.duration_s, "label": r.config.label, "tags": r.tags,
             "note": r.note, "archived": r.archived} for r in runs]
    if args.json:
        print(json.dumps(rows))
        return EXIT_OK
    if not rows:
        print("no runs" + (" match these filters" if _filtered(args) else " yet"))
        return EXIT_OK
    header = (f"{'run_id':<24} {'status':<9} {'model':<12} {'precision':<10} {'batch':>6} "
              f"{'progress':>17}  {'created':<19}  tags")
    print(header)
    for row in rows:
        status = row["status"] + ("*" if row["archived"] else "")
        tags = ", ".join(f"{k}={v}" if v else k for k, v in sorted(row["tags"].items()))
        print(f"{row['run_id']:<24} {status:<9} {row['model'] + '-' + row['size']:<12} "
              f"{row['precision']:<10} {row['batch_size']:>6} "
              f"{row['progress']:>17}  "
              f"{_local_time(row['created_at']):<19}  {tags}")
    if any(row["archived"] for row in rows):
        print("* archived")
    return EXIT_OK


def _filtered(args: argparse.Namespace) -> bool:
    return bool(args.search or args.tag or args.model or args.precision or args.status
                or args.since or args.until)


def _local_time(timestamp: float | None) -> str:
    """YYYY-MM-DD HH:MM:SS in this machine's time zone."""
    if not timestamp:
        return ""
    return dt.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def cmd_stop(args: argparse.Namespace) -> int:
    run = stop(_valid_run_id(args.run_id), Store())
    if args.json:
        print(json.dumps({"run_id": run.id, "status": run.status, "reason": run.reason}))
    else:
        print(f"run {run.id}: {run.status}" + (f" ({run.reason})" if run.reason else ""))
    return EXIT_OK


def _valid_run_id(run_id: str) -> str:
    try:
        return validate_run_id(run_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


