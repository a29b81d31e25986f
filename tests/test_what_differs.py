"""B against A says what differs before any ratio (device, precision, the work itself; for
two runs their model, batch and precision from the configs), and a speedup check's progress
is its rounds, not "0/60 steps"."""

from __future__ import annotations

from pathlib import Path

from engine.analysis.runs import progress_text, run_row
from engine.config import RunConfig
from engine.traces.explain import config_differences, explain_diff

TRACES = Path(__file__).resolve().parent / "data" / "traces"
V100_RESNET = TRACES / "v100_resnet50_kineto_v1.json.gz"
H100_BERT = TRACES / "h100_bert_small_tracelens.json.gz"


def test_two_different_models_on_two_gpus_are_named_so_before_the_ratio():
    diff = explain_diff(V100_RESNET, H100_BERT)
    assert diff["differs"][0] == "device (Tesla V100-DGXS-32GB vs NVIDIA H100 80GB HBM3)"
    assert diff["differs"][1] == "precision (fp32 vs bf16)"
    assert diff["differs"][2].startswith("the work (their time overlaps 3 % by what launched")
    first = diff["caveats"][0]
    assert (
        first["severity"] == "warning"
        and "compares two workloads, not two precisions" in first["text"]
    )


def test_the_same_model_at_another_precision_is_the_same_work(tmp_path):
    """Kernel names carry the dtype (bf16_s16816gemm, <c10::BFloat16>): the same model in
    fp32 launches other names from the same CPU ops. Made from the real H100 BERT trace:
    every kernel renamed to its fp32 form, the matrix kernels 3x longer."""
    import gzip
    import json

    data = json.loads(gzip.decompress(H100_BERT.read_bytes()))
    for event in data["traceEvents"]:
        if event.get("cat") == "kernel":
            name = event["name"]
            if "gemm" in name:
                event["dur"] = event["dur"] * 3
            event["name"] = (name.replace("bf16_s16816gemm", "sgemm").replace("_bf16", "")
                             .replace("c10::BFloat16", "float"))
    fp32 = tmp_path / "h100_bert_fp32_like.json"
    fp32.write_text(json.dumps(data))
    diff = explain_diff(H100_BERT, fp32)
    assert not any(d.startswith("the work") for d in diff["differs"]), diff["differs"]
    assert not any("different work" in c["text"] for c in diff["caveats"])


def test_a_trace_against_itself_differs_in_nothing():
    diff = explain_diff(H100_BERT, H100_BERT)
    assert diff["differs"] == []
    assert not any("different work" in c["text"] for c in diff["caveats"])


def test_two_runs_configs_say_model_batch_and_precision():
    a = RunConfig(model="gpt", size="small", batch_size=8, precision="fp32")
    b = RunConfig(model="mlp", size="small", batch_size=16, precision="bf16-amp")
    assert config_differences(a, b) == [f"model ({a.model_label} vs {b.model_label})",
                                        "batch (8 vs 16)", "precision (fp32 vs bf16-amp)"]
    assert config_differences(a, a) == []


def test_a_speedup_check_on_runs_shows_rounds_not_steps(store):
    check = RunConfig(model="mlp", size="tiny", device="cpu", speedup_modes="fp32,bf16-amp")
    run_id = store.create_run(check, "cpu", "CPU")
    assert progress_text(store.get_run(run_id)) == "0 rounds, 2 modes"
    store.merge_summary(run_id, {"speedup": {"rounds": 23}})
    assert run_row(store.get_run(run_id))["steps"] == "23 rounds, 2 modes"
    plain = store.create_run(RunConfig(model="mlp", size="tiny", steps=60, device="cpu"), "cpu")
    assert run_row(store.get_run(plain))["steps"] == "0/60"
