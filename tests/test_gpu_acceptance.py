"""scripts/gpu_acceptance.py: its CPU mode end to end (as CI runs it, with streamlit and
plotly unimportable, as on a GPU node that lacks them), its flags, and its report's
account of failed and skipped parts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "gpu_acceptance.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def blocked_ui_packages(tmp_path) -> Path:
    """A folder that shadows streamlit and plotly with packages that refuse to import."""
    for name in ("streamlit", "plotly"):
        (tmp_path / "blocked" / name).mkdir(parents=True)
        (tmp_path / "blocked" / name / "__init__.py").write_text(
            f"raise ImportError('{name} is not on a GPU node: "
            "the acceptance path must not import it')\n"
        )
    return tmp_path / "blocked"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_cpu_quick_mode_writes_a_complete_report(tmp_path, blocked_ui_packages):
    out = tmp_path / "reports"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(blocked_ui_packages)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick",
                           "--out", str(out)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=840, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [report] = list(out.glob("*.md"))
    results = json.loads(report.with_suffix(".json").read_text())
    text = report.read_text()
    for heading in ("# Precision Lab GPU acceptance", "## Failed", "## Device check", "## Runs",
                    "## Speedup check", "## DDP", "## Raw results"):
        assert heading in text, heading
    assert "- none" in text.split("## Failed", 1)[1].split("##", 1)[0]
    parts = {part["name"]: part for part in results["parts"]}
    modes = results["device"]["modes"]
    for model in ("gpt-tiny", "resnet-tiny"):
        for mode, support in modes.items():
            part = parts[f"run {model} {mode}"]
            if support["status"] == "unsupported":
                assert part["data"]["skipped"] == support["reason"]
                continue
            assert part["ok"] and part["data"]["run"]["status"] == "finished", part
            assert part["data"]["summary"]["cpu_verdict"]  # the oneDNN evidence, per run
            assert part["data"]["kernels"]["bound_by"]
            assert part["data"]["telemetry"]["samples"] > 0
            assert f"| {model} {mode} | finished |" in text
    assert parts["check"]["ok"] and parts["check"]["data"]["lines"]
    speedup = parts["speedup check"]["data"]["modes"]
    assert [row["mode"] for row in speedup][:2] == ["fp32", "bf16-amp"]
    assert parts["ddp 2 processes"]["data"]["skipped"].startswith("0 GPU(s) here")
    assert psutil.Process().children(recursive=True) == []


def test_bad_flags_name_the_flag_and_exit_2():
    script = _script()
    for argv, words in ((["--out", "x", "--steps", "3"], "--steps 3: use at least 8"),
                        (["--out", "x", "--max-minutes", "0"], "--max-minutes 0"),
                        ([], "--out")):
        with pytest.raises(SystemExit) as stop:
            script.parse_args(argv)
        assert stop.value.code == 2, argv


def test_the_report_names_each_failed_and_each_skipped_part(tmp_path):
    script = _script()
    runner = script.Runner(tmp_path / "lab", deadline_s=0.0)  # the budget is already spent
    assert runner.start("speedup check") is None
    failed = script.Part("run gpt-small fp16-amp", error="status oom: CUDA out of memory")
    runner.parts += [script.Part("check", ok=True, data={"lines": []}), failed,
                     script.Part("run gpt-small fp8", ok=True, data={"skipped": "needs torchao"})]
    args = script.parse_args(["--out", str(tmp_path), "--quick"])
    device = {"key": "cuda:0", "name": "NVIDIA H200", "kind": "cuda", "modes": {}}
    path = script.write_report(tmp_path, runner, {"torch_version": "2.11.0+cu130"}, device,
                               args, total_s=12.0)
    assert path.name.endswith("-nvidia-h200.md")
    failures = path.read_text().split("## Failed", 1)[1].split("## ", 1)[0]
    assert "- speedup check: not run: the --max-minutes budget was spent" in failures
    assert "- run gpt-small fp16-amp: status oom: CUDA out of memory" in failures
    assert "fp8" not in failures  # a mode the device cannot run is not a failure
    assert "| gpt-small fp8 | not run | needs torchao |" in path.read_text()
    assert "2 of 4 parts passed" in path.read_text()


def test_a_slow_check_line_fails_the_check_on_a_gpu_not_on_a_cpu(tmp_path):
    script = _script()

    class Answer(script.Runner):
        def cli(self, part, *args, timeout_s=0):
            return {"lines": [{"test": "matmul", "dtype": "bf16", "verdict": "slow",
                               "reason": "31 % of the datasheet peak"}]}

    on_gpu, on_cpu = Answer(tmp_path, float("inf")), Answer(tmp_path, float("inf"))
    script.check_part(on_gpu, {"key": "cuda:0", "kind": "cuda"}, quick=True)
    script.check_part(on_cpu, {"key": "cpu", "kind": "cpu"}, quick=True)
    assert not on_gpu.parts[0].ok
    assert on_gpu.parts[0].error == "check lines failed: matmul bf16 (31 % of the datasheet peak)"
    assert on_cpu.parts[0].ok and on_cpu.parts[0].error is None  # emulated dtypes are slow
