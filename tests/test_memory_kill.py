"""A trainer killed by the kernel's OOM killer is named so from evidence, on cgroup v1 and
v2 hosts: the oom_kill count of the run's memory cgroup (v2 memory.events, v1
memory.oom_control), else the machine's (/proc/vmstat). A SIGKILL from a user is not.

The end-to-end test puts a real run's supervisor into a child memory cgroup with a limit
its workload exceeds; it needs a memory cgroup this user may create (root on most hosts)
and is skipped, with the reason, where there is none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from engine.config import RunConfig
from engine.proc import PROJECT_ROOT, cgroup_oom_kills, child_env, sigkill_cause
from engine.schema import FINAL_STATUSES, RUNNING, WORKER_LOG

MIB = 2**20


def _fake_host(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A /proc/<pid>/cgroup and a /sys/fs/cgroup tree as the kernel lays them out."""
    proc, sys_cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "123").mkdir(parents=True)
    (proc / "123" / "cgroup").write_text(proc_cgroup)
    (proc / "vmstat").write_text("pgfault 10\noom_kill 7\n")
    for relative, text in files.items():
        (sys_cgroup / relative).parent.mkdir(parents=True, exist_ok=True)
        (sys_cgroup / relative).write_text(text)
    return proc, sys_cgroup


V1_PROC_CGROUP = ("9:name=systemd:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n")
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"


def test_the_count_is_read_from_cgroup_v2_v1_or_the_machine(tmp_path):
    proc, root = _fake_host(tmp_path / "v2", "0::/user.slice/run-1.scope\n",
                            {"user.slice/run-1.scope/memory.events":
                             "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n"})
    assert cgroup_oom_kills(123, root, proc) == ("cgroup v2", 2)
    proc, root = _fake_host(tmp_path / "v1", V1_PROC_CGROUP,
                            {"memory/process_api/abc/memory.oom_control": V1_OOM_CONTROL})
    assert cgroup_oom_kills(123, root, proc) == ("cgroup v1", 3)
    # a container without a cgroup namespace: its own cgroup is mounted as the root
    proc, root = _fake_host(tmp_path / "v1ns", V1_PROC_CGROUP,
                            {"memory/memory.oom_control": V1_OOM_CONTROL})
    assert cgroup_oom_kills(123, root, proc) == ("cgroup v1", 3)
    # the v2 root cgroup has no memory.events: the machine's count
    proc, root = _fake_host(tmp_path / "root", "0::/\n", {})
    assert cgroup_oom_kills(123, root, proc) == ("machine", 7)
    assert cgroup_oom_kills(999, root, tmp_path / "nothing") is None


def test_this_hosts_count_is_read_whatever_its_cgroup_version():
    found = cgroup_oom_kills()
    assert found is not None and found[0] in ("cgroup v2", "cgroup v1", "machine"), found
    assert found[1] >= 0
    # nothing was killed meanwhile: a SIGKILL now is a user's, said so
    assert sigkill_cause(found).startswith(" (not the kernel's OOM killer")
    assert sigkill_cause(None) == ""


# ---------------------------------------------------------------------------------------
# end to end: a real OOM kill in a child memory cgroup

HOG_WORKLOAD = '''
import torch
from torch import nn
from engine.workloads import Workload


def build(cfg):
    hog = bytearray({hog_mib} * 2**20)
    hog[::4096] = b"1" * len(hog[::4096])  # touched: resident, charged to the cgroup
    return Workload(model=nn.Linear(4, 3),
                    batches=lambda step: (torch.randn(cfg.batch_size, 4),
                                          torch.randint(0, 3, (cfg.batch_size,))))
'''


def _own_memory_cgroup() -> tuple[str, Path] | None:
    """(version, folder) of this process's memory cgroup, where children can be made."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _hierarchy, controllers, path = line.split(":", 2)
        relative = path.strip().lstrip("/")
        if "memory" in controllers.split(","):
            for folder in (Path("/sys/fs/cgroup/memory") / relative, Path("/sys/fs/cgroup/memory")):
                if (folder / "memory.limit_in_bytes").exists():
                    return "v1", folder
        if controllers == "":
            folder = Path("/sys/fs/cgroup") / relative
            if "memory" in (folder / "cgroup.subtree_control").read_text(errors="replace") \
                    if (folder / "cgroup.subtree_control").exists() else False:
                return "v2", folder
    return None


@pytest.fixture
def limited_cgroup():
    """A child memory cgroup limited to 900 MiB; removed at teardown (empty by then)."""
    found = _own_memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup hierarchy this process can make children in")
    version, parent = found
    child = parent / f"precision-lab-test-{os.getpid()}"
    try:
        child.mkdir()
        limit_file = "memory.limit_in_bytes" if version == "v1" else "memory.max"
        (child / limit_file).write_text(str(900 * MIB))
        if version == "v1":  # no swap to page out to either, where swap accounting is on
            memsw = child / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(900 * MIB))
    except OSError as exc:
        with_rmdir(child)
        pytest.skip(f"cannot make a limited memory cgroup here: {exc}")
    yield child
    deadline = time.monotonic() + 10
    while (child / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    with_rmdir(child)


def with_rmdir(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_trainer_killed_by_the_oom_killer_is_named_so(store, tmp_path, wait_for,
                                                        limited_cgroup):
    workload = tmp_path / "hog_workload.py"
    workload.write_text(textwrap.dedent(HOG_WORKLOAD.format(hog_mib=2048)))
    run_id = store.create_run(RunConfig(model="custom", workload=str(workload), steps=5,
                                        batch_size=4, profile=False, device="cpu"), "cpu", "CPU")
    # The supervisor starts in the limited cgroup (it joins it before it execs), so its
    # trainer does too: the cgroup the supervisor reads is the one that was over its limit.
    join_then_exec = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
                      "os.execv(sys.executable, [sys.executable, '-m', 'engine.run.worker', "
                      "sys.argv[2]])")
    with open(store.run_dir(run_id) / WORKER_LOG, "ab") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-c", join_then_exec, str(limited_cgroup / "cgroup.procs"), run_id],
            cwd=str(PROJECT_ROOT), env=child_env(store.home), stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        run = wait_for(lambda: (r := store.get_run(run_id)).status in FINAL_STATUSES and r, 150,
                       message=lambda: f"run {run_id} to end: "
                       f"{(store.run_dir(run_id) / WORKER_LOG).read_text()[-2000:]}")
        supervisor.wait(timeout=30)
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
    assert run.status == "failed", run.reason
    assert run.reason.startswith("worker exited with signal 9 (SIGKILL) at step 0 (the "
                                 "kernel's OOM killer"), run.reason
    assert not [p for p in psutil.process_iter(["cmdline"])
                if run_id in " ".join(p.info["cmdline"] or [])]


def test_a_user_sigkill_is_not_blamed_on_the_oom_killer(store):
    from engine.run.worker import _record_exit

    run_id = store.create_run(RunConfig(model="mlp", size="tiny", steps=5, profile=False,
                                        device="cpu"), "cpu")
    store.set_status(run_id, RUNNING)
    _record_exit(store, run_id, -signal.SIGKILL, stop_requested=False,
                 oom_kills_before=cgroup_oom_kills())
    reason = store.get_run(run_id).reason
    assert reason.startswith("worker exited with signal 9 (SIGKILL) at step 0 (not the "
                             "kernel's OOM killer: a user or another process sent it)"), reason
