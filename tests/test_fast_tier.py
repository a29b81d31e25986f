"""The fast tier's guard (tests/conftest.py), on a planted test folder run by a real pytest:
a fast test that starts a process fails and names it; the same test marked slow passes;
`-m fast` selects exactly the unmarked tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

PLANTED = '''
import subprocess, sys
import pytest

def test_pure():
    assert sum([1, 2]) == 3

def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.slow
def test_starts_a_process_and_says_so():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
'''


@pytest.mark.slow
def test_a_fast_test_that_starts_a_process_fails_naming_it(tmp_path):
    folder = tmp_path / "tests"
    folder.mkdir()
    shutil.copy(TESTS / "conftest.py", folder / "conftest.py")
    (folder / "test_planted.py").write_text(PLANTED)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = tests\naddopts = --strict-markers\n"
                                         "markers =\n    browser: b\n")

    def pytest_in(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=300,
        )

    everything = pytest_in("-rE")
    assert "3 passed, 1 error" in everything.stdout, everything.stdout[-2000:]
    assert "ERROR tests/test_planted.py::test_starts_a_process" in everything.stdout
    assert "this test started 1 process(es)" in everything.stdout
    assert "mark it @pytest.mark.slow" in everything.stdout
    fast = pytest_in("-m", "fast", "--collect-only")
    assert "2/3 tests collected (1 deselected)" in fast.stdout, fast.stdout[-1000:]
