"""Test sessions per torch release: ``nox -s tests-2.15`` (or ``tests-2.11``, ``tests-2.13``, ...).

Each session makes its own venv, installs that torch with the package's other pins (the
constraints file named below), runs ``onnx-custom zoo`` and the default suite (``-m "not slow"``).
Arguments after ``--`` run pytest with those arguments instead (no zoo):
``nox -s tests-2.15 -- tests/compile -x``.
See docs/torch-versions.md for what each release supports and which sessions CI runs.
"""

from __future__ import annotations

from pathlib import Path

import nox

ROOT = Path(__file__).parent
# torch release -> the constraints file pinning it with the rest of the tested versions.
# constraints.txt pins the release the README installs (the CPU wheel where one is found).
TORCH = {
    "2.11": "constraints-torch-2.11.txt",
    "2.13": "constraints.txt",
    "2.14": "constraints-torch-2.14.txt",
    "2.15": "constraints-torch-2.15.txt",
}

nox.options.sessions = ["tests-2.13"]
nox.options.reuse_existing_virtualenvs = True


def _tests(session: nox.Session, constraints: str) -> None:
    path = str(ROOT / constraints)
    # The session's constraints replace any machine-wide pip constraint (PIP_CONSTRAINT wins over
    # pip's config files), so a cap set for other work cannot swap the torch under test.
    session.env["PIP_CONSTRAINT"] = path
    session.install("-c", path, "-e", f"{ROOT}[test]")
    session.run("python", "-c", "import torch; print('torch', torch.__version__)")
    if session.posargs:
        session.run("python", "-m", "pytest", *session.posargs)
        return
    session.run("onnx-custom", "zoo")
    session.run("python", "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider")


for _version, _constraints in TORCH.items():

    def _session(session: nox.Session, constraints: str = _constraints) -> None:
        _tests(session, constraints)

    _session.__doc__ = f"torch {_version}: onnx-custom zoo and the default suite."
    nox.session(name=f"tests-{_version}", venv_backend="venv")(_session)
