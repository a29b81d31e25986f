"""The CPU verdict on this machine, decided at run time from what oneDNN reports: the
probe, a real resnet tiny run's window and the what-if agree. Tests that do not apply to
this CPU (its fp16 convolutions do not run oneDNN's reference code; its fp16 convolutions
are not slower than fp32) skip, saying what the probe saw. Decided from measurements,
never from a CPU model, so they pass on AVX2-only, AVX512-BF16 and AMX machines."""

from __future__ import annotations

import pytest

from engine.analysis.cpu_evidence import (
    REFERENCE,
    REFERENCE_DOMINATES,
    cpu_verdict,
    mode_words,
    parse_onednn_verbose,
    reference_share,
)
from engine.analysis.whatif import projection
from engine.config import RunConfig
from engine.diagnostics.doctor import doctor_report
from engine.diagnostics.onednn_probe import refresh_probe
from engine.hardware.cpu_probe import conv_rates
from engine.hardware.devices import get_device, read_cpu_flags
from engine.traces.explain import analyze
from engine.training.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def probe(module_homes):
    """This machine's real oneDNN probe, stored in the module's data directory."""
    home = module_homes("cpu_probe")
    device = get_device("cpu")
    with pytest.MonkeyPatch.context() as patch:  # stored where the tests read it
        patch.setenv("PRECISION_LAB_HOME", str(home))
        return home, device, refresh_probe(device.key, device.name, source="test")


def _use(home, monkeypatch) -> None:
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))


def _fp16_conv(record: dict) -> tuple[float | None, str]:
    conv = record["dtypes"]["fp16"]["ops"].get("conv") or {}
    primitives = conv.get("primitives") or []
    ran = ", ".join(f"{p['prop_kind']} {p['implementation']}" for p in primitives) or (
        "no oneDNN primitive (ATen's own code)")
    return reference_share(primitives), ran


def _resnet_window(tmp_path, precision: str):
    windows = []
    cfg = RunConfig(model="resnet", size="tiny", precision=precision, steps=6, batch_size=4,
                    warmup_steps=1, profile_steps=2)
    train(cfg, "cpu", emit=lambda rows: None, run_dir=tmp_path,
          on_window=lambda window, dtype: windows.append((window, dtype)))
    (window, dtype), = windows
    return window, dtype


def test_the_probe_names_what_ran_each_dtype(probe):
    _home, _device, record = probe
    fp32 = record["dtypes"]["fp32"]["ops"]
    assert fp32["conv"]["flops_per_s"] > 0 and fp32["matmul"]["flops_per_s"] > 0
    # every CPU oneDNN supports runs an fp32 convolution in oneDNN
    assert {p["prop_kind"] for p in fp32["conv"]["primitives"]} >= {
        "forward_training", "backward_weights"}
    for dtype in ("bf16", "fp16"):
        assert set(record["dtypes"][dtype]["speed_vs_fp32"]) == {"matmul", "conv"}


def test_a_resnet_fp16_run_whose_convolutions_run_reference_code_says_so(
        probe, tmp_path, monkeypatch):
    home, device, record = probe
    _use(home, monkeypatch)
    share, ran = _fp16_conv(record)
    if share is None or share < REFERENCE_DOMINATES:
        pytest.skip(f"this CPU's fp16 convolutions do not run oneDNN's reference code "
                    f"(the probe: {ran}; reference share {share})")
    # before launch: doctor, Launch and the check word it from the probe
    before = mode_words(device, "fp16-amp")
    assert "reference code" in before["words"] and before["tone"] == "emulated"
    cpu = next(d for d in doctor_report(probe=False)["devices"] if d["kind"] == "cpu")
    assert cpu["modes"]["fp16-amp"]["reason"] == before["words"]
    window, dtype = _resnet_window(tmp_path, "fp16-amp")
    verdict = cpu_verdict(parse_onednn_verbose(window.onednn_log_path.read_text()), dtype,
                          read_cpu_flags())
    assert verdict["reference_share"] >= 0.5
    assert verdict["verdict"] == REFERENCE and "reference code" in verdict["headline"]


def test_a_resnet_fp16_run_gets_the_verdict_the_probe_predicts(probe, tmp_path, monkeypatch):
    """Where the probe saw no fp16 primitive, the run records none either (ATen's own
    code: emulated); where it saw oneDNN's, the run's share of reference code follows."""
    home, _device, record = probe
    _use(home, monkeypatch)
    share, _ran = _fp16_conv(record)
    window, dtype = _resnet_window(tmp_path, "fp16-amp")
    primitives = parse_onednn_verbose(window.onednn_log_path.read_text())
    verdict = cpu_verdict(primitives, dtype, read_cpu_flags())
    fp16_convs = [p for p in primitives if p.kind == "convolution" and p.src_dtype == "fp16"]
    if share is None:
        assert fp16_convs == [] and verdict["verdict"] != REFERENCE
    else:
        assert fp16_convs
        assert (verdict["verdict"] == REFERENCE) == (
            verdict["reference_share"] >= REFERENCE_DOMINATES)


def test_the_what_if_projects_fp16_resnet_slower_than_fp32_where_its_convs_are(
        probe, tmp_path, monkeypatch):
    home, _device, record = probe
    _use(home, monkeypatch)
    speed = record["dtypes"]["fp16"]["speed_vs_fp32"].get("conv")
    if speed is None or speed >= 0.8:
        pytest.skip(f"this CPU's fp16 convolutions are not clearly slower than fp32 in the "
                    f"probe ({speed}x fp32)")
    window, _dtype = _resnet_window(tmp_path, "fp32")
    result = analyze(window.trace_path)
    result["matrix_dtype"] = "fp32"
    projected = projection(result, None, conv_rates(record))
    fp16 = next(t for t in projected["targets"] if t["target"] == "fp16 on this device")
    assert projected["current"]["conv_share"] > 0.5  # a resnet's matrix work is convolutions
    assert fp16["speedup"] < 1.0, fp16["words"]
    assert "at the conv rate" in fp16["basis"]


def test_a_busy_stored_probe_is_measured_again_by_doctor(probe, monkeypatch):
    from engine.diagnostics.onednn_probe import cached_or_probe
    from engine.hardware.cpu_probe import stored_probe, write_probe

    home, device, record = probe
    _use(home, monkeypatch)
    write_probe(device.key, device.name, {**record, "busy": True, "measured_at": 1.0})
    again = cached_or_probe(device.key, device.name, source="test")
    assert again["measured_at"] > 1.0
    assert stored_probe(device.key, device.name)["measured_at"] == again["measured_at"]
