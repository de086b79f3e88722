"""ONNX Runtime latency of a transformers detector exported with ``fuse=True`` (one
``onnx_custom::MultiScaleDeformableAttn`` node per attention module, our native kernel) against
the same model exported unfused (transformers' ``grid_sample`` code: ``GridSample`` chains).

Model: ``DeformableDetrModel`` from a config in code (seeded random weights, no download):
``--config small`` (d_model 64, 2 encoder and 2 decoder layers, 4 levels, a small ResNet
backbone) or ``--config default`` (transformers' defaults with a ResNet-18-sized backbone).
Both files are checked against eager PyTorch before timing.

Run: ``python benchmarks/hf_models.py [--config small] [--size 256] [--rounds 5] [--repeat 5]``.
ORT runs 2 intra-op threads, spinning off; the two sessions are timed as pairs each round
(`harness.paired_rounds`), the ratio is the median of the rounds' ratios.

Goal: fused with native kernels / GridSample file <= 0.6 for Deformable DETR (whole model).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

import onnx_custom
from onnx_custom.fusion import fusion_report
from onnx_custom.runtime.native import library_path

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded from its path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ort_options, paired_rounds

__all__ = ["build_model", "main"]


def build_model(config: str) -> torch.nn.Module:
    from transformers import DeformableDetrConfig, DeformableDetrModel, ResNetConfig

    torch.manual_seed(0)
    if config == "small":
        backbone = ResNetConfig(
            embedding_size=16,
            hidden_sizes=[16, 32, 64, 64],
            depths=[1, 1, 1, 1],
            layer_type="basic",
            out_features=["stage2", "stage3", "stage4"],
        )
        sizes: dict[str, Any] = {
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            "num_queries": 50,
        }
    else:
        backbone = ResNetConfig(
            layer_type="basic",
            hidden_sizes=[64, 128, 256, 512],
            depths=[2, 2, 2, 2],
            out_features=["stage2", "stage3", "stage4"],
        )
        sizes = {}
    cfg = DeformableDetrConfig(
        backbone_config=backbone, use_timm_backbone=False, use_pretrained_backbone=False, **sizes
    )
    return DeformableDetrModel(cfg).eval()


def _session(proto: Any, native: bool) -> ort.InferenceSession:
    opts = ort_options(2)
    if native:
        opts.register_custom_ops_library(str(library_path()))
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=("small", "default"), default="small")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    ns = parser.parse_args(argv)

    model = build_model(ns.config)
    pixels = torch.randn(1, 3, ns.size, ns.size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = [t.numpy() for t in model(pixel_values=pixels).to_tuple()]  # the file's order
    custom = onnx_custom.default_registry().with_variants("custom")
    files = {}
    for label, fuse in (("fused", True), ("unfused", False)):
        start = time.perf_counter()
        files[label] = onnx_custom.export(
            model, (pixels,), exporter=ns.exporter, registry=custom, fuse=fuse
        )
        counts = collections.Counter(n.op_type for n in files[label].graph.node)
        print(
            f"{label}: export {time.perf_counter() - start:.1f} s, {len(files[label].graph.node)}"
            f" nodes, MultiScaleDeformableAttn {counts['MultiScaleDeformableAttn']},"
            f" GridSample {counts['GridSample']}"
        )
    print(fusion_report(files["fused"]))
    feeds = {"pixel_values": pixels.numpy()}
    runs = {}
    for label, proto in files.items():
        sess = _session(proto, native=label == "fused")
        for got, want in zip(sess.run(None, feeds), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=label)
        runs[label] = lambda sess=sess: sess.run(None, feeds)
    fused_ms, unfused_ms, ratio = paired_rounds(
        runs["fused"], runs["unfused"], ns.rounds, ns.repeat
    )
    print(
        f"DeformableDetr {ns.config} {ns.size}x{ns.size} ({ns.exporter}): fused + native"
        f" {fused_ms:.2f} ms, GridSample file {unfused_ms:.2f} ms, ratio {ratio:.2f}x"
        f" (goal <= 0.6 {'ok' if ratio <= 0.6 else 'MISS'})"
    )
    return {"fused / unfused": ratio}


if __name__ == "__main__":
    main()
