"""The fast tier starts no torch.distributed process group: the guard in
tests/conftest.py watches every fast test, and a fast test that makes a real gloo
group fails, naming it (checked in a separate pytest session, so the slow tier)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist  # loaded before the test: the guard wraps what is loaded
from torch.distributed import distributed_c10d

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def test_a_fast_test_runs_with_process_group_creation_watched():
    # every way to a group (init_process_group, new_group, a device mesh) passes here
    assert distributed_c10d._new_process_group_helper.__name__ == "noted_make_group"
    assert not dist.is_initialized()


GROUP_TEST = '''
import torch.distributed as dist


def test_makes_a_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}",
                            rank=0, world_size=1)
    dist.destroy_process_group()
'''


@pytest.mark.slow
def test_a_fast_test_that_starts_a_process_group_fails_naming_it(tmp_path):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_group.py").write_text(GROUP_TEST)
    # one OpenMP thread: the check needs no more, and the box's two cores are shared
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "fast", "-q", "-p", "no:cacheprovider",
         "-c", str(tmp_path / "conftest.py"), "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=180,
        stdin=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "a torch.distributed process group" in output, output
    assert "mark it @pytest.mark.slow" in output, output
