"""`classify` and `kernels` commands (engine.cli.kernels).

In-process through a tiny argparse harness (what engine/cli/main.py does with
add_subparsers), and end to end through `python -m engine`.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import kernels as cli_kernels

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "traces"
BERT = TRACES / "h100_bert_small_tracelens.json.gz"
GP100 = TRACES / "gp100_pascal_hta.json.gz"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engine")
    cli_kernels.add_subparsers(parser.add_subparsers(dest="command", required=True))
    return parser


def _run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return args.func(args)


def test_classify_names_from_arguments(capsys):
    assert _run(["classify", "volta_sgemm_128x32_nt", "nvjet_tst_192x8_64x8_4x1_v_bz_TNT",
                 "triton_mm_3"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "volta_sgemm_128x32_nt\tgemm\tno\tfp32",
        "nvjet_tst_192x8_64x8_4x1_v_bz_TNT\tgemm\tyes\tbf16",
        "triton_mm_3\tgemm\tunknown\t",
    ]


def test_classify_names_from_stdin(capsys, monkeypatch):
    names = ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>"
             "(cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4::Params)\n\nMemset (Device)\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO(names))
    assert _run(["classify"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[1:] for line in lines] == [
        ["gemm", "yes", "tf32"], ["memcpy/memset", "no", ""]]
    assert lines[0].split("\t")[0].startswith("void cutlass::Kernel<")


def test_kernels_json(capsys):
    assert _run(["kernels", str(BERT), "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    summary = json.loads(out)
    assert {"device", "total_kernel_us", "tensor_core_us", "tensor_core_share", "categories",
            "top_kernels", "verdict"} <= set(summary)
    assert summary["total_kernel_us"] == 307.197
    assert summary["tensor_core_us"] == 235.006
    assert {"name", "total_us", "count", "tensor_core", "dtype", "reason"} <= set(
        summary["top_kernels"][0])


def test_kernels_text_report_never_says_100_percent_beside_a_listed_op(capsys):
    assert _run(["kernels", str(TRACES / "h100_qwen_tracelens.json.gz")]) == 0
    out = capsys.readouterr().out
    assert "Matrix ops that ran without Tensor Cores" in out
    [line] = [line for line in out.splitlines() if line.startswith("Kernel time")]
    assert line.endswith("(99.98 % of it on Tensor Cores)")


def test_kernels_text_report(capsys):
    assert _run(["kernels", str(GP100)]) == 0
    out = capsys.readouterr().out
    assert "Device: Quadro GP100 (compute capability 6.0)" in out
    assert "Tensor Cores: no" in out
    assert "Top kernels" in out
    assert "Matrix ops that ran without Tensor Cores" in out
    assert "no Tensor Core hardware on this GPU" in out


@pytest.mark.parametrize("content", [None, b"not json at all", b'{"foo": 1}'])
def test_kernels_bad_file_exits_2_naming_the_path(tmp_path, capsys, content):
    path = tmp_path / "broken_trace.json"
    if content is not None:
        path.write_bytes(content)
    assert _run(["kernels", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(path) in captured.err
    assert "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1


# --- end to end through `python -m engine` ---------------------------------------------

def _engine(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *argv], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_python_m_engine_classify():
    result = _engine("classify", stdin="volta_h884gemm_64x128_ldg8_nn\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "volta_h884gemm_64x128_ldg8_nn\tgemm\tyes\tfp16\n"


@pytest.mark.slow
def test_python_m_engine_kernels_json_and_missing_file(tmp_path):
    result = _engine("kernels", str(GP100), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["device"], summary["tensor_core_us"]) == ("Quadro GP100", 0.0)
    missing = tmp_path / "missing.json.gz"
    result = _engine("kernels", str(missing))
    assert result.returncode == 2
    assert str(missing) in result.stderr and "Traceback" not in result.stderr


def test_kernels_step_narrows_the_tensor_core_breakdown_too(capsys):
    """--step N: the accounting and the kernel figures cover the same 900 kernels."""
    assert _run(["kernels", str(TRACES / "a100_conv_nccl_hta.json.gz"), "--step", "5",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kernel_count"] == summary["accounting"]["kernel_count"] == 900
    assert summary["total_kernel_us"] == summary["accounting"]["kernel_us"]
    assert summary["breakdown_scope"] == "the kernels of ProfilerStep#5"
    assert _run(["kernels", str(TRACES / "a100_conv_nccl_hta.json.gz")]) == 0
    assert "in 2,700 kernels (every kernel in the trace)" in capsys.readouterr().out


def test_kernels_takes_run_ids_and_compares_two_runs_with_their_caveats(tmp_path, monkeypatch,
                                                                       capsys):
    """`kernels RUN_A RUN_B --diff`: the runs' profiler windows, labelled by the runs, with
    the caveats Compare shows; an unknown id or a run without a trace says so."""
    import shutil

    from engine.config import RunConfig
    from engine.schema import TRACE_FILENAME
    from engine.store import Store

    monkeypatch.setenv("PRECISION_LAB_HOME", str(tmp_path / "lab"))
    store = Store(tmp_path / "lab")
    ids = []
    for name, trace in (("a100 tf32", "a100_conv_nccl_hta.json.gz"),
                        ("h100 bf16", "h100_bert_small_tracelens.json.gz")):
        run_id = store.create_run(RunConfig(model="gpt", name=name), "cuda:0", "recorded GPU")
        shutil.copy(TRACES / trace, store.run_dir(run_id) / TRACE_FILENAME)
        store.set_status(run_id, "finished")
        ids.append(run_id)
    assert _run(["kernels", ids[0], ids[1], "--diff"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("A (a100 tf32): ") and "\nB (h100 bf16): " in out
    assert "note: From the profiled steps only (3 of a100 tf32, 1 of h100 bf16)" in out
    assert "warning: A ran on NVIDIA A100-PG509-200, B on NVIDIA H100 80GB HBM3" in out
    assert _run(["kernels", ids[0], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernel_count"] == 2700

    bare = store.create_run(RunConfig(model="gpt"), "cpu", "cpu")
    assert _run(["kernels", bare]) == 2
    assert f"run {bare} has no profiler trace" in capsys.readouterr().err
    assert _run(["kernels", "20991231-000000-nosuch"]) == 2
    assert "neither a trace file nor a run id" in capsys.readouterr().err
