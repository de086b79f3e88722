"""transformers detectors exported with ``fuse=True`` (one ``onnx_custom::MultiScaleDeformableAttn``
node per attention module, our native kernel) against the same model exported by plain
``torch.onnx.export(dynamo=True)`` (transformers' ``grid_sample`` code: ``GridSample`` chains).

Families (``--families``): DeformableDetr, Mask2Former, RTDetr. ``--config default``: each
family's default transformers config (random weights, seeded, no download) with these backbones:
DeformableDetr a ResNet-18-sized ResNet (transformers' default is a timm ResNet-50), Mask2Former
the same ResNet-18-sized ResNet (its default Swin-S is too slow for a 2-core box), RT-DETR its
default ResNet-50-vd. ``--config small``: the zoo's small configs
(`onnx_custom.models.hf_detectors`).

Rows per family (each line says its config and image size):

- ORT latency of the whole model: fused file (native kernel) / ``GridSample`` file, the two
  sessions timed as pairs each round (`harness.paired_rounds`; median of the rounds' ratios).
  Goals: <= 0.6 for Deformable DETR and Mask2Former, <= 0.9 for RT-DETR (MSDA in the decoder only).
- the MSDA nodes alone, from ORT's per-node profile: the fused nodes' kernel time / the kernel time
  of the ``GridSample`` file's nodes they replace (its nodes inside the same attention modules, by
  the exporter's name scopes, less the projections both files run there), goal <= 0.25 (>= 4x
  faster).
- export: ``onnx_custom.export(fuse=True)`` (the fusion's tracing and per-site check included) /
  raw ``torch.onnx.export(dynamo=True)``, each export run cold in its own fresh process (wall
  time of the export call), goal <= 1.05; the same processes' peak RSS (``VmHWM``), goal <= 1.1.
- ``onnx_custom.verify`` of the fused file (native ORT backend, the export shape only) / one eager
  run + one ORT run of the same file, goal <= 1.3.
- DeformableDetr only (``--compile``, on by default): ``torch.compile(backend="onnx_custom",
  options={"fuse": True, "kernels": "native"})`` / eager per inference call after the first
  (the first call's compile time is printed, not held to a goal), goal <= 0.8.

Run: ``python benchmarks/hf_models.py [--families DeformableDetr ...] [--config default]
[--size 640] [--rounds 3] [--repeat 2] [--export-rounds 1] [--no-compile]``. ORT runs 2 intra-op
threads, spinning off; torch 2 threads. Needs transformers (the ``hf`` extra).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded from its path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ort_options, paired_rounds, status_kib

__all__ = ["FAMILIES", "build_model", "main", "msda_scope_ms"]

FAMILIES = ("DeformableDetr", "Mask2Former", "RTDetr")
GOALS = {"DeformableDetr": 0.6, "Mask2Former": 0.6, "RTDetr": 0.9}
_KEYS = {
    "DeformableDetr": ("last_hidden_state", "encoder_last_hidden_state"),
    "Mask2Former": ("pixel_decoder_last_hidden_state", "transformer_decoder_last_hidden_state"),
    "RTDetr": ("last_hidden_state", "init_reference_points"),
}


def _resnet18(out: list[str]) -> Any:
    from transformers import ResNetConfig

    return ResNetConfig(
        layer_type="basic", hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], out_features=out
    )


def build_model(family: str, config: str = "default") -> torch.nn.Module:
    """The family's model in eval mode, seeded; outputs a tuple of tensors."""
    from onnx_custom.models.hf_detectors import Outputs, _untied, build

    if config == "small":
        return build(family)[0]
    import transformers

    torch.manual_seed(0)
    if family == "DeformableDetr":
        cfg = transformers.DeformableDetrConfig(
            backbone_config=_resnet18(["stage2", "stage3", "stage4"]),
            use_timm_backbone=False,
            use_pretrained_backbone=False,
        )
        model: torch.nn.Module = transformers.DeformableDetrModel(cfg)
    elif family == "Mask2Former":
        cfg = transformers.Mask2FormerConfig(
            backbone_config=_resnet18(["stage1", "stage2", "stage3", "stage4"])
        )
        model = transformers.Mask2FormerModel(cfg)
    elif family == "RTDetr":
        model = transformers.RTDetrModel(transformers.RTDetrConfig())
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    # constant-initialised tensors jittered: RT-DETR's top-k then never picks among exact ties
    return _untied(Outputs(model, _KEYS[family]).eval(), 0)


def _pixels(size: int) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))


def _export_child(kind: str, family: str, config: str, size: int, out: str) -> None:
    """Subprocess body: one cold export (``fused``: onnx_custom, ``raw``: torch), saved to
    ``out``; prints its wall time and the process's peak RSS as JSON."""
    torch.set_num_threads(2)
    model = build_model(family, config)
    args = (_pixels(size),)
    if kind == "fused":
        import onnx_custom
        from onnx_custom.ops.msda import load_extension

        load_extension()  # built once per machine: not the export's cost
        registry = onnx_custom.default_registry().with_variants("custom")
        start = time.perf_counter()
        proto = onnx_custom.export(model, args, exporter="dynamo", registry=registry, fuse=True)
        seconds = time.perf_counter() - start
    else:
        start = time.perf_counter()
        program = torch.onnx.export(model, args, dynamo=True, verbose=False)
        seconds = time.perf_counter() - start
        assert program is not None
        proto = program.model_proto
    onnx.save(proto, out)
    # this process's own peak: ru_maxrss would carry the parent's RSS over fork + exec
    print(json.dumps({"seconds": seconds, "rss_kib": status_kib("VmHWM")}))


def _export(kind: str, family: str, config: str, size: int, out: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", kind, family, config, str(size), str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"{kind} export of {family} failed (exit {proc.returncode})")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _session(path: Path | bytes, native: bool, profile: str | None = None) -> ort.InferenceSession:
    from onnx_custom.runtime.native import library_path

    opts = ort_options(2)
    if native:
        opts.register_custom_ops_library(str(library_path()))
    if profile is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    source = str(path) if isinstance(path, Path) else path
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def _scopes(proto: onnx.ModelProto) -> dict[str, list[str]]:
    """Each node's name scopes (the exporter's module path), by node name."""
    out = {}
    for node in proto.graph.node:
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                out[node.name] = json.loads(prop.value.replace("'", '"'))
    return out


def msda_scope_ms(
    fused: onnx.ModelProto, plain: onnx.ModelProto, runs: dict[str, Callable[[], object]]
) -> tuple[float, float, dict[str, float]]:
    """Kernel ms per run of the fused file's MSDA nodes, and of what they replaced in the plain
    file: its nodes inside the modules that hold the fused nodes (by the exporter's name scopes)
    less the fused file's other nodes there (the projections around a fused function, which both
    files run); ``runs``: profiled sessions' run calls, by label ``fused`` / ``plain``, each
    returning its profile file after 1 warm-up and 2 timed runs. Then the fused file's kernel ms
    per run by op type."""
    fused_scopes = _scopes(fused)
    modules = {
        scopes[-2]
        for node in fused.graph.node
        if node.op_type == "MultiScaleDeformableAttn"
        for scopes in [fused_scopes.get(node.name, [])]
        if len(scopes) >= 2
    }
    result = []
    by_op: collections.Counter[str] = collections.Counter()
    for label, proto in (("fused", fused), ("plain", plain)):
        scopes = _scopes(proto)
        inside = {name for name, s in scopes.items() if modules.intersection(s)}
        events = json.loads(Path(str(runs[label]())).read_text())
        model_runs = sorted(
            (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run"
        )
        warm_end = model_runs[0][1]
        timed = [
            e
            for e in events
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > warm_end
        ]
        per_run = 1e3 * (len(model_runs) - 1)
        total = sum(e["dur"] for e in timed if e["name"][: -len("_kernel_time")] in inside)
        result.append(total / per_run)
        if label == "fused":
            for e in timed:
                by_op[e["args"]["op_name"]] += e["dur"] / per_run
    msda = by_op.get("MultiScaleDeformableAttn", 0.0)
    shared = result[0] - msda  # the fused file's other nodes in those modules
    return msda, result[1] - shared, dict(by_op)


def _profiled(path: Path, native: bool, feeds: dict[str, np.ndarray], prefix: str) -> Any:
    def run() -> str:
        sess = _session(path, native, profile=prefix)
        for _ in range(3):
            sess.run(None, feeds)
        return str(sess.end_profiling())

    return run


def _verdict(ratio: float, goal: float) -> str:
    return f"(goal <= {goal} {'ok' if ratio <= goal else 'MISS'})"


def family_rows(family: str, ns: argparse.Namespace, tmp: Path) -> None:
    import onnx_custom

    size = ns.size
    tag = f"{family} {ns.config} {size}x{size}"
    paths = {kind: tmp / f"{family}_{kind}.onnx" for kind in ("fused", "raw")}
    exports: dict[str, list[dict[str, float]]] = {"fused": [], "raw": []}
    for r in range(ns.export_rounds):  # alternating order
        for kind in ("raw", "fused") if r % 2 == 0 else ("fused", "raw"):
            exports[kind].append(_export(kind, family, ns.config, size, paths[kind]))
    fused_proto, raw_proto = onnx.load(str(paths["fused"])), onnx.load(str(paths["raw"]))
    counts = {
        k: collections.Counter(n.op_type for n in p.graph.node)
        for k, p in (("fused", fused_proto), ("raw", raw_proto))
    }
    print(
        f"{tag} files: fused {len(fused_proto.graph.node)} nodes"
        f" ({counts['fused']['MultiScaleDeformableAttn']} MultiScaleDeformableAttn),"
        f" raw {len(raw_proto.graph.node)} nodes ({counts['raw']['GridSample']} GridSample)"
    )
    secs = {k: float(np.median([e["seconds"] for e in v])) for k, v in exports.items()}
    rss = {k: max(e["rss_kib"] for e in v) / 1024 for k, v in exports.items()}
    ratios = [
        f["seconds"] / r["seconds"] for f, r in zip(exports["fused"], exports["raw"], strict=True)
    ]
    ratio = float(np.median(ratios))
    print(
        f"{tag} export (cold, own process): onnx_custom.export(fuse=True) {secs['fused']:.1f} s,"
        f" raw torch.onnx.export(dynamo) {secs['raw']:.1f} s, ratio {ratio:.3f}x"
        f" {_verdict(ratio, 1.05)}"
    )
    ratio = rss["fused"] / rss["raw"]
    print(
        f"{tag} export peak RSS (VmHWM): onnx_custom.export(fuse=True) {rss['fused']:.0f} MiB,"
        f" raw torch.onnx.export(dynamo) {rss['raw']:.0f} MiB, ratio {ratio:.3f}x"
        f" {_verdict(ratio, 1.1)}"
    )

    torch.set_num_threads(2)
    model = build_model(family, ns.config)
    pixels = _pixels(size)
    feeds = {"pixel_values": pixels.numpy()}
    with torch.no_grad():
        expected = model(pixels)
    sessions = {"fused": _session(paths["fused"], True), "raw": _session(paths["raw"], False)}
    worst = {
        label: max(
            float(np.abs(got - want.numpy()).max())
            for got, want in zip(sess.run(None, feeds), expected, strict=True)
        )
        for label, sess in sessions.items()
    }
    # random weights: a model that ranks queries (RT-DETR's top-k) may pick other queries on
    # rounding-level differences, in either file; the line says how far each file is from eager
    print(
        f"{tag} max |ORT - eager| over the outputs: fused file {worst['fused']:.2g},"
        f" GridSample file {worst['raw']:.2g}"
    )
    fused_ms, raw_ms, ratio = paired_rounds(
        lambda: sessions["fused"].run(None, feeds),
        lambda: sessions["raw"].run(None, feeds),
        ns.rounds,
        ns.repeat,
    )
    print(
        f"{tag} ORT whole model: fused + native {fused_ms:.1f} ms, GridSample file"
        f" {raw_ms:.1f} ms, ratio {ratio:.3f}x {_verdict(ratio, GOALS[family])}"
    )
    profiled = {
        "fused": _profiled(paths["fused"], True, feeds, str(tmp / f"{family}_fused")),
        "plain": _profiled(paths["raw"], False, feeds, str(tmp / f"{family}_raw")),
    }
    msda_ms, grid_ms, by_op = msda_scope_ms(fused_proto, raw_proto, profiled)
    total = sum(by_op.values())
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:6]
    shares = ", ".join(f"{op} {100 * ms / total:.0f}%" for op, ms in top)
    print(f"{tag} fused file, ORT kernel time by op type: {shares} (of {total:.0f} ms)")
    ratio = msda_ms / grid_ms
    print(
        f"{tag} MSDA nodes alone (ORT profile): fused {msda_ms:.1f} ms, the GridSample file's"
        f" nodes they replace {grid_ms:.1f} ms, ratio {ratio:.3f}x {_verdict(ratio, 0.25)}"
        f" i.e. {grid_ms / msda_ms:.1f} times faster"
    )

    session = sessions["fused"]
    verify_args = (pixels,)

    def verify() -> object:
        return onnx_custom.verify(
            model,
            verify_args,
            fused_proto,
            shapes=(),
            backends=("onnxruntime-native",),
            rtol=1e-3,
            atol=1e-3,
            fuse=True,
            progress=False,
            raise_on_mismatch=False,  # timed either way (see the distance line above)
        )

    def plain() -> object:
        with torch.no_grad():
            model(pixels)
        return session.run(None, feeds)

    report: Any = verify()  # warm: its session, the kernel library
    assert len(report.shapes_tried) == 1, report.shapes_tried
    verify_ms, plain_ms, ratio = paired_rounds(verify, plain, ns.rounds, 1)
    print(
        f"{tag} verify: onnx_custom.verify (fused file, native ORT) {verify_ms:.0f} ms, eager +"
        f" ORT run {plain_ms:.0f} ms, ratio {ratio:.3f}x {_verdict(ratio, 1.3)}"
    )
    if family == "DeformableDetr" and ns.compile:
        compile_rows(model, pixels, tag, ns)


def compile_rows(
    model: torch.nn.Module, pixels: torch.Tensor, tag: str, ns: argparse.Namespace
) -> None:
    options = {"fuse": True, "kernels": "native", "session_options": ort_options(2)}
    compiled = torch.compile(model, backend="onnx_custom", options=options)
    start = time.perf_counter()
    with torch.no_grad():
        got = compiled(pixels)
    first = time.perf_counter() - start
    with torch.no_grad():
        want = model(pixels)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)

    def run(fn: Callable[..., Any]) -> Callable[[], object]:
        def call() -> object:
            with torch.no_grad():
                return fn(pixels)

        return call

    mine, eager, ratio = paired_rounds(run(compiled), run(model), ns.rounds, ns.repeat)
    print(
        f"{tag} torch.compile(backend='onnx_custom', fuse, native) per call {mine:.0f} ms"
        f" (first call {first:.0f} s), eager {eager:.0f} ms, ratio {ratio:.3f}x"
        f" {_verdict(ratio, 0.8)}"
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _export_child(argv[1], argv[2], argv[3], int(argv[4]), argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--config", choices=("small", "default"), default="default")
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--export-rounds", type=int, default=1)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for family in ns.families:
            family_rows(family, ns, Path(tmp))
            gc.collect()  # the family's sessions and model


if __name__ == "__main__":
    main()
