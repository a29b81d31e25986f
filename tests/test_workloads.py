"""Your own workload (file or module, docs/workloads.md), the DataLoader input pipeline
and its data-wait measurement, and the `models` listing.

The slow-Dataset tests sleep instead of computing: a sleeping sample costs no CPU on
the shared 2-core box, so the shares they check do not depend on the neighbours.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import psutil
import pytest
import torch

from engine.config import ConfigError, RunConfig
from engine.training.loop import train
from engine.training.workload import WorkloadError
from engine.workloads import discover_workloads

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = REPO_ROOT / "examples" / "workloads" / "tiny_transformer.py"

# A Dataset whose samples take SAMPLE_S each and a model whose forward takes STEP_S:
# a batch costs 8 x 10 = 80 ms to load and 60 ms to train on. With 0 workers the loop
# waits 80 of every ~140 ms; 2 workers load one batch per 40 ms, faster than the 60 ms
# the loop consumes one, so after the first batches it waits only for a batch's hand-over
# (a few ms when a busy machine is slow to wake the loop).
SLOW_WORKLOAD = '''
"""A deliberately slow input pipeline."""
import time
import torch
from torch import nn
from engine.workloads import Workload

SAMPLE_S, STEP_S = 0.010, 0.060


class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        time.sleep(SAMPLE_S)
        x = torch.full((4,), float(index % 3))
        return x, index % 3


class SleepyLinear(nn.Linear):
    def forward(self, x):
        time.sleep(STEP_S)  # the "GPU" time of a step
        return super().forward(x)


def build(cfg):
    return Workload(model=SleepyLinear(4, 3), batches=Slow())
'''


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def no_children_left(wait_s: float = 10.0) -> bool:
    """No live child process within `wait_s` (a zombie is dead: another test's child not
    yet reaped). multiprocessing's resource tracker is this test process's own helper for
    its lifetime (started with the first DataLoader's semaphores), not a run's leftover."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        alive = [child for child in psutil.Process().children(recursive=True)
                 if _status(child) not in (psutil.STATUS_ZOMBIE, None)
                 and "resource_tracker" not in " ".join(_cmdline(child))]
        if not alive or time.monotonic() > deadline:
            return not alive
        time.sleep(0.1)


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _status(process: psutil.Process) -> str | None:
    try:
        return process.status()
    except psutil.Error:
        return None


@pytest.fixture
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def steady_share(rows: list[dict]) -> float:
    steady = [row for row in rows if row["phase"] == "steady"]
    return sum(r["data_wait_ms"] for r in steady) / sum(r["step_time_ms"] for r in steady)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_data_wait_is_most_of_the_step_without_workers_and_little_with_two(
        tmp_path, home, one_thread):
    path = write(tmp_path, "slow.py", SLOW_WORKLOAD)
    base = RunConfig(model="custom", workload=str(path), data="loader", batch_size=8,
                     steps=14, warmup_steps=4, profile=False, device="cpu", optimizer="sgd")
    shares = {}
    for workers in (0, 2):
        rows: list[dict] = []
        result = train(base.replace(num_workers=workers), "cpu", emit=rows.extend)
        assert result.status == "finished"
        assert all(row["data_wait_ms"] is not None for row in rows)
        assert all(row["h2d_copy_ms"] is None for row in rows)  # CPU: no copy to a device
        shares[workers] = steady_share(rows)
        assert result.data_wait_share == pytest.approx(shares[workers], rel=0.05)
        assert result.extra["input_pipeline"]["num_workers"] == workers
        assert no_children_left(), psutil.Process().children(recursive=True)
    print("steady data-wait share by workers:", shares)
    assert shares[0] > 0.5, shares
    assert shares[2] < 0.15, shares


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_worker_processes_end_when_the_user_model_raises_mid_run(tmp_path, home, one_thread):
    path = write(tmp_path, "breaks.py", '''
        import torch
        from torch import nn
        from engine.workloads import Workload

        class Numbers(torch.utils.data.Dataset):
            def __len__(self):
                return 1000
            def __getitem__(self, index):
                return torch.ones(4), 0

        class BreaksAtStep5(nn.Linear):
            calls = 0
            def forward(self, x):
                type(self).calls += 1
                if type(self).calls == 5:
                    raise ValueError("my layer broke")
                return super().forward(x)

        def build(cfg):
            return Workload(model=BreaksAtStep5(4, 2), batches=Numbers())
        ''')
    cfg = RunConfig(model="custom", workload=str(path), data="loader", num_workers=2,
                    persistent_workers=True, batch_size=4, steps=10, profile=False, device="cpu")
    with pytest.raises(WorkloadError) as info:
        train(cfg, "cpu", emit=lambda rows: None)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("workload breaks.py: training raised ValueError: my layer broke")
    assert isinstance(info.value.__cause__, ValueError)  # the user's traceback, chained
    assert no_children_left(), psutil.Process().children(recursive=True)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_example_workload_trains_from_the_cli(cli):
    done = cli("run", "--model-file", EXAMPLE, "--device", "cpu", "--steps", "25",
               "--batch-size", "8", "--seq-len", "32", "--no-profile", "--json", timeout=170)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["model"] == "custom"
    assert summary["final_loss"] < 0.75 * summary["first_loss"], summary
    assert summary["flops_per_step"] > 0 and summary["tokens_per_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_user_model_that_raises_shows_its_traceback_in_the_log_and_one_line_in_show(
        cli, home, tmp_path):
    path = write(tmp_path, "broken_workload.py", '''
        def helper_that_fails(cfg):
            raise ValueError(f"no such layer size: {cfg.batch_size}")

        def build(cfg):
            return helper_that_fails(cfg)
        ''')
    done = cli("run", "--model-file", path, "--device", "cpu", "--steps", "5", "--json")
    assert done.returncode == 1, done.stderr[-2000:]
    run_id = json.loads(done.stdout.strip().splitlines()[-1])["run_id"]
    shown = json.loads(cli("show", run_id, "--json").stdout.strip().splitlines()[-1])
    reason = shown["reason"]
    assert shown["status"] == "failed" and "\n" not in reason
    assert ("workload broken_workload.py: build() raised ValueError: no such layer size: 16"
            in reason), reason
    log = (home / "runs" / run_id / "worker.log").read_text()
    assert "in helper_that_fails" in log and 'raise ValueError(f"no such layer size' in log


def test_module_function_workloads_and_bad_names(tmp_path, monkeypatch, one_thread, home):
    package = tmp_path / "my_lab"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "work.py").write_text(EXAMPLE.read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = RunConfig(model="custom", workload="my_lab.work:build", steps=3, batch_size=4,
                    seq_len=8, profile=False, device="cpu")
    assert train(cfg, "cpu", emit=lambda rows: None).status == "finished"
    with pytest.raises(WorkloadError, match="defines no function nothing"):
        train(cfg.replace(workload="my_lab.work:nothing"), "cpu", emit=lambda rows: None)
    with pytest.raises(WorkloadError, match="importing no_such_pkg.x raised ModuleNotFoundError"):
        train(cfg.replace(workload="no_such_pkg.x:build"), "cpu", emit=lambda rows: None)
    for bad in ("rm -rf /", "os.system('x')", "a:b:c"):
        with pytest.raises(ConfigError) as info:
            RunConfig(model="custom", workload=bad)
        assert info.value.field == "workload" and "docs/workloads.md" in info.value.fix


def test_build_must_return_a_workload(tmp_path, home):
    path = write(tmp_path, "wrong.py", "def build(cfg):\n    return {'model': None}\n")
    with pytest.raises(WorkloadError, match="build\\(\\) returned dict"):
        train(RunConfig(model="custom", workload=str(path), steps=2, device="cpu",
                        profile=False), "cpu", emit=lambda rows: None)


def test_the_workload_folder_is_listed_without_running_its_files(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    write(tmp_path, "dangerous.py", f'"""Looks harmless."""\nopen({str(marker)!r}, "w")\n')
    write(tmp_path, "_private.py", "")
    write(tmp_path, "notes.txt", "")
    monkeypatch.setenv("PRECISION_LAB_WORKLOADS", str(tmp_path))
    found = discover_workloads()
    assert [w.name for w in found] == ["dangerous.py"] and found[0].summary == "Looks harmless."
    assert not marker.exists()
    monkeypatch.delenv("PRECISION_LAB_WORKLOADS")
    assert discover_workloads() == []


def test_loader_options_are_bounded_and_unused_ones_are_warned_about():
    from engine.admission import check_runnable

    unused = RunConfig(num_workers=2, pin_memory=True)  # synthetic data: no DataLoader
    assert unused.unused_loader_options == ["num_workers", "pin_memory"]
    _device, warnings = check_runnable(unused.replace(device="cpu"))
    assert any("num_workers, pin_memory unused" in w and "data loader" in w for w in warnings)
    assert RunConfig(data="loader", persistent_workers=True).unused_loader_options == [
        "persistent_workers"]  # no workers to keep
    assert RunConfig(data="loader", num_workers=2, persistent_workers=True,
                     pin_memory=True).unused_loader_options == []
    with pytest.raises(ConfigError) as info:
        RunConfig(data="loader", num_workers=99)
    assert info.value.field == "num_workers" and "32" in info.value.fix
    with pytest.raises(ConfigError) as info:
        RunConfig(data="loader", prefetch_factor=0)
    assert info.value.field == "prefetch_factor"
    with pytest.raises(ConfigError) as info:
        RunConfig(data="disk")
    assert info.value.field == "data" and "synthetic, loader" in info.value.fix


@pytest.mark.timeout(120)
def test_builtin_loader_reads_stdlib_text_and_decoded_jpeg_files(home, one_thread):
    from engine.training.input_pipeline import JpegImages, StdlibText, image_cache_dir
    from engine.training.models import task_shape

    cfg = RunConfig(model="gpt", data="loader", seq_len=32, device="cpu")
    text = StdlibText(cfg.seq_len, task_shape(cfg), seed=0)
    inputs, targets = text[0]
    assert inputs.shape == (32,) and torch.equal(inputs[1:], targets[:-1])
    assert bytes(inputs.tolist()).isascii()  # Python source
    images = JpegImages(16, 10, seed=0)
    folder = image_cache_dir(16)
    assert folder.is_dir() and len(list(folder.glob("*.jpg"))) == len(images) == 512
    image, label = images[3]
    assert image.shape == (3, 16, 16) and 0 <= label < 10
    assert JpegImages(16, 10, seed=1).folder == folder  # written once, read after
    rows: list[dict] = []
    result = train(RunConfig(model="resnet", data="loader", image_size=16, batch_size=8,
                             steps=6, profile=False, device="cpu"), "cpu", emit=rows.extend)
    assert result.status == "finished" and result.flops_per_step > 0
    assert result.extra["input_pipeline"]["data"] == "loader"


@pytest.mark.slow
def test_models_lists_every_name_with_its_parameter_count(cli):
    done = cli("models", "--json")
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout.strip().splitlines()[-1])
    names = {row["name"] for row in listing["models"]}
    from engine.architectures import ARCHITECTURES

    assert names == {"mlp", "resnet", "gpt", *ARCHITECTURES}
    for row in listing["models"]:
        assert row["param_count"] and isinstance(row["installed"], bool)
        assert row["installed"] or "precision-lab[models]" in row["reason"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_slow_input_pipeline_run_is_called_input_bound(tmp_path, home, store, wait_for):
    """A real worker run (profiler window on) with the slow Dataset and 0 workers: the
    stored bound-by verdict says input-bound, with the measured data wait."""
    from engine.run.launcher import launch
    from engine.schema import FINAL_STATUSES

    path = write(tmp_path, "slow.py", SLOW_WORKLOAD)
    cfg = RunConfig(model="custom", workload=str(path), data="loader", batch_size=8,
                    steps=16, warmup_steps=4, profile=True, profile_steps=3, device="cpu",
                    optimizer="sgd")
    run_id = launch(cfg, store)
    wait_for(lambda: store.get_run(run_id).status in FINAL_STATUSES, 200)
    run = store.get_run(run_id)
    assert run.status == "finished", run.reason
    verdict = run.summary["explain"]["bound_by"]
    assert verdict["verdict"] == "input", verdict
    assert verdict["numbers"]["data_wait_source"] == "data_wait_ms passed in"
    assert verdict["sentence"].startswith("Input-bound: waiting for data took")
