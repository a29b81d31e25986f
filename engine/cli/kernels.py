"""`python -m engine classify ...` and `python -m engine kernels TRACE`: the kernel classifier
and the trace breakdown from a terminal. engine/cli/main.py calls add_subparsers(); each command
sets func= to a handler that takes the parsed args and returns the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from engine.cli.errors import EXIT_OK, EXIT_USAGE, path_problem, shown, typed
from engine.config import ConfigError
from engine.display import ratio_text, share_text
from engine.traces.kernels import classify_kernel


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    classify = subparsers.add_parser(
        "classify", help="kernel name -> category, Tensor Cores yes/no/unknown, dtype",
        description="Print name<TAB>category<TAB>tensor_core<TAB>dtype per kernel name. "
                    "Names come from the arguments, or one per line on stdin.")
    classify.add_argument("names", nargs="*", metavar="NAME", help="kernel names")
    classify.set_defaults(func=cmd_classify)

    kernels = subparsers.add_parser(
        "kernels", help="kernel breakdown of a profiler trace: did matmuls use Tensor Cores, "
                        "where did the step's time go? (two traces with --diff: why B is faster)",
        description="Read a PyTorch profiler trace (.json or .json.gz) and report kernel time "
                    "by category, the Tensor Core share and the kernels that decided it, GPU "
                    "busy/idle time, copies, communication overlap, per stream and per step, and "
                    "what bounds the step. With two traces and --diff: the step of B against A, "
                    "part by part.")
    kernels.add_argument("trace", metavar="TRACE",
                         help="trace file (.json or .json.gz), a run id (its profiler window), "
                              "or a folder or zip of one job's rank traces (a trace set)")
    kernels.add_argument("trace_b", metavar="TRACE_B", nargs="?",
                         help="a second trace or run id, compared with the first (needs --diff)"
                              ", or the next rank's trace (with --set)")
    kernels.add_argument("more", metavar="TRACE_N", nargs="*",
                         help="more rank traces of the same job (a trace set)")
    kernels.add_argument("--diff", action="store_true",
                         help="explain TRACE_B's step time against TRACE's")
    kernels.add_argument("--set", action="store_true", dest="trace_set",
                         help="read the traces as the ranks of one job: a per-rank table, the "
                              "slowest rank, communication waiting for other ranks (implied by "
                              "a folder, a zip or three traces or more)")
    kernels.add_argument("--step", type=typed(int, "--step"), default=None, metavar="N",
                         help="account one profiler step (ProfilerStep#N) only")
    kernels.add_argument("--workers", default="auto", metavar="N|auto",
                         help="a trace set: ranks read at once in their own processes "
                              "(auto: as many as the cores and memory allow; 1: one by one "
                              "in this process)")
    kernels.add_argument("--ray", default=None, metavar="ADDRESS|auto",
                         help="a trace set: read each rank where the files are, as a task on "
                              "this Ray cluster (HOST:PORT of its head, or auto)")
    kernels.add_argument("--json", action="store_true", help="print one JSON object")
    kernels.set_defaults(func=cmd_kernels)


def cmd_classify(args: argparse.Namespace, stdin: TextIO | None = None,
                 stdout: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    names = args.names or [line.rstrip("\r\n") for line in (stdin or sys.stdin)]
    for name in names:
        if not name.strip():
            continue
        verdict = classify_kernel(name)
        stdout.write(f"{name}\t{verdict.category}\t{verdict.tensor_core}\t{verdict.dtype or ''}\n")
    return EXIT_OK


def cmd_kernels(args: argparse.Namespace, stdout: TextIO | None = None,
                stderr: TextIO | None = None) -> int:
    from engine.analysis.whatif import run_projection  # late: as analyze, this command only

    # late: only this command reads traces, so the CLI's start-up stays light
    from engine.traces.explain import analyze, explain_diff, explain_runs

    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    usage = _usage_problem(args)
    if usage:
        stderr.write(f"error: {usage}\n")
        return EXIT_USAGE
    if _is_set(args):
        return _cmd_trace_set(args, stdout, stderr)
    try:
        targets = [_target(args.trace)] + ([_target(args.trace_b)] if args.diff else [])
        if args.diff and all(run is not None for _path, run, _store in targets) \
                and args.step is None:
            # two runs: the Compare page's comparison, with its labels and caveats
            result = explain_runs(targets[0][2], targets[0][1], targets[1][1])
            if result.get("error"):
                raise ValueError(result["error"])
        elif args.diff:
            result = explain_diff(targets[0][0], targets[1][0], step_a=args.step,
                                  step_b=args.step)
        else:
            run = targets[0][1]
            result = analyze(targets[0][0], step=args.step,
                             cpu_evidence=run.summary.get("cpu_evidence") if run else None)
            result["projection"] = run_projection(result, run)  # analysis.whatif
            if (result.get("accounting") or {}).get("kind") == "cpu":
                # late: as analyze; a CPU trace's verdict is oneDNN's evidence, not kernels
                from engine.analysis.cpu_evidence import kernels_verdict

                result["cpu_evidence"] = run.summary.get("cpu_evidence") if run else None
                result["verdict"] = kernels_verdict(result["cpu_evidence"])
    except ValueError as exc:  # unreadable / missing / not a trace / no such step: names the path
        from engine.traces.accounting import StepNotInTrace  # late: as analyze above

        flag = f"--step {args.step}: " if isinstance(exc, StepNotInTrace) else ""
        stderr.write(f"error: {flag}{_one_line(str(exc))}\n")
        return EXIT_USAGE
    if not args.diff:
        _warn_defects(result, args.trace, stderr)
    if args.json:
        stdout.write(json.dumps(result) + "\n")
    else:
        stdout.write(format_diff(result) if args.diff else format_breakdown(result))
    return EXIT_OK


def _target(text: str) -> tuple[str, object, object]:
    """A trace path as given, or a run id's profiler trace: (path, run or None, store)."""
    # late: opening the store only when an argument is not a file
    from engine.store import RunNotFound, Store

    # late: explain reads traces and the store SQLite; only `kernels` needs either
    from engine.traces.explain import run_trace_path

    if Path(text).exists() or text.endswith((".json", ".gz")):
        return text, None, None  # a file (a missing one is named by the reader's error)
    store = Store()
    try:
        run = store.get_run(text)
    except RunNotFound:
        raise ValueError(f"{text}: neither a trace file nor a run id in {store.home} "
                         "(list runs with `python -m engine list`)") from None
    path = run_trace_path(store, run)
    if path is None:
        raise ValueError(f"run {text} has no profiler trace: it ran with --no-profile or "
                         "ended before its profiler window; launch it again with --profile")
    return str(path), run, store


def _set_paths(args: argparse.Namespace) -> list[str]:
    return [args.trace] + ([args.trace_b] if getattr(args, "trace_b", None) else []) + \
        list(getattr(args, "more", None) or [])


def _is_set(args: argparse.Namespace) -> bool:
    """A trace set: --set, three traces or more, or a folder or zip as TRACE."""
    first = Path(args.trace)
    return bool(getattr(args, "trace_set", False) or getattr(args, "more", None)
                or first.is_dir() or args.trace.lower().endswith(".zip"))


def _set_usage_problem(args: argparse.Namespace) -> str | None:
    if getattr(args, "diff", False):
        return ("--diff compares two traces, not a trace set; pass two traces with --diff, "
                "or the ranks of one job without it")
    if getattr(args, "step", None) is not None:
        return (f"--step {args.step}: a trace set is read over each rank's whole window; "
                "leave --step out, or pass one rank's trace with it")
    return None


def _usage_problem(args: argparse.Namespace) -> str | None:
    trace_b = getattr(args, "trace_b", None)
    named = [("TRACE", args.trace), ("TRACE_B", trace_b)] + [
        ("TRACE_N", text) for text in getattr(args, "more", None) or []]
    for name, text in named:
        problem = path_problem(text) if text is not None else None
        if problem:
            return (f"{name} {shown(text)}: {problem}; give a trace file (.json or .json.gz) "
                    "or a run id")
    if _is_set(args):
        return _set_usage_problem(args)
    if getattr(args, "diff", False) and not trace_b:
        return (f"--diff needs two traces, got one ({shown(args.trace)}); give A and B: "
                "python -m engine kernels A.json.gz B.json.gz --diff")
    if trace_b and not getattr(args, "diff", False):
        return (f"TRACE_B {shown(trace_b)} given without --diff; add --diff to compare the "
                "two traces, or pass one trace")
    step = getattr(args, "step", None)
    if step is not None and step < 0:
        return f"--step {step}: expected a profiler step number (0 or more, e.g. --step 5)"
    return None


def _cmd_trace_set(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    # late: trace_sets reads traces; only a trace set needs it
    from engine.traces.sets import analyze_set, set_members

    try:
        members = _run_ranks(args) or set_members([Path(text) for text in _set_paths(args)])
        files = all(isinstance(source, Path) for _label, source in members)
        if args.ray is not None:
            if not files:
                raise ValueError("--ray reads each rank's file where it is: give a folder or "
                                 "the files, not a zip (unzip it first)")
            # late: Ray is an optional extra, imported only for a set read on a cluster
            from engine.cluster.ray_traces import analyze_set_on_ray

            try:
                result = analyze_set_on_ray(members, args.ray,
                                            on_progress=lambda text: stderr.write(text + "\n"))
            except ConfigError as exc:  # the address: named by the flag the user typed
                raise ValueError(f"--ray {shown(exc.value)}: {exc.fix}") from None
        else:
            workers = _workers(args.workers, members) if files else 1
            if workers > 1:
                # late: worker processes only for a set worth them
                from engine.traces.set_workers import analyze_set_parallel

                result = analyze_set_parallel(members, workers)
            else:
                result = analyze_set(members)
    except ValueError as exc:  # names the file or folder
        stderr.write(f"error: {_one_line(str(exc))}\n")
        return EXIT_USAGE
    for failure in result.get("failed_ranks") or []:
        stderr.write(f"rank trace {failure['source']}: {_one_line(failure['error'])}\n")
    if args.json:
        stdout.write(json.dumps({"trace_set": result}) + "\n")
    else:
        stdout.write(format_trace_set(result))
    return EXIT_OK


def _workers(text: str, members: list) -> int:
    """--workers as a count: auto asks set_workers.workers_for (cores and memory)."""
    if text == "auto":
        # late: only a set read in processes needs it
        from engine.traces.set_workers import workers_for

        return workers_for([source for _label, source in members])
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise ValueError(f"--workers {shown(text)}: expected auto or a whole number from 1 "
                         "to 256")
    return int(text)


def _run_ranks(args: argparse.Namespace) -> list | None:
    """A run id given alone with --set: its ranks' traces (each rank profiles the window)."""
    if getattr(args, "trace_b", None) or getattr(args, "more", None) or Path(args.trace).exists() \
            or args.trace.lower().endswith((".json", ".gz", ".zip")):
        return None
    # late: explain reads traces and the store SQLite; only `kernels` needs either
    from engine.traces.explain import run_rank_traces

    _path, run, store = _target(args.trace)
    members = run_rank_traces(store, run)
    if not members:
        raise ValueError(f"run {args.trace} has no trace from a second rank: it ran one process, "
                         "or with profiling off; launch it with --nprocs 2 or more and --profile")
    return members


def format_trace_set(result: dict) -> str:
    """The per-rank table as plain text, the sentence first."""
    lines = [result["sentence"], f"(rank from {result['rank_from']})", "",
             f"{'rank':>5}  {'trace':<28}{'steps':>6}{'step_ms':>10}{'busy_ms':>10}"
             f"{'idle_step':>10}{'idle_gpu':>9}{'comm_ms':>10}{'exposed_ms':>11}{'wait_ms':>9}"]
    for row in result["ranks"]:
        lines.append(
            f"{row['rank']:>5}  {_clip(row['source'], 27):<28}{row['step_count']:>6}"
            f"{_ms(row['step_time_us']):>10}{_ms(row['busy_us']):>10}"
            f"{_pct(row['idle_share']):>10}{_pct(row['idle_in_gpu_span_share']):>9}"
            f"{_ms(row['communication_us']):>10}{_ms(row['exposed_communication_us']):>11}"
            f"{_ms(row['waiting_us']) if row.get('waiting_us') is not None else 'n/a':>9}")
    lines += ["", "Times per step. idle_step: idle within the CPU-side steps; idle_gpu: idle over "
              "the GPU's own span (first to last kernel, as HolisticTraceAnalysis reports it); "
              "wait_ms: communication kernel time beyond the shortest rank's for the same "
              "collective (waiting for the other ranks)"]
    if result.get("collectives_note"):
        lines.append(result["collectives_note"])
    skew = result.get("collective_skew")
    if skew:
        most = skew["most_often_last"]
        lines += ["", f"Collective start skew across ranks ({skew['collectives']} matched): "
                      f"median {_ms(skew['median_us'])} ms, max {_ms(skew['max_us'])} ms; rank "
                      f"{most['rank']} arrived last {most['count']} time(s) (the traces' own "
                      "clocks: ranks on several hosts need them in step)"]
        for entry in skew["worst"][:5]:
            lines.append(f"  #{entry['index']:<5} skew {_ms(entry['skew_us']):>10} ms  last rank "
                         f"{entry['last_rank']:<5} {_clip(entry['name'], 70)}")
    if result.get("collective_bandwidth"):
        lines += ["", "Bus bandwidth per collective (nccl-tests' definition; the time of the "
                      "rank that waited least)",
                  f"{'collective':<34}{'count':>7}{'median MB':>11}{'median GB/s':>13}"
                  f"{'max GB/s':>10}"]
        for row in result["collective_bandwidth"]:
            lines.append(f"{_clip(row['collective'], 33):<34}{row['count']:>7}"
                         f"{row['median_bytes'] / 1e6:>11,.2f}"
                         f"{row['median_bus_gb_per_s']:>13,.1f}{row['max_bus_gb_per_s']:>10,.1f}")
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _warn_defects(summary: dict, trace: str, stderr: TextIO) -> None:
    if summary.get("malformed_events"):
        stderr.write(f"warning: {trace}: {summary['malformed_events']} malformed event(s) "
                     "(a name that is not text, an id that is a list or an object) left out\n")
    if summary.get("bad_duration_events"):
        stderr.write(f"warning: {trace}: {summary['bad_duration_events']} event(s) with a "
                     "missing, negative or impossible time (a defect of the trace) left out of "
                     "every sum\n")


# ---------------------------------------------------------------------------------------
# text report

def _ms(us: float | None) -> str:
    return f"{(us or 0.0) / 1000:,.3f}"


def _pct(share: float | None) -> str:
    return "n/a" if share is None else share_text(share, 1)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def format_breakdown(summary: dict, name_width: int = 90) -> str:
    """The breakdown as a readable plain-text report."""
    from engine.traces.op_rates import witness_sentence  # late: as analyze, in cmd_kernels

    lines = [f"Trace:  {summary.get('source') or '-'}"]
    if summary.get("trace_kind") in ("range profiler", "other accelerator"):
        return "\n".join(lines + format_other_kind(summary)) + "\n"
    accounting = summary.get("accounting") or {}
    if accounting.get("kind") == "cpu":
        return "\n".join(lines + format_cpu_accounting(summary)) + "\n"
    device = summary.get("device") or "unknown GPU"
    capability = summary.get("compute_capability")
    suffix = f" (compute capability {capability})" if capability else (
        f" (AMD {summary['arch']})" if summary.get("arch") else "")
    lines.append(f"Device: {device}{suffix}")
    banner = summary.get("banner") or {}
    lines.append(banner.get("headline") or summary["verdict"]["headline"])
    witness = summary.get("rate_witness")
    if witness:
        lines.append(witness_sentence(witness))
    if summary.get("bound_by"):
        lines.append(f"{summary['bound_by']['sentence']}")
        lines += [f"  try: {advice}" for advice in summary["bound_by"]["advice"]]
    if accounting:
        lines += [""] + format_gpu_accounting(accounting)
    lines.append(
        f"Kernel time {_ms(summary['total_kernel_us'])} ms in {summary['kernel_count']:,} kernels"
        f"{_scope(summary)};"
        f" on Tensor Cores {_ms(summary['tensor_core_us'])} ms"
        f" ({_pct(summary['tensor_core_share'])});"
        f" matrix work {_ms(summary['matrix_us'])} ms"
        f" ({_pct(summary['matrix_tensor_core_share'])} of it on Tensor Cores)")
    lines += ["", f"{'category':<16}{'time_ms':>12}{'share':>10}"]
    total_us = summary["total_kernel_us"] or 0.0
    for category, us in sorted(summary["categories"].items(), key=lambda kv: -kv[1]):
        if us > 0:
            share = us / total_us if total_us else None
            lines.append(f"{category:<16}{_ms(us):>12}{_pct(share):>10}")
    lines += ["", "Top kernels",
              f"{'time_ms':>10} {'count':>6}  {'TC':<7} {'dtype':<9} {'category':<15} name"]
    for kernel in summary["top_kernels"]:
        lines.append(f"{_ms(kernel['total_us']):>10} {kernel['count']:>6}  "
                     f"{kernel['tensor_core']:<7} {kernel['dtype'] or '-':<9} "
                     f"{kernel['category']:<15} {_clip(kernel['name'], name_width)}")
    lines += format_op_rates(summary)
    if summary["could_have_didnt"]:
        lines += ["", "Matrix ops that ran without Tensor Cores"]
        for entry in summary["could_have_didnt"]:
            lines.append(f"  {entry['cpu_op']}: {_ms(entry['without_tensor_core_us'])} ms "
                         f"({_pct(entry['without_tensor_core_share'])} of its matrix time), "
                         f"e.g. {_clip(entry['kernels'][0], 70)}")
            lines += [f"    - {cause}" for cause in entry["likely_causes"]]
    return "\n".join(lines) + "\n"


def format_other_kind(summary: dict) -> list[str]:
    """A range-profiler or other-accelerator trace: what it is and its evidence."""
    banner = summary["banner"]
    lines = [f"Kind:   {summary['trace_kind']}",
             f"Device: {summary.get('device') or 'unknown'}", banner["headline"],
             banner["sentence"]]
    evidence = summary.get("range_profiler")
    if evidence and evidence["kernels"]:
        agree = evidence["counters_agree_with_names"]
        lines.append("The counters " + ("agree with" if agree else "contradict" if agree is
                                        False else "cannot check") + " the kernel names")
        lines += ["", f"{'names':<8}{'counters':<9}{'FFMA':>15}{'HFMA':>13}  kernel"]
        for kernel in evidence["kernels"]:
            lines.append(f"{kernel['name_verdict']:<8}{kernel['counter_verdict'] or 'n/a':<9}"
                         f"{kernel['ffma'] if kernel['ffma'] is not None else 'n/a':>15}"
                         f"{kernel['hfma'] if kernel['hfma'] is not None else 'n/a':>13}  "
                         f"{_clip(kernel['name'], 80)}")
    return lines


def _rate(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def format_op_rates(summary: dict, limit: int = 15) -> list[str]:
    """Per-op FLOPs and achieved rates (the recorded shapes' arithmetic), largest time first."""
    rows = summary.get("op_rates") or []
    if not rows:
        note = summary.get("op_rates_note")
        return ["", f"Per-op rates: {note}"] if note else []
    lines = ["", f"Per-op rates ({rows[0]['time_basis']} time; share of the "
                 f"{rows[0]['peak_kind'] or 'no'} peak for the dtype)",
             f"{'calls':>6} {'GFLOP/call':>11} {'time_ms':>9} {'TFLOP/s':>9} {'TB/s':>7} "
             f"{'FLOP/B':>7} {'of peak':>8} {'bound':<8} {'dtype':<6} op shape"]
    for row in rows[:limit]:
        lines.append(
            f"{row['calls']:>6} {row['flops_per_call'] / 1e9:>11.4f} "
            f"{_ms(row['kernel_us']):>9} {_rate(row['tflops_per_s']):>9} "
            f"{_rate(row['tb_per_s'], 3):>7} {_rate(row['flop_per_byte'], 1):>7} "
            f"{_pct(row['share_of_peak']):>8} {row['bound'] or 'n/a':<8} "
            f"{row['compute_dtype']:<6} {row['op']} {row['shape']}")
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit} more in --json (op_rates)")
    return lines


def _scope(summary: dict) -> str:
    scope = summary.get("breakdown_scope")
    return f" ({scope})" if scope else ""


def format_gpu_accounting(accounting: dict) -> list[str]:
    window = accounting["window"]
    lines = [f"Window {_ms(accounting['window_us'])} ms ({window['source']}, "
             f"{window['step_count']} step(s), {_ms(accounting['step_time_us'])} ms each): "
             f"GPU busy {_ms(accounting['busy_us'])} ms ({_pct(accounting['busy_share'])}), "
             f"idle {_ms(accounting['idle_us'])} ms ({_pct(accounting['idle_share'])})",
             f"  compute {_ms(accounting['compute_us'])} ms, communication "
             f"{_ms(accounting['communication_us'])} ms ({_ms(accounting['overlap_us'])} ms hidden "
             f"under compute), copies {_ms(accounting['copy_us'])} ms"]
    if accounting["copies"]:
        lines += ["", f"{'copies':<10}{'count':>7}{'MB':>12}{'time_ms':>11}{'GB/s':>9}"]
        for row in accounting["copies"]:
            mb = "-" if row["bytes"] is None else f"{row['bytes'] / 1e6:,.1f}"
            gbs = "-" if row["gb_per_s"] is None else f"{row['gb_per_s']:,.1f}"
            lines.append(f"{row['direction']:<10}{row['count']:>7}{mb:>12}{_ms(row['us']):>11}"
                         f"{gbs:>9}")
    lines += ["", f"{'stream':<8}{'kernels':>8}{'kernel_ms':>11}{'copy_ms':>9}{'busy_ms':>10}"
                  f"{'busy':>9}"]
    for row in accounting["streams"]:
        copy_us = row["memcpy_us"] + row["memset_us"]
        lines.append(f"{str(row['stream']):<8}{row['kernel_count']:>8}{_ms(row['kernel_us']):>11}"
                     f"{_ms(copy_us):>9}{_ms(row['busy_us']):>10}{_pct(row['busy_share']):>9}")
    lines += _idle_lines(accounting.get("stream_idle") or [])
    if accounting["steps"]:
        lines += ["", "Per step: in the step's CPU span (time_ms), and by launch: the work the "
                      "step launched, over its own GPU span",
                  f"{'step':<8}{'time_ms':>10}{'busy_ms':>10}{'idle':>9}{'comm_ms':>10}"
                  f"{'hidden_ms':>10}{'copy_ms':>9}{'gpu_span_ms':>12}{'launched_ms':>12}"
                  f"{'idle_gpu':>9}{'lag_ms':>9}"]
        for row in accounting["steps"]:
            launched = row.get("launched") or {}
            lines.append(f"{row['step']:<8}{_ms(row['step_time_us']):>10}{_ms(row['busy_us']):>10}"
                         f"{_pct(row['idle_share']):>9}{_ms(row['communication_us']):>10}"
                         f"{_ms(row['overlap_us']):>10}{_ms(row['copy_us']):>9}"
                         f"{_ms_or_na(launched.get('gpu_span_us')):>12}"
                         f"{_ms(launched.get('busy_us')):>12}"
                         f"{_pct(launched.get('idle_in_gpu_span_share')):>9}"
                         f"{_ms_or_na(launched.get('gpu_lag_us')):>9}")
    lines += [""] + _launch_lines(accounting)
    lines += ["", "Step time by part (per step)"] + _parts_lines(accounting)
    return lines


def _ms_or_na(us: float | None) -> str:
    return "n/a" if us is None else _ms(us)


def _idle_lines(rows: list[dict]) -> list[str]:
    """Why each stream sat idle, its launch queue and launch delays (HTA's definitions)."""
    if not rows:
        return []
    lines = ["", "Idle time by cause (host wait: nothing queued; kernel wait: queued, gap "
                 "<= 30 us; other), launch queue and launch delay per stream",
             f"{'stream':<8}{'idle_ms':>9}{'host_ms':>9}{'kernel_ms':>10}{'other_ms':>9}"
             f"{'queue_max':>10}{'queue_p50':>10}{'delay_p50_us':>13}{'delay_p95_us':>13}"]
    for row in rows:
        delay_p50, delay_p95 = row["launch_delay_p50_us"], row["launch_delay_p95_us"]
        lines.append(
            f"{str(row['stream']):<8}{_ms(row['idle_us']):>9}{_ms(row['host_wait_us']):>9}"
            f"{_ms(row['kernel_wait_us']):>10}{_ms(row['other_us']):>9}"
            f"{row['queue_max'] if row['queue_max'] is not None else 'n/a':>10}"
            f"{row['queue_p50'] if row['queue_p50'] is not None else 'n/a':>10}"
            f"{'n/a' if delay_p50 is None else f'{delay_p50:,.1f}':>13}"
            f"{'n/a' if delay_p95 is None else f'{delay_p95:,.1f}':>13}"
            + ("  launch-bound" if row["launch_bound"] else ""))
    return lines


def _launch_lines(accounting: dict) -> list[str]:
    # late: the trace analysis, loaded by the time a report is formatted
    from engine.traces.accounting import launch_words

    return launch_words(accounting)


def _parts_lines(accounting: dict) -> list[str]:
    # late: the trace analysis, loaded by the time a report is formatted
    from engine.traces.accounting import part_shares

    shares = part_shares(accounting)
    lines = [f"  {'part':<15}{'time_ms':>10}{'share':>10}"]
    for part, us in accounting["parts_per_step_us"].items():
        if us > 0:
            lines.append(f"  {part:<15}{_ms(us):>10}{_pct(shares.get(part)):>10}")
    return lines


def _cpu_kind_lines(evidence: dict | None) -> list[str]:
    """oneDNN's matrix time per kind of op: the implementation that ran most of it, and
    the share in reference code (engine.analysis.cpu_evidence.kind_table)."""
    rows = (evidence or {}).get("by_kind") or []
    if not rows:
        return []
    lines = ["", f"oneDNN matrix time by kind of op (reference code: "
                 f"{_pct(evidence.get('reference_share'))} of it)",
             f"  {'kind':<30}{'time_ms':>10}{'share':>9}  implementation (unit)"]
    lines += [f"  {row['label']:<30}{_ms(row['exec_ms'] * 1000):>10}{_pct(row['share']):>9}  "
              f"{row['src_dtype']} {row['implementation']} ({row['unit']})" for row in rows]
    return lines


def format_cpu_accounting(summary: dict) -> list[str]:
    accounting, verdict = summary["accounting"], summary["bound_by"]
    window = accounting["window"]
    lines = ["Device: CPU (no GPU kernels: the CPU ops' self time is the evidence)",
             (summary.get("verdict") or {}).get("headline") or "CPU matrix unit: unknown",
             f"Window {_ms(accounting['window_us'])} ms ({window['source']}, "
             f"{window['step_count']} step(s), {_ms(accounting['step_time_us'])} ms each); "
             f"casts (aten::to/_to_copy/copy_) {_pct(accounting['cast_share'])} of it",
             verdict["sentence"]]
    lines += [f"  try: {advice}" for advice in verdict["advice"]]
    lines += ["", "Step time by part (per step; idle = outside any op)"] + _parts_lines(accounting)
    lines += _cpu_kind_lines(summary.get("cpu_evidence"))
    if accounting["matrix_ops"]:
        lines += ["", "Matrix ops and the oneDNN primitive behind them"]
        lines += [f"  {row['cpu_op']}: {_ms(row['self_us'])} ms self, {row['onednn']}"
                  for row in accounting["matrix_ops"]]
    lines += ["", f"{'self_ms':>10} {'count':>6}  {'part':<14} op"]
    lines += [f"{_ms(row['self_us']):>10} {row['count']:>6}  {row['part']:<14} {row['cpu_op']}"
              for row in accounting["ops"]]
    return lines


def _side(letter: str, label: str) -> str:
    """"A (fp32)"; just "A" when the label is the letter itself (two CPU traces), and
    "A (bf16)" for the label "bf16 (A)" that two same-dtype traces get."""
    label = label.removesuffix(f" ({letter})")
    return letter if label == letter else f"{letter} ({label})"


def format_diff(diff: dict) -> str:
    """B against A, part by part, with the Amdahl sentence first."""
    # late: the trace analysis, loaded by the time a diff is formatted
    from engine.traces.explain import differs_words

    a, b = _side("A", diff["label_a"]), _side("B", diff["label_b"])
    lines = [f"{a}: {diff['source_a']}", f"{b}: {diff['source_b']}",
             f"A and B differ in: {differs_words(diff)}",
             f"Step {_ms(diff['step_time_a_us'])} ms -> {_ms(diff['step_time_b_us'])} ms",
             diff["sentence"]]
    lines += [("warning: " if c["severity"] == "warning" else "note: ") + c["text"]
              for c in diff.get("caveats") or []]
    lines += ["",
             f"{'part':<15}{'A_ms':>10}{'B_ms':>10}{'speedup':>9}{'share_of_A':>12}"]
    for row in diff["parts"]:
        if row["a_us"] or row["b_us"]:
            speedup = "-" if row["speedup"] is None else ratio_text(row["speedup"])
            lines.append(f"{row['part']:<15}{_ms(row['a_us']):>10}{_ms(row['b_us']):>10}"
                         f"{speedup:>9}{_pct(row['share_of_a']):>12}")
    for key, who in (("only_in_a", f"Only in {a}"), ("only_in_b", f"Only in {b}")):
        if diff[key]:
            lines += ["", who]
            lines += [f"  {_ms(row['us_per_step']):>9} ms/step  {_clip(row['name'], 80)}"
                      + (f"  [{row['note']}]" if row["note"] else "") for row in diff[key]]
    lines += ["", f"A is {diff['bound_by_a']['label']}, B is {diff['bound_by_b']['label']}"]
    return "\n".join(lines) + "\n"
