"""The examples in docstrings are run: every module of the package whose source holds one (a
`>>>` line) passes doctest, so an example that goes stale (shim/policy.py's once showed the old
default mark) fails here. And every relative link in README.md and docs/*.md points at a file
that exists, and at a heading of it where the link names one (`#anchor`)."""
from __future__ import annotations

import doctest
import importlib
import re
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


def _prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text with fenced code blocks blanked (line numbers kept)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation other than - and _
    dropped, spaces to -, a repeated anchor numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_relative_links_in_the_docs_resolve():
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(_prose_lines(doc.read_text(encoding="utf-8")), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                file = (doc.parent / path) if path else doc
                where = f"{doc.relative_to(ROOT)}:{number}: {target}"
                if not file.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)
