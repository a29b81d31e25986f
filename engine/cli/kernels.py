"""`python -m engine classify ...` and `python -m engine kernels TRACE`: the kernel classifier
and the trace breakdown from a terminal. engine/cli/main.py calls add_subparsers(); each command
sets func= to a handler that takes the parsed args and returns the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from engine.analysis.kernels import classify_kernel
from engine.cli.errors import EXIT_OK, EXIT_USAGE


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    classify = subparsers.add_parser(
        "classify", help="kernel name -> category, Tensor Cores yes/no/unknown, dtype",
        description="Print name<TAB>category<TAB>tensor_core<TAB>dtype per kernel name. "
                    "Names come from the arguments, or one per line on stdin.")
    classify.add_argument("names", nargs="*", metavar="NAME", help="kernel names")
    classify.set_defaults(func=cmd_classify)

    kernels = subparsers.add_parser(
        "kernels", help="kernel breakdown of a profiler trace: did matmuls use Tensor Cores?",
        description="Read a PyTorch profiler trace (.json or .json.gz) and report kernel time "
                    "by category, the Tensor Core share and the kernels that decided it.")
    kernels.add_argument("trace", metavar="TRACE", help="trace file (.json or .json.gz)")
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
    from engine.analysis.traces import analyze_trace  # pandas: only this command reads traces

    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    try:
        summary = analyze_trace(args.trace)
    except ValueError as exc:  # unreadable / missing / not a trace: the message names the path
        stderr.write(f"kernels: {exc}\n")
        return EXIT_USAGE
    if summary.get("malformed_events"):
        stderr.write(f"warning: {args.trace}: {summary['malformed_events']} malformed event(s) "
                     "(a name that is not text, an id that is a list or an object) left out\n")
    if args.json:
        stdout.write(json.dumps(summary) + "\n")
    else:
        stdout.write(format_breakdown(summary))
    return EXIT_OK


# ---------------------------------------------------------------------------------------
# text report

def _ms(us: float | None) -> str:
    return f"{(us or 0.0) / 1000:,.3f}"


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{share * 100:.1f} %"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def format_breakdown(summary: dict, name_width: int = 90) -> str:
    """The breakdown as a readable plain-text report."""
    lines = [f"Trace:  {summary.get('source') or '-'}"]
    device = summary.get("device") or "unknown GPU"
    capability = summary.get("compute_capability")
    suffix = f" (compute capability {capability})" if capability else ""
    lines.append(f"Device: {device}{suffix}")
    lines.append(summary["verdict"]["headline"])
    lines.append(
        f"Kernel time {_ms(summary['total_kernel_us'])} ms in {summary['kernel_count']:,} kernels;"
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
    if summary["could_have_didnt"]:
        lines += ["", "Matrix ops that ran without Tensor Cores"]
        for entry in summary["could_have_didnt"]:
            lines.append(f"  {entry['cpu_op']}: {_ms(entry['without_tensor_core_us'])} ms "
                         f"({_pct(entry['without_tensor_core_share'])} of its matrix time), "
                         f"e.g. {_clip(entry['kernels'][0], 70)}")
            lines += [f"    - {cause}" for cause in entry["likely_causes"]]
    return "\n".join(lines) + "\n"
