"""`python -m engine doctor` and `python -m engine check`: what this machine has, and
whether each precision runs as fast as it should. Registered by engine.cli.main.

Contract as for every command: bad input exits 2 with one line naming the flag;
`--json` makes the last stdout line one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.cli.errors import EXIT_OK, UsageError
from engine.config import ConfigError
from engine.diagnostics.doctor import doctor_report
from engine.display import memory_text
from engine.hardware.devices import resolve_device_key

VERDICT_MARKS = {"ok": "OK  ", "slow": "SLOW", "not supported": "--  ", "skipped": "skip"}


def add_subparsers(sub) -> None:
    doctor = sub.add_parser("doctor", help="devices, drivers and what each precision mode "
                                           "means on each device")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.set_defaults(func=cmd_doctor)

    check = sub.add_parser("check", help="matmul/bandwidth sanity check of one device "
                                         "(Tensor-Core evidence on GPUs)")
    check.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    check.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    check.add_argument("--time-budget", dest="time_budget_s", type=_positive_seconds,
                       default=45.0, help="upper bound for the check in seconds (default 45)")
    check.set_defaults(func=cmd_check)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1.0 <= value <= 600.0:
        raise argparse.ArgumentTypeError(f"--time-budget {text!r}: expected seconds between 1 "
                                         "and 600, e.g. 45")
    return value


# ---------------------------------------------------------------------------------------
# doctor


def format_doctor(report: dict[str, Any]) -> str:
    cuda = (
        f"CUDA {report['torch_cuda_build']}, GPU usable: {'yes' if report['torch_cuda'] else 'no'}"
        if report["torch_cuda_build"]
        else "CPU-only build"
    )
    support = report["torch_support"]
    lines = [f"torch {report['torch_version']} ({cuda}); supported: {support['supported']}"]
    lines += [f"  {word}: {support[word]}" for word in ("problem", "warning") if support[word]]
    lines.append("NVML: " + ("available" if report["nvml_available"]
                             else f"not available ({report['nvml_reason']})"))
    lines.append("optional parts: " + "; ".join(
        f"{part['module']} {'yes' if part['installed'] else 'no (' + part['install'] + ')'}"
        for part in report["optional"]))
    if report.get("run_cgroup"):
        lines.append(report["run_cgroup"]["line"])
    lines.append("")
    for dev in report["devices"]:
        memory = memory_text(dev.get("memory_bytes"))  # as the app's device card
        lines.append(
            f"{dev['key']}: {dev['name']}  [{dev['kind']}, {dev['capability']}, "
            f"{memory}"
            + (f", driver {dev['driver_version']}" if dev.get("driver_version") else "")
            + (f", CUDA {dev['cuda_version']}" if dev.get("cuda_version") else "")
            + "]"
        )
        for mode, support in dev["modes"].items():
            lines.append(f"  {mode:<10} {support['status']:<12} {support['reason']}")
        lines.append("")
    return "\n".join(lines).rstrip()


def cmd_doctor(args: argparse.Namespace) -> int:
    report = doctor_report()
    print(json.dumps(report) if args.json else format_doctor(report))
    return EXIT_OK


# ---------------------------------------------------------------------------------------
# check


def _stderr_progress():
    """A one-line progress display on stderr (rewritten in place on a terminal)."""
    is_tty = sys.stderr.isatty()

    def show(fraction: float, message: str) -> None:
        text = f"[{fraction * 100:5.1f}%] {message}"
        if is_tty:
            sys.stderr.write("\r\033[K" + text + ("\n" if fraction >= 1.0 else ""))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    return show


def format_check(result: dict[str, Any]) -> str:
    dev = result["device"]
    lines = [f"check of {dev['key']}: {dev['name']} ({dev['capability']}) "
             f"in {result['elapsed_s']:.1f} s"]
    if result.get("no_gpu_reason"):
        lines.append(f"no GPU here: {result['no_gpu_reason']}")
    lines.append(f"{'':4} {'test':<12} {'dtype':<5} {'value':>10} {'unit':<8} {'peak':>8} "
                 f"{'%peak':>6} {'x fp32':>7}  reason")
    for line in result["lines"]:
        lines.append(
            f"{VERDICT_MARKS.get(line['verdict'], line['verdict'])} {line['test']:<12} "
            f"{line['dtype'] or '':<5} {_num(line['value']):>10} {line['unit']:<8} "
            f"{_num(line['peak']):>8} {_pct(line['ratio_to_peak']):>6} "
            f"{_num(line['speedup_vs_fp32'], 2):>7}  {line['reason']}")
        for kernel in line.get("kernels", [])[:2]:
            lines.append(f"{'':20} kernel {kernel['name'][:70]}  TC={kernel['tensor_core']}")
    nvml = result.get("nvml")
    if nvml:
        clocks = nvml.get("clocks_mhz") or {}
        lines.append(f"NVML: SM {clocks.get('sm')} / {clocks.get('max_sm')} MHz, power "
                     f"{_num(nvml.get('power_w'))} / {_num(nvml.get('power_limit_w'))} W, "
                     f"{_num(nvml.get('temp_c'))} C, throttle: "
                     f"{', '.join(nvml.get('throttle_reasons') or []) or 'none'}")
    else:
        lines.append(f"NVML not available: {result.get('nvml_reason')}")
    return "\n".join(lines)


def _num(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _pct(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.0%}"


def cmd_check(args: argparse.Namespace) -> int:
    from engine.diagnostics.check import run_check  # imports torch when it runs: check only

    try:
        key = resolve_device_key(args.device)
    except ConfigError as exc:
        raise UsageError(f"--device {exc.value!r}: {exc.fix}") from None
    result = run_check(key, progress=_stderr_progress(), time_budget_s=args.time_budget_s)
    print(json.dumps(result) if args.json else format_check(result))
    return EXIT_OK
