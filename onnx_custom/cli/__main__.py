"""``python -m onnx_custom.cli``: the same as the ``onnx-custom`` command."""

from __future__ import annotations

import sys

from onnx_custom.cli.main import main

sys.exit(main())
