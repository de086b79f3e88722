"""Rewrites of existing ONNX files, each proven in ONNX Runtime before anything is written.

`fuse_file` (``onnx-custom fuse``): the GridSample-based multi-scale deformable attention that
torch's exporters write for the pure-PyTorch formulation becomes one fused node.
"""

from __future__ import annotations

from onnx_custom.rewrite.apply import VARIANTS, FusedNode
from onnx_custom.rewrite.fuse import FuseReport, OutputDiff, fuse_file
from onnx_custom.rewrite.msda_pattern import MsdaMatch, NearMiss, find_msda

__all__ = [
    "VARIANTS",
    "FuseReport",
    "FusedNode",
    "MsdaMatch",
    "NearMiss",
    "OutputDiff",
    "find_msda",
    "fuse_file",
]
