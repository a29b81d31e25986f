"""GPU acceptance: everything that needs a GPU, in one call, written as one report.

    python scripts/gpu_acceptance.py --out docs/gpu-reports/           # a GPU node, < 8 min on an H200
    python scripts/gpu_acceptance.py --device cpu --quick --out /tmp/r  # here, on the CPU (~3 min)

Parts, each through the product's own CLI (`python -m engine ...`, children of this
process, in a private data directory): doctor; the device check (matmul per dtype against
the datasheet, copy bandwidth, Tensor-Core evidence); every precision mode the device
runs, a few dozen steps of gpt small and torchvision resnet50 (tiny built-in models with
--quick), each with its profiler window's Tensor-Core verdict and the kernels that decided
it, time accounting and bound-by, telemetry samples (NVML, GPM tensor pipe) and MFU with
the peak it is against; one paired speedup check (fp32, tf32, bf16-amp, fp16-amp where
runnable); a 2-process DDP run when there is more than one GPU.

Writes OUT/<date>-<device>.md (every figure, the raw results at the end) and the same
results as OUT/<date>-<device>.json. Exit 0 when every part passed, 1 naming each part
that failed (stderr, and the report's "Failed" section), 2 for a bad flag. Needs only
the engine's runtime packages (torch, pandas, psutil, nvidia-ml-py; torchvision for
resnet50): nothing on its path imports streamlit or plotly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run from anywhere

from engine.config import Precision, choices  # noqa: E402

# (label, CLI flags) per model; GPU sizes make the matrix work big enough for the Tensor
# Cores to matter, quick sizes finish on a 2-core CPU.
GPU_MODELS = [
    ("gpt-small", ["--model", "gpt", "--size", "small", "--batch-size", "16", "--seq-len", "512"]),
    ("resnet50", ["--model", "torchvision:resnet50", "--batch-size", "64", "--image-size", "224",
                  "--channels-last"]),
]
QUICK_MODELS = [
    ("gpt-tiny", ["--model", "gpt", "--size", "tiny", "--batch-size", "4", "--seq-len", "32"]),
    ("resnet-tiny", ["--model", "resnet", "--size", "tiny", "--batch-size", "4",
                     "--image-size", "16"]),
]
SPEEDUP_MODES = ("fp32", "tf32", "bf16-amp", "fp16-amp")
PART_TIMEOUT_S = 240  # one CLI call; a hung part fails, the next one runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python scripts/gpu_acceptance.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path,
                        help="folder for the report (.md) and the raw results (.json)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models, few steps, short check and speedup (the CPU, CI)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run (default 30; 8 with --quick)")
    parser.add_argument("--speedup-budget-s", type=float, default=None,
                        help="the speedup check's wall time, set-up included (default 60; 20 "
                             "with --quick)")
    parser.add_argument("--max-minutes", type=float, default=8.0,
                        help="start no part after this many minutes (default 8); the parts "
                             "left are reported as not run")
    args = parser.parse_args(argv)
    args.steps = args.steps or (8 if args.quick else 30)
    if args.steps < 8:
        parser.error(f"--steps {args.steps}: use at least 8 (warm-up, profiler window, steady steps)")
    args.speedup_budget_s = args.speedup_budget_s or (20.0 if args.quick else 60.0)
    if args.max_minutes <= 0:
        parser.error(f"--max-minutes {args.max_minutes:g}: use a positive number of minutes")
    return args


# ---------------------------------------------------------------------------------------
# parts


@dataclass
class Part:
    name: str
    ok: bool = False
    seconds: float = 0.0
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


class Runner:
    """Runs `python -m engine ... --json` in a private data directory, within the budget."""

    def __init__(self, home: Path, deadline_s: float):
        self.home, self.deadline_s = home, deadline_s
        self.parts: list[Part] = []

    def cli(self, part: Part, *args: str, timeout_s: float = PART_TIMEOUT_S) -> dict | None:
        """One CLI call's JSON (its last stdout line); on failure part.error says why."""
        env = dict(os.environ, PRECISION_LAB_HOME=str(self.home), PRECISION_LAB_STANDBY="0",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        start_s = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "engine", *args, "--json"], env=env,
                                  cwd=str(REPO_ROOT), capture_output=True, text=True,
                                  timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            part.error = f"`engine {args[0]}` did not answer in {timeout_s:.0f} s"
            return None
        finally:
            part.seconds += time.monotonic() - start_s
        lines = proc.stdout.strip().splitlines()
        try:
            result = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            result = None
        if proc.returncode != 0 or not isinstance(result, dict):
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
            part.error = f"`engine {args[0]}` exited {proc.returncode}: {tail}"
            return result if isinstance(result, dict) else None
        return result

    def start(self, name: str) -> Part | None:
        """A new part, or None (recorded as not run) once the budget is spent."""
        part = Part(name)
        self.parts.append(part)
        if time.monotonic() > self.deadline_s:
            part.error = "not run: the --max-minutes budget was spent"
            return None
        print(f"[acceptance] {name} ...", file=sys.stderr, flush=True)
        return part


def doctor_part(runner: Runner) -> dict:
    part = runner.start("doctor")
    report = runner.cli(part, "doctor") if part else None
    if part and report:
        part.ok, part.data = True, report
    return report or {}


def check_part(runner: Runner, device: dict, quick: bool) -> None:
    part = runner.start("check")
    if part is None:
        return
    result = runner.cli(part, "check", "--device", device["key"],
                        "--time-budget", "8" if quick else "45")
    if result:
        part.data = result
        # On a GPU every line should be "ok" (a "slow" line is under half the datasheet, or
        # implausibly above it); on a CPU "slow" is what an emulated dtype is.
        bad = [f"{line['test']} {line['dtype']} ({line.get('reason')})"
               for line in result.get("lines", [])
               if device["kind"] == "cuda" and line.get("verdict") == "slow"]
        part.ok = part.error is None and not bad
        part.error = part.error or (f"check lines failed: {', '.join(bad)}" if bad else None)


def run_parts(runner: Runner, device: dict, models: list, args: argparse.Namespace) -> None:
    from engine.store import Store  # reads the telemetry rows back (pandas, no torch)

    store = Store(runner.home)
    for label, flags in models:
        for mode in choices(Precision):
            support = device["modes"][mode]
            if support["status"] == "unsupported":
                runner.parts.append(Part(f"run {label} {mode}", ok=True,
                                         data={"skipped": support["reason"]}))
                continue
            part = runner.start(f"run {label} {mode}")
            if part is not None:
                _one_run(runner, store, part, flags, mode, device["key"], args.steps)


def _one_run(runner: Runner, store, part: Part, flags: list[str], mode: str, device_key: str,
             steps: int) -> None:
    result = runner.cli(part, "run", *flags, "--precision", mode, "--device", device_key,
                        "--steps", str(steps), "--warmup-steps", "2" if steps < 20 else "5",
                        "--profile", "--profile-steps", "2", "--log-interval", "1",
                        "--name", f"acceptance {part.name[4:]}")
    if not result:
        return
    part.data["run"] = result
    if result.get("status") != "finished":
        part.error = part.error or f"status {result.get('status')}: {result.get('reason')}"
        return
    kernels = runner.cli(part, "kernels", result["run_id"])
    shown = runner.cli(part, "show", result["run_id"])
    part.data["kernels"] = _kernel_evidence(kernels or {})
    part.data["summary"] = _summary_evidence((shown or {}).get("summary") or {})
    part.data["telemetry"] = _telemetry(store, result["run_id"])
    part.ok = part.error is None


def _kernel_evidence(kernels: dict) -> dict:
    verdict = kernels.get("verdict") or {}
    return {"verdict": verdict.get("tensor_cores"), "headline": verdict.get("headline"),
            "tensor_core_share": kernels.get("matrix_tensor_core_share"),
            "deciding_kernels": [k.get("name") for k in (kernels.get("top_kernels") or [])[:3]],
            "evidence": verdict.get("evidence", [])[:3],
            "parts_share": (kernels.get("accounting") or {}).get("parts_share"),
            "bound_by": (kernels.get("bound_by") or {}).get("sentence"),
            "banner": (kernels.get("banner") or {}).get("headline")}


def _summary_evidence(summary: dict) -> dict:
    cpu = summary.get("cpu_evidence") or {}
    return {"peak_label": summary.get("peak_label"), "mfu_note": summary.get("mfu_note"),
            "gpm_tensor_util_pct": summary.get("gpm_tensor_util_pct"),
            "gpm_note": summary.get("gpm_note"), "cpu_verdict": cpu.get("headline"),
            "cpu_evidence": (cpu.get("evidence") or [])[:2],
            "busy": (summary.get("contention") or {}).get("busy"),
            "busy_words": (summary.get("contention") or {}).get("words"),
            "fp8_advice": summary.get("fp8_advice")}


def _telemetry(store, run_id: str) -> dict:
    frame = store.read_telemetry(run_id, max_points=None)
    if frame.empty:
        return {"samples": 0}

    def mean(column: str) -> float | None:
        values = frame[column].dropna() if column in frame else []
        return round(float(values.mean()), 2) if len(values) else None

    return {"samples": int(len(frame)), "gpu_util_pct": mean("gpu_util_pct"),
            "power_w": mean("power_w"), "sm_clock_mhz": mean("sm_clock_mhz"),
            "temp_c": mean("temp_c"), "cpu_pct": mean("cpu_pct")}


def speedup_part(runner: Runner, device: dict, models: list, args: argparse.Namespace) -> None:
    part = runner.start("speedup check")
    if part is None:
        return
    modes = [m for m in SPEEDUP_MODES if device["modes"][m]["status"] != "unsupported"]
    result = runner.cli(part, "speedup", *models[0][1], "--device", device["key"],
                        "--precisions", ",".join(modes),
                        "--budget-s", f"{args.speedup_budget_s:g}",
                        timeout_s=args.speedup_budget_s + PART_TIMEOUT_S)
    if result:
        part.data = result
        part.ok = part.error is None


def ddp_part(runner: Runner, device: dict, gpu_count: int, args: argparse.Namespace) -> None:
    if device["kind"] != "cuda" or gpu_count < 2:
        runner.parts.append(Part("ddp 2 processes", ok=True, data={
            "skipped": f"{gpu_count} GPU(s) here: a 2-process run needs 2"}))
        return
    part = runner.start("ddp 2 processes")
    if part is None:
        return
    result = runner.cli(part, "run", *GPU_MODELS[0][1], "--precision", "bf16-amp", "--nprocs", "2",
                        "--steps", str(args.steps), "--name", "acceptance ddp")
    if result:
        part.data = result
        part.ok = part.error is None and result.get("status") == "finished"


# ---------------------------------------------------------------------------------------
# the report


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows])


def _check_section(check: Part) -> str:
    lines = check.data.get("lines", [])
    rows = [[line.get("verdict"), line.get("test"), line.get("dtype"), line.get("value"),
             line.get("unit"), line.get("peak"), line.get("ratio_to_peak"),
             line.get("speedup_vs_fp32"), line.get("tensor_core"), line.get("reason")]
            for line in lines]
    return "## Device check\n\n" + (_table(
        ["verdict", "test", "dtype", "value", "unit", "datasheet", "of datasheet", "x fp32",
         "Tensor Cores", "reason"], rows) if rows else f"not available: {check.error}")


def _runs_section(parts: list[Part]) -> str:
    rows = []
    for part in parts:
        run, k = part.data.get("run") or {}, part.data.get("kernels") or {}
        summary, tele = part.data.get("summary") or {}, part.data.get("telemetry") or {}
        if "skipped" in part.data:
            rows.append([part.name[4:], "not run", part.data["skipped"]] + [None] * 10)
            continue
        deciding = k.get("deciding_kernels") or summary.get("cpu_evidence") or []
        rows.append([part.name[4:], run.get("status") or "failed", part.error,
                     "busy" if summary.get("busy") else "quiet" if summary.get("busy") is False
                     else "unknown", run.get("step_time_ms"), run.get("samples_per_s"),
                     run.get("mfu"), summary.get("peak_label") or summary.get("mfu_note"),
                     run.get("peak_mem_bytes") and run["peak_mem_bytes"] / 2**20,
                     summary.get("cpu_verdict") or k.get("headline"),
                     ", ".join(f"`{str(name)[:80]}`" for name in deciding) or None,
                     k.get("bound_by"), _telemetry_words(tele, summary)])
    return ("## Runs\n\nA run measured while the machine was busy says so (machine: busy); its "
            "figures are not a statement about the device.\n\n" + _table(
                ["run", "status", "error / reason", "machine", "step ms", "samples/s", "MFU",
                 "MFU against", "peak MiB", "Tensor-Core / CPU verdict", "deciding kernels / "
                 "primitives", "bound by", "telemetry"], rows))


def _telemetry_words(tele: dict, summary: dict) -> str | None:
    if not tele.get("samples"):
        return None
    words = [f"{tele['samples']} samples"]
    words += [f"{name} {tele[key]:g}" for key, name in
              (("gpu_util_pct", "GPU %"), ("power_w", "W"), ("sm_clock_mhz", "SM MHz"),
               ("cpu_pct", "CPU %")) if tele.get(key) is not None]
    gpm = summary.get("gpm_tensor_util_pct")
    words.append(f"GPM tensor {gpm:g} %" if gpm is not None else f"GPM: {summary.get('gpm_note')}")
    return ", ".join(words)


def _speedup_section(part: Part) -> str:
    modes = part.data.get("modes") or []  # `speedup --json`: a list, baseline first
    rows = [[m.get("mode"), m.get("median_step_ms"), m.get("speedup"),
             f"{m['ci_low']:.3f}-{m['ci_high']:.3f}" if m.get("ci_low") is not None else None,
             m.get("verdict"), m.get("words") or m.get("verdict_reason")]
            for m in modes]
    head = "## Speedup check\n\n"
    if not rows:
        return head + f"not available: {part.error or 'no modes in the result'}"
    return head + _table(["mode", "step ms", "speedup", "95 % interval", "verdict", "why"], rows)


def _ddp_words(part: Part) -> str:
    if "skipped" in part.data:
        return f"not run: {part.data['skipped']}"
    if not part.ok:
        return f"failed: {part.error}"
    run = part.data
    return (f"2 processes, bf16-amp: {run.get('status')}, {_cell(run.get('samples_per_s'))} "
            f"samples/s, step {_cell(run.get('step_time_ms'))} ms")


def write_report(out_dir: Path, runner: Runner, doctor: dict, device: dict, args,
                 total_s: float) -> Path:
    stamp = time.strftime("%Y-%m-%d")
    slug = re.sub(r"[^a-z0-9]+", "-", (device.get("name") or device.get("key") or "device").lower()).strip("-")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stamp}-{slug}.md"
    by_name = {part.name: part for part in runner.parts}
    failed = [part for part in runner.parts if not part.ok]
    results = {"device": device, "doctor": doctor, "quick": args.quick, "steps": args.steps,
               "total_s": round(total_s, 1), "parts": [asdict(part) for part in runner.parts]}
    path.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    support = doctor.get("torch_support") or {}
    text = [f"# Precision Lab GPU acceptance: {device.get('name')} ({device.get('key')})", "",
            f"{stamp}, torch {doctor.get('torch_version')} (CUDA build "
            f"{doctor.get('torch_cuda_build') or 'none'}; supported {support.get('supported')}), "
            f"{'quick' if args.quick else 'full'} mode, {args.steps} steps a run, "
            f"{total_s:.0f} s in all; {len(runner.parts) - len(failed)} of {len(runner.parts)} parts passed.",
            "", "## Failed", ""]
    text += [f"- {part.name}: {part.error}" for part in failed] or ["- none"]
    text += ["", _check_section(by_name.get("check") or Part("check")), "",
             _runs_section([p for p in runner.parts if p.name.startswith("run ")]), "",
             _speedup_section(by_name.get("speedup check") or Part("speedup check")), "",
             "## DDP", "", _ddp_words(by_name.get("ddp 2 processes") or Part("ddp")), "",
             "## Raw results", "", f"Also in `{path.with_suffix('.json').name}`.", "",
             "```json", json.dumps(results, indent=1, default=str), "```", ""]
    path.write_text("\n".join(text), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start_s = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="precision_lab_acceptance_") as home:
        runner = Runner(Path(home) / "lab", start_s + args.max_minutes * 60)
        doctor = doctor_part(runner)
        device = _device(doctor, args.device)
        if device is None:
            print(f"error: --device {args.device}: not found here (doctor: "
                  f"{[d['key'] for d in doctor.get('devices', [])]})", file=sys.stderr)
            return 1
        models = QUICK_MODELS if args.quick or device["kind"] == "cpu" else GPU_MODELS
        check_part(runner, device, args.quick)
        run_parts(runner, device, models, args)
        speedup_part(runner, device, models, args)
        gpus = sum(1 for d in doctor.get("devices", []) if d.get("kind") == "cuda")
        ddp_part(runner, device, gpus, args)
        path = write_report(args.out, runner, doctor, device, args, time.monotonic() - start_s)
    failed = [part for part in runner.parts if not part.ok]
    print(f"report: {path}", file=sys.stderr)
    for part in failed:
        print(f"failed: {part.name}: {part.error}", file=sys.stderr)
    return 1 if failed else 0


def _device(doctor: dict, wanted: str) -> dict | None:
    devices = doctor.get("devices") or []
    if wanted == "auto":
        gpus = [d for d in devices if d.get("kind") == "cuda"]
        return (gpus or devices or [None])[0]
    if wanted == "cuda":
        wanted = "cuda:0"
    return next((d for d in devices if d.get("key") == wanted), None)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
