"""The README's runnable examples run as written (each in a fresh interpreter, in tmp_path).

A block preceded by ``<!-- readme-test: NAME -->`` is run; blocks named alike run in order in
one script. Keeping the README true is the point: an API change that breaks an example fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK = re.compile(
    r"<!-- readme-test: (?P<name>[\w-]+) -->\s*```(?P<lang>\w+)\n(?P<body>.*?)```", re.S
)

# Module the op-spec example names (its two functions are quoted in the example's comment).
ACME_OPS = textwrap.dedent("""
    def scale_add(x, y, *, alpha): return alpha * x + y
    def scale_add_np(x, y, *, alpha): return (alpha * x + y).astype(x.dtype)
    """)


def _examples() -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    for match in _BLOCK.finditer(README.read_text(encoding="utf-8")):
        found.setdefault(match["name"], []).append((match["lang"], match["body"]))
    return found


EXAMPLES = _examples()


def test_readme_marks_its_examples() -> None:
    assert {"quick-start", "op-spec", "op-spec-yaml", "torch-style"} <= set(EXAMPLES), sorted(
        EXAMPLES
    )


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_readme_example_runs(name: str, tmp_path: Path) -> None:
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
    assert result.returncode == 0, f"README example {name!r} failed:\n{result.stderr[-3000:]}"
    verifies = ("quick-start", "torch-style")  # these print verify() reports
    assert name not in verifies or result.stdout.count("Verification PASSED") == 2, result.stdout
    if (
        name == "quick-start"
    ):  # the second block runs a file whose custom node runs the kernel shown
        assert "['ScaleAdd']" in result.stdout, result.stdout
