"""``fuse=``: recognised pure-PyTorch implementations (transformers' and mmcv's multi-scale
deformable attention, your own copies) computed by our ops for the length of one export.

See docs/howto/fusion.md.
"""

from __future__ import annotations

from onnx_custom.fusion.core import (
    METADATA_KEY,
    FusionReport,
    FusionRule,
    FusionSite,
    check_fuse,
    fusing,
    fusion_report,
    register_fusion,
    registered_fusions,
    unregister_fusion,
)
from onnx_custom.fusion.graph import fuse_graph

__all__ = [
    "METADATA_KEY",
    "FusionReport",
    "FusionRule",
    "FusionSite",
    "check_fuse",
    "fuse_graph",
    "fusing",
    "fusion_report",
    "register_fusion",
    "registered_fusions",
    "unregister_fusion",
]
