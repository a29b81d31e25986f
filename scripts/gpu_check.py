"""One-shot hardware report: doctor, the device check, and a few training steps of every
precision mode the device supports, as Markdown on stdout.

    python scripts/gpu_check.py            # GPU node: < 8 minutes on an H200
    python scripts/gpu_check.py --quick    # tiny sizes; ~1 minute on a 2-core CPU

Each run is profiled (trace in a temp dir) and its kernels summarised with
engine.analysis.traces.analyze_trace (CPU runs: the oneDNN evidence).
A run that fails is reported as failed; the script goes on with the next one.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from engine.analysis.cpu_evidence import cpu_verdict, parse_onednn_verbose  # noqa: E402
from engine.analysis.traces import analyze_trace  # noqa: E402
from engine.config import ModelName, Precision, RunConfig, choices  # noqa: E402
from engine.hardware.devices import read_cpu_flags  # noqa: E402
from engine.schema import ONEDNN_LOG_FILENAME  # noqa: E402

# Sizes per (model, quick?): big enough on a GPU for Tensor Cores to matter, tiny on CPU.
GPU_SIZES = {
    "gpt": dict(size="medium", batch_size=8, seq_len=512),
    "resnet": dict(size="medium", batch_size=64, image_size=64, channels_last=True),
    "mlp": dict(size="medium", batch_size=1024),
}
MIN_STEPS = 5  # 1 warm-up, 1 profiler warm-up, 1 profiled, >= 2 timed steady steps
QUICK_SIZES = {
    "gpt": dict(size="tiny", batch_size=4, seq_len=32),
    "resnet": dict(size="tiny", batch_size=4, image_size=16),
    "mlp": dict(size="tiny", batch_size=16),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models and few steps (CPU, CI)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda:N")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 8; 5 quick)")
    parser.add_argument("--models", default="gpt,resnet", help="comma list of gpt,resnet,mlp")
    parser.add_argument("--modes", default="all", help="comma list of precision modes, or all")
    parser.add_argument("--check-budget", type=float, default=None,
                        help="seconds for the device check (default 45; 8 quick)")
    parser.add_argument("--max-minutes", type=float, default=8.0,
                        help="stop starting new runs after this many minutes (default 8)")
    args = parser.parse_args(argv)
    args.steps = args.steps or (5 if args.quick else 8)
    if args.steps < MIN_STEPS:
        # warm-up + profiler window + at least one steady step to time
        parser.error(f"--steps {args.steps}: use at least {MIN_STEPS}")
    args.check_budget = args.check_budget or (8.0 if args.quick else 45.0)
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    for model in args.model_list:
        if model not in choices(ModelName):
            parser.error(f"--models {model!r}: choose from {', '.join(choices(ModelName))}")
    if args.modes != "all":
        args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
        for mode in args.mode_list:
            if mode not in choices(Precision):
                parser.error(f"--modes {mode!r}: choose from all or {', '.join(choices(Precision))}")
    else:
        args.mode_list = choices(Precision)
    return args


# ---------------------------------------------------------------------------------------
# runs


def run_config(model: str, mode: str, device_key: str, steps: int, quick: bool,
               is_gpu: bool) -> RunConfig:
    sizes = (QUICK_SIZES if quick or not is_gpu else GPU_SIZES)[model]
    # Phases (train.phase_of): warm-up, then one profiler warm-up step plus the profiled
    # steps, then steady steps, the only ones samples/s and MFU are computed from.
    warmup, profiled = (1, 1) if steps < 8 else (2, 2)
    return RunConfig(model=model, precision=mode, steps=steps, device=device_key,
                     warmup_steps=warmup, profile=True, profile_steps=profiled,
                     log_interval=1, **sizes)


def one_run(cfg: RunConfig, device, out_dir: Path) -> dict[str, Any]:
    from engine.hardware.peaks import peak_for
    from engine.training.fp8_advice import fp8_advice
    from engine.training.loop import train

    peak = peak_for(device, cfg.precision_mode.compute_dtype)
    row: dict[str, Any] = {"model": cfg.model, "size": cfg.size, "mode": cfg.precision,
                           "peak_source": peak.source, "advice": fp8_advice(cfg)}
    start_s = time.perf_counter()
    try:
        result = train(cfg, device.key, emit=lambda rows: None, run_dir=out_dir,
                       peak_flops=peak.flops_per_s)
    except Exception as exc:  # OOM, a missing optional package: report and go on
        row.update(status="failed", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
        return row
    finally:
        _free_cuda()
    achieved = result.achieved_tflops * 1e12 if result.achieved_tflops else None
    row.update(status=result.status, steps=result.steps_completed,
               samples_per_s=result.samples_per_s,
               mfu=achieved / peak.flops_per_s if achieved and peak.flops_per_s else None,
               peak_mem_bytes=result.peak_mem_bytes, wall_s=time.perf_counter() - start_s)
    if device.kind == "cpu":
        row.update(cpu_summary(out_dir, cfg.precision_mode.compute_dtype))
    else:
        row.update(trace_summary(result.trace_path, device.kind))
    return row


def cpu_summary(run_dir: Path, compute_dtype: str) -> dict[str, Any]:
    """A CPU run's evidence: which oneDNN implementation ran the matrix primitives."""
    log_path = run_dir / ONEDNN_LOG_FILENAME
    if not log_path.exists():
        return {"tc_verdict": "n/a (CPU run; no oneDNN log written)", "top_kernels": []}
    verdict = cpu_verdict(parse_onednn_verbose(log_path.read_text(errors="replace")),
                          compute_dtype, read_cpu_flags())
    return {"tc_verdict": f"CPU: {verdict['headline']}", "top_kernels": verdict["evidence"][:3]}


def _free_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def trace_summary(trace_path: str | None, device_kind: str) -> dict[str, Any]:
    """TC verdict and top kernel names of one run's trace."""
    if not trace_path:
        return {"tc_verdict": "n/a (no trace written)", "top_kernels": []}
    try:
        analysis = analyze_trace(trace_path)
    except Exception as exc:
        return {"tc_verdict": f"trace analysis failed: {type(exc).__name__}: {exc}"[:160],
                "top_kernels": []}
    verdict = analysis.get("verdict") or {}
    share = analysis.get("tensor_core_share")
    headline = verdict.get("headline") if isinstance(verdict, dict) else str(verdict)
    if isinstance(share, (int, float)):
        headline = f"{headline} ({share:.0%} TC)"
    return {"tc_verdict": headline or "n/a", "top_kernels": _kernel_names(analysis.get("top_kernels"))}


def _kernel_names(top: Any, limit: int = 3) -> list[str]:
    """Names from top_kernels whether it is a DataFrame, a list of dicts or of strings."""
    if top is None:
        return []
    if hasattr(top, "to_dict"):  # DataFrame
        top = top.to_dict("records")
    names = []
    for item in list(top)[:limit]:
        names.append(str(item.get("name", item)) if isinstance(item, dict) else str(item))
    return names


# ---------------------------------------------------------------------------------------
# Markdown


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def devices_section(report: dict[str, Any]) -> str:
    modes = choices(Precision)
    rows = []
    for dev in report["devices"]:
        memory = f"{dev['memory_bytes'] / 2**30:.1f} GiB" if dev.get("memory_bytes") else None
        rows.append([dev["key"], dev["name"], dev["kind"], dev["capability"], memory,
                     dev.get("driver_version"), dev.get("cuda_version")]
                    + [dev["modes"][m]["status"] for m in modes])
    head = (f"torch {report['torch_version']}, CUDA build {report['torch_cuda_build'] or 'none'}, "
            f"NVML: {'available' if report['nvml_available'] else report['nvml_reason']}")
    return "## Devices\n\n" + head + "\n\n" + md_table(
        ["key", "name", "kind", "capability", "memory", "driver", "CUDA"] + modes, rows)


def check_section(result: dict[str, Any]) -> str:
    rows = [[line["verdict"], line["test"], line["dtype"], line["value"], line["unit"],
             line["peak"], f"{line['ratio_to_peak']:.0%}" if line["ratio_to_peak"] else None,
             line["speedup_vs_fp32"], line.get("tensor_core"), line.get("gpm_tensor_util_pct"),
             line["reason"]] for line in result["lines"]]
    text = (f"## Check of {result['device']['key']} ({result['device']['name']}), "
            f"{result['elapsed_s']:.1f} s\n\n")
    if result.get("no_gpu_reason"):
        text += f"No GPU here: {result['no_gpu_reason']}\n\n"
    text += md_table(["verdict", "test", "dtype", "value", "unit", "peak", "% peak", "x fp32",
                      "TC (names)", "GPM TC %", "reason"], rows)
    nvml = result.get("nvml")
    if nvml:
        clocks = nvml.get("clocks_mhz") or {}
        text += (f"\n\nNVML: SM {clocks.get('sm')}/{clocks.get('max_sm')} MHz, power "
                 f"{_cell(nvml.get('power_w'))}/{_cell(nvml.get('power_limit_w'))} W, "
                 f"{_cell(nvml.get('temp_c'))} C, throttle: "
                 f"{', '.join(nvml.get('throttle_reasons') or []) or 'none'}, ECC: "
                 f"{nvml.get('ecc_errors')}")
    else:
        text += f"\n\nNVML not available: {result.get('nvml_reason')}"
    kernel_lines = [f"- {line['dtype']}: `{k['name'][:110]}` TC={k['tensor_core']} ({k['reason']})"
                    for line in result["lines"] for k in line.get("kernels", [])[:1]]
    if kernel_lines:
        text += "\n\nMain matmul kernel per dtype:\n\n" + "\n".join(kernel_lines)
    return text


def runs_section(rows: list[dict[str, Any]], notes: list[str]) -> str:
    table = [[r["model"] + "-" + r["size"], r["mode"], r.get("status"), r.get("steps"),
              r.get("samples_per_s"), f"{r['mfu']:.1%}" if r.get("mfu") else None,
              r.get("peak_source"),
              f"{r['peak_mem_bytes'] / 2**20:,.0f} MiB" if r.get("peak_mem_bytes") else None,
              r.get("tc_verdict") or r.get("reason"),
              ", ".join(f"`{n[:60]}`" for n in r.get("top_kernels", [])) or None]
             for r in rows]
    text = "## Runs\n\n" + md_table(["model", "mode", "status", "steps", "samples/s", "MFU",
                                     "peak from", "peak mem", "TC verdict", "top kernels"], table)
    advice = sorted({f"- {r['model']} fp8: {r['advice']}" for r in rows if r.get("advice")})
    if advice or notes:
        text += "\n\n" + "\n".join(advice + [f"- {n}" for n in notes])
    return text


# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    deadline_s = time.monotonic() + args.max_minutes * 60
    from engine.diagnostics.check import run_check
    from engine.hardware.devices import UNSUPPORTED, get_device, resolve_device_key
    from engine.diagnostics.doctor import doctor_report

    start_s = time.perf_counter()
    key = resolve_device_key(args.device)
    device = get_device(key)
    report = doctor_report()
    progress = lambda fraction, message: print(f"[check {fraction:4.0%}] {message}",  # noqa: E731
                                               file=sys.stderr, flush=True)
    check = run_check(key, progress=progress, time_budget_s=args.check_budget)

    runs, notes, emulated = [], [], {}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for model in args.model_list:
            for mode in args.mode_list:
                support = device.modes[mode]
                if support.status == UNSUPPORTED:
                    notes.append(f"{model} {mode} not run: {support.reason}")
                    continue
                if time.monotonic() > deadline_s:
                    notes.append(f"{model} {mode} not run: --max-minutes {args.max_minutes:g} spent")
                    continue
                print(f"[run] {model} {mode} ...", file=sys.stderr, flush=True)
                cfg = run_config(model, mode, key, args.steps, args.quick, device.kind == "cuda")
                out_dir = Path(tmp) / f"{model}-{mode}"
                out_dir.mkdir()
                runs.append(one_run(cfg, device, out_dir))
                if support.status != "native":
                    emulated[mode] = support.reason
    notes += [f"{mode} is emulated here: {reason}" for mode, reason in emulated.items()]

    print(f"# Precision Lab hardware check\n\nhost {platform.node()}, python "
          f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M:%S')}, "
          f"{'quick' if args.quick else 'full'} mode, {args.steps} steps per run, "
          f"total {time.perf_counter() - start_s:.0f} s\n")
    print(devices_section(report) + "\n")
    print(check_section(check) + "\n")
    print(runs_section(runs, notes))
    failed = [r for r in runs if r.get("status") == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
