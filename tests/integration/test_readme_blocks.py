"""Every code block of README.md and of the docs site (docs/**/*.md) runs as written and shows
what it says.

`test_readme.py` runs the blocks marked ``<!-- readme-test: NAME -->`` (whole examples);
`test_native_user_deploy.py` runs the "Write a kernel in C++" page's files and command. This
file covers the rest: every other ``python`` block runs in a fresh interpreter in ``tmp_path``
after the context the surrounding prose assumes (``PRELUDES``: the ``model``/``x``/``m.onnx``
the block names, written here, not on the page), followed by a check that it did what the
page says; the ``onnx-custom`` command of a ``console`` block runs and prints the lines shown.
A block that none of these cover fails `test_every_readme_block_is_covered`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
_FENCE = re.compile(
    r"(?P<marker><!-- readme-test: [\w-]+ -->\s*)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S
)


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    body: str
    marked: bool

    @property
    def key(self) -> str:
        """The block's first code line: how the tables below name it."""
        return next(line.strip() for line in self.body.splitlines() if line.strip())


def readme_blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(ROOT).as_posix()
        blocks += [
            Block(name, text[: m.start()].count("\n") + 1, m["lang"], m["body"], bool(m["marker"]))
            for m in _FENCE.finditer(text)
        ]
    return blocks


# -- context the prose assumes, and what each block must show ---------------------------------

_CONV_MODEL = """
import onnx, torch, onnx_custom

class Model(torch.nn.Module):  # forward(self, x): the dynamic_shapes key is its parameter name
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))

model, x = Model().eval(), torch.randn(2, 3, 8, 8)
"""

_MY_ADD_FILE = """
import numpy as np, onnx, onnx_custom
from onnx import TensorProto, helper
node = helper.make_node("my_add", ["a", "b"], ["y"], domain="custom", alpha=3.0)
inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "ab"]
graph = helper.make_graph(
    [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
opsets = [helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)]
onnx.save(helper.make_model(graph, ir_version=10, opset_imports=opsets), "m.onnx")
"""

_DCN_FILE = """
import subprocess, onnx_custom
from onnx_custom.models import deform_conv
model, args = deform_conv.Model().eval(), deform_conv.example_inputs()
# onnx_custom::DeformConv2d nodes
onnx_custom.export(model, args, "dcn.onnx", exporter="torchscript", opset=11)
# the README's bash block above
subprocess.run(["onnx-custom", "build-library", "-o", "dist/"], check=True, capture_output=True)
"""

# a model whose export fails verification: its custom node's registered kernel is wrong
_FAILING_MODEL = """
import numpy as np, torch, onnx_custom

@torch.library.custom_op("readme::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@twice.register_fake
def _(x):
    return torch.empty_like(x)

onnx_custom.register_custom_op_symbolic(
    "readme::twice", lambda g, x: g.op("readme::Twice", x).setType(x.type()), 9
)

@onnx_custom.runtime.kernel("readme::Twice", inputs=["x"], outputs=["y"], shape_fn="like:x")
def twice_kernel(x):
    return x * 3  # the bug verify catches

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.ops.readme.twice(x)

model, x = Model(), torch.randn(2, 3)
"""


@dataclasses.dataclass(frozen=True)
class Run:
    prelude: str = ""
    check: str = ""  # runs after the block, in its namespace
    stdout: tuple[str, ...] = ()  # text the run must print
    slow: bool = False


PRELUDES: dict[str, Run] = {
    "from torch.export import Dim": Run(
        _CONV_MODEL,
        check="""
shape = onnx.load("m.onnx").graph.input[0].type.tensor_type.shape
dims = [d.dim_param or d.dim_value for d in shape.dim]
assert dims == ["batch", 3, "height", 8], dims  # the names become the file's dim_params
print("dims", dims)
""",
        stdout=("dims ['batch', 3, 'height', 8]",),
    ),
    "import numpy as np": Run(
        _MY_ADD_FILE,
        check="""
a, b = np.full((2, 3), 1.5, np.float32), np.full((2, 3), 0.25, np.float32)
(y,) = sess.run(None, {"a": a, "b": b})
np.testing.assert_allclose(y, 3.0 * a + b)  # the node's alpha=3.0 reached the kernel
print("kernel ran", float(y[0, 0]))
""",
        stdout=("kernel ran 4.75",),
    ),
    "import onnxruntime as ort  # plain ONNX Runtime, no torch, no onnx_custom": Run(
        _DCN_FILE,
        check="""
import numpy as np
(out,) = sess.run(None, {sess.get_inputs()[0].name: args[0].numpy()})
with __import__("torch").no_grad():
    np.testing.assert_allclose(out, model(args[0]).numpy(), rtol=1e-4, atol=1e-5)
print("native dcn ran", out.shape)
""",
        stdout=("native dcn ran",),
        slow=True,  # exports DCN and copies the native library (a first build takes minutes)
    ),
    "try:": Run(
        _FAILING_MODEL,
        check="""
import os
assert not os.path.exists("model.onnx") and os.path.exists("failing.onnx")
""",
        stdout=(
            "Verification FAILED",
            "Nothing was written to 'model.onnx'.",
            "The failing model was kept at 'failing.onnx'",
        ),
        slow=True,  # a dynamo export and a verification in a fresh interpreter (~30 s)
    ),
}

# python blocks another test runs as written
COVERED = {
    "# acme_ops.py": (
        "tests/integration/test_native_user_deploy.py (the 'Write a kernel in C++' files and build)"
    ),
    # the design notes quote shipped modules, which the suite imports and runs throughout
    "# symbolics/seed.py": "tests/ops/test_shipped_ops.py (the shipped seed translations)",
    "# ort_kernels/seed.py": "tests/ops/test_shipped_ops.py (the shipped seed kernels)",
}
# console blocks: the command runs and prints these lines of the block (others vary: timings)
CONSOLE = ("$ onnx-custom export asinh -o asinh.onnx --dynamic --verify",)
SLOW_CONSOLE = {
    "$ onnx-custom zoo": "exports and verifies all 98 rows (minutes): test_zoo.py runs the rows"
}


def _python(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.lang == "python" and not b.marked]


def test_every_readme_block_is_covered() -> None:
    blocks = readme_blocks()
    assert len(blocks) > 10
    uncovered = [
        f"{b.page} line {b.line}: {b.key}"
        for b in _python(blocks)
        if b.key not in PRELUDES and b.key not in COVERED
    ]
    assert not uncovered, (
        f"python blocks no test runs: {uncovered}; add them to PRELUDES (or mark a whole"
        " example readme-test)"
    )
    consoles = [b.key for b in blocks if b.lang == "console"]
    assert set(consoles) == set(CONSOLE) | set(SLOW_CONSOLE), consoles
    stale = set(PRELUDES) - {b.key for b in _python(blocks)}
    assert not stale, f"PRELUDES name blocks no page has any more: {stale}"
    keys = [b.key for b in _python(blocks)]
    twice = {k for k in keys if keys.count(k) > 1 and k in PRELUDES}
    assert not twice, f"one block per PRELUDES key: {twice}"
    for key in CONSOLE:  # a console block shown on several pages shows the same lines
        assert len({b.body for b in blocks if b.lang == "console" and b.key == key}) == 1, key


def _env(tmp_path: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # the venv's onnx-custom
    return {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(
            k,
            marks=[pytest.mark.slow] if PRELUDES[k].slow else [],
            id=re.sub(r"\W+", "-", k.split("#")[0]).strip("-")[:40],
        )
        for k in sorted(PRELUDES)
    ],
)
def test_readme_python_block_runs(key: str, tmp_path: Path) -> None:
    (block,) = [b for b in _python(readme_blocks()) if b.key == key]
    run = PRELUDES[key]
    script = "\n".join([textwrap.dedent(run.prelude), block.body, textwrap.dedent(run.check)])
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(tmp_path),
    )
    assert result.returncode == 0, (
        f"{block.page} block at line {block.line} failed:\n{result.stderr[-3000:]}"
    )
    for text in run.stdout:
        assert text in result.stdout, (text, result.stdout[-3000:])


@pytest.mark.slow  # an export with verification at 4 sizes in a fresh interpreter (~30 s)
@pytest.mark.parametrize("key", sorted(CONSOLE))
def test_readme_console_block_prints_what_it_shows(key: str, tmp_path: Path) -> None:
    block = next(b for b in readme_blocks() if b.lang == "console" and b.key == key)
    command, *shown = block.body.strip().splitlines()
    result = subprocess.run(
        shlex.split(command.removeprefix("$ ")),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout.splitlines()
    assert printed == shown, "\n".join(
        ["the page shows:", *shown, "the command printed:", *printed]
    )
