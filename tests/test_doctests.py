"""The examples in docstrings are run: every module of the package whose source holds one (a
`>>>` line) passes doctest, so an example that goes stale (shim/policy.py's once showed the old
default mark) fails here."""
from __future__ import annotations

import doctest
import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def modules_with_examples() -> list[str]:
    """The package's modules (pyproject.toml's package-dir: inceptionn.X in folder X) whose
    source has a `>>> ` line."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = []
    for package, folder in sorted(dirs.items()):
        for path in sorted((ROOT / folder).glob("*.py")):
            if any(line.lstrip().startswith(">>> ") for line in path.read_text(encoding="utf-8").splitlines()):
                found.append(package if path.stem == "__init__" else f"{package}.{path.stem}")
    return found


MODULES = modules_with_examples()


def test_the_examples_are_found():
    assert "inceptionn.shim.policy" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), report=True)
    assert result.attempted > 0 and result.failed == 0, result
