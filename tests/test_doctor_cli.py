"""`python -m engine doctor` and `python -m engine check` as subprocesses: the JSON schema,
statuses decided from this machine's real /proc/cpuinfo flags, and the exit-code contract."""

from __future__ import annotations

import json

import pytest
import torch

MODES = ("fp32", "tf32", "fp16-amp", "bf16-amp", "bf16-pure", "fp8")
STATUSES = {"native", "emulated", "unsupported"}


def cpuinfo_flags() -> set[str]:
    """Read independently of engine.hardware.devices, so the test checks it rather than
    repeats it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.split(":")[0].strip() in ("flags", "Features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.fixture(scope="module")
def doctor(tmp_path_factory):
    import subprocess
    import sys

    from conftest import REPO_ROOT, cli_env

    proc = subprocess.run([sys.executable, "-m", "engine", "doctor", "--json"], cwd=str(REPO_ROOT),
                          env=cli_env(tmp_path_factory.mktemp("home")), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_doctor_json_schema(doctor):
    assert doctor["torch_version"] == torch.__version__
    assert doctor["torch_cuda"] is torch.cuda.is_available()
    assert isinstance(doctor["nvml_available"], bool)
    assert doctor["nvml_available"] or doctor["nvml_reason"]
    assert doctor["devices"], "no devices listed"
    for dev in doctor["devices"]:
        assert {"name", "kind", "capability", "memory_bytes", "driver_version", "cuda_version",
                "modes"} <= set(dev)
        assert dev["kind"] in ("cpu", "cuda") and dev["name"] and dev["capability"]
        assert tuple(dev["modes"]) == MODES
        for mode, support in dev["modes"].items():
            assert support["status"] in STATUSES, (mode, support)
            assert support["reason"], mode


def test_cpu_is_listed_first_with_its_memory(doctor):
    cpu = doctor["devices"][0]
    assert cpu["kind"] == "cpu" and cpu["key"] == "cpu"
    assert cpu["memory_bytes"] is None or cpu["memory_bytes"] > 2**28


def test_cpu_statuses_follow_the_real_cpu_flags(doctor):
    flags = cpuinfo_flags()
    modes = doctor["devices"][0]["modes"]
    has_bf16 = bool({"avx512_bf16", "amx_bf16"} & flags)
    has_fp16 = bool({"avx512_fp16", "amx_fp16"} & flags)
    assert modes["fp32"]["status"] == "native"
    assert modes["tf32"]["status"] == "unsupported"
    assert modes["fp8"]["status"] == "unsupported"
    for mode in ("bf16-amp", "bf16-pure"):
        assert modes[mode]["status"] == ("native" if has_bf16 else "emulated"), flags & {
            "avx512_bf16", "amx_bf16"}
    assert modes["fp16-amp"]["status"] == ("native" if has_fp16 else "emulated")


def test_no_gpu_means_no_cuda_devices(doctor):
    if torch.cuda.is_available() or doctor["nvml_available"]:
        pytest.skip("a GPU or an NVIDIA driver is present")
    assert [d["kind"] for d in doctor["devices"]] == ["cpu"]
    assert "NVML" in doctor["nvml_reason"] or "Library" in doctor["nvml_reason"]


@pytest.mark.slow
def test_doctor_text(cli):
    proc = cli("doctor")
    assert proc.returncode == 0, proc.stderr
    assert "cpu:" in proc.stdout and "bf16-amp" in proc.stdout and "torch " in proc.stdout


@pytest.mark.slow
def test_check_json_on_cpu(cli):
    proc = cli("check", "--json", "--device", "cpu", "--time-budget", "3")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["device"]["key"] == "cpu"
    assert all(line["verdict"] for line in result["lines"])
    assert "[100.0%] done" in proc.stderr  # progress goes to stderr, JSON alone on stdout


@pytest.mark.slow
def test_check_unusable_device_exits_2_with_one_line(cli):
    proc = cli("check", "--device", "cuda:9")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--device 'cuda:9'" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["0", "abc", "9999"])
def test_check_bad_time_budget_exits_2(cli, budget):
    proc = cli("check", "--time-budget", budget)
    assert proc.returncode == 2 and "--time-budget" in proc.stderr
