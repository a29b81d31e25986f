"""The supported PyTorch range and the optional parts: decided from metadata (no torch
import), the same range in requirements.txt, pyproject.toml and engine/support.py, and a
too-old PyTorch refused where a run is admitted, naming the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from engine import support
from engine.admission import check_runnable
from engine.config import ConfigError, RunConfig

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("version", ["2.6.0", "2.11.0+cu130", "2.13.0+cpu", "2.13.1"])
def test_versions_in_the_range_are_supported_without_a_word(version):
    result = support.torch_support(version)
    assert result.ok and result.warning is None and result.problem is None


def test_an_older_torch_is_refused_with_the_range_to_install():
    result = support.torch_support("2.4.1+cu121")
    assert not result.ok
    assert "torch 2.4.1+cu121 is older than 2.6" in result.problem
    assert "pip install 'torch>=2.6,<2.14'" in result.problem


def test_a_newer_torch_runs_with_a_warning_that_it_is_untested():
    result = support.torch_support("2.15.0")
    assert result.ok and result.problem is None
    assert "newer than 2.13, the newest this project is tested on" in result.warning


def test_a_version_that_is_not_numbers_is_allowed_with_a_warning():
    result = support.torch_support("nightly")
    assert result.ok and "not recognised" in result.warning


def test_the_installed_torch_is_read_from_metadata_and_is_supported():
    import torch

    result = support.torch_support()
    assert result.version.split("+")[0] == torch.__version__.split("+")[0]
    assert result.ok  # CI's build is inside the range it declares


def test_requirements_pyproject_and_the_code_declare_one_range():
    requirements = (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8")
    declared = re.findall(r"^torch\S*", requirements, flags=re.MULTILINE)
    assert declared == [support.TORCH_RANGE]
    numbers = [int(n) for n in re.match(r"torch>=(\d+)\.(\d+),<(\d+)\.(\d+)$",
                                             support.TORCH_RANGE).groups()]
    assert tuple(numbers[:2]) == support.TORCH_OLDEST
    assert (numbers[2], numbers[3] - 1) == support.TORCH_NEWEST_TESTED  # below the next release


def test_ci_pins_a_build_inside_the_range():
    pins = dict(line.split("==") for line in (REPO_ROOT / "constraints-ci.txt").read_text(
        encoding="utf-8").splitlines() if "==" in line and not line.startswith("#"))
    assert support.torch_support(pins["torch"]).ok
    assert support.torch_support(pins["torch"]).warning is None
    dev = (REPO_ROOT / "requirements-dev.txt").read_text(encoding="utf-8")
    assert "-c constraints-ci.txt" in dev.splitlines()


def test_pyproject_has_the_extras_and_all_names_them():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert {"models", "export", "ray", "bench", "all"} <= set(extras)
    assert extras["all"] == ["precision-lab[models,export,ray,bench]"]
    # every optional part the doctor lists is installed by the extra it names
    for extra, module, _ in support.OPTIONAL_PARTS:
        assert extra in extras, (extra, module)


def test_optional_parts_say_what_they_are_for_and_how_to_install():
    parts = {part.module: part.to_dict() for part in support.optional_parts()}
    assert parts["torchao"]["install"] == "pip install torchao"
    assert parts["torchvision"]["install"] == 'pip install "precision-lab[models]"'
    assert "fp8" in parts["torchao"]["needed_for"]
    assert all(isinstance(part["installed"], bool) for part in parts.values())


def test_a_run_is_not_admitted_on_a_torch_older_than_the_range(monkeypatch):
    monkeypatch.setattr(support, "installed_version", lambda name: "2.4.0")
    with pytest.raises(ConfigError) as error:
        check_runnable(RunConfig(model="mlp", size="tiny", device="cpu"))
    assert error.value.field == "torch" and error.value.value == "2.4.0"
    assert "pip install 'torch>=2.6,<2.14'" in error.value.fix


def test_a_run_on_a_newer_torch_is_admitted_with_the_warning(monkeypatch):
    monkeypatch.setattr(support, "installed_version", lambda name: "2.15.0")
    _device, warnings = check_runnable(RunConfig(model="mlp", size="tiny", device="cpu"))
    assert any("newer than 2.13" in warning for warning in warnings)
