"""The runnable examples of the README and the docs site run as written (each in a fresh
interpreter, in tmp_path).

A block preceded by ``<!-- readme-test: NAME -->`` in README.md or any docs/**/*.md page is run;
blocks named alike run in order in one script (a name belongs to one page). Keeping the pages
true is the point: an API change that breaks an example fails here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").rglob("*.md")))
_BLOCK = re.compile(
    r"<!-- readme-test: (?P<name>[\w-]+) -->\s*```(?P<lang>\w+)\n(?P<body>.*?)```", re.S
)

# Module the op-spec example names (its two functions are quoted in the example's comment).
ACME_OPS = textwrap.dedent("""
    def scale_add(x, y, *, alpha): return alpha * x + y
    def scale_add_np(x, y, *, alpha): return (alpha * x + y).astype(x.dtype)
    """)


def _examples() -> tuple[dict[str, list[tuple[str, str]]], dict[str, set[Path]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    pages: dict[str, set[Path]] = {}
    for page in PAGES:
        for match in _BLOCK.finditer(page.read_text(encoding="utf-8")):
            found.setdefault(match["name"], []).append((match["lang"], match["body"]))
            pages.setdefault(match["name"], set()).add(page)
    return found, pages


EXAMPLES, EXAMPLE_PAGES = _examples()


def test_readme_marks_its_examples() -> None:
    expected = {
        "quick-start",
        "compile",
        "export-custom-op",
        "op-spec",
        "op-spec-yaml",
        "torch-style",
        "half-precision",
        "external-data",
        "msda",
    }
    assert expected <= set(EXAMPLES), sorted(EXAMPLES)
    shared = {name: sorted(map(str, p)) for name, p in EXAMPLE_PAGES.items() if len(p) > 1}
    assert not shared, f"an example name belongs to one page: {shared}"


# examples that need an optional extra: skipped, with the reason, where it is not installed
NEEDS_EXTRA = {"real-models": ("transformers", "the [hf] extra")}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_readme_example_runs(name: str, tmp_path: Path) -> None:
    if name in NEEDS_EXTRA and importlib.util.find_spec(NEEDS_EXTRA[name][0]) is None:
        pytest.skip(f"example {name!r} needs {NEEDS_EXTRA[name][1]}")
    (tmp_path / "acme_ops.py").write_text(ACME_OPS, encoding="utf-8")
    script = []
    for lang, body in EXAMPLES[name]:
        if lang == "yaml":
            (tmp_path / "acme.yaml").write_text(body, encoding="utf-8")
        else:
            assert lang == "python", f"{name}: cannot run a {lang} block"
            script.append(body)
    result = subprocess.run(
        [sys.executable, "-c", "\n".join(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, f"example {name!r} failed:\n{result.stderr[-3000:]}"
    verifies = ("quick-start", "export-custom-op", "torch-style")  # these print verify() reports
    assert name not in verifies or result.stdout.count("Verification PASSED") == 2, result.stdout
    if name == "export-custom-op":  # the second block runs a file whose custom node runs the kernel
        assert "['ScaleAdd']" in result.stdout, result.stdout
    if name == "bev-pool":
        assert "['BEVPoolV2']" in result.stdout and "True" in result.stdout, result.stdout
