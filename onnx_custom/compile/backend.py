"""``torch.compile(model, backend="onnx_custom")``: aot_autograd graphs run in ONNX Runtime.

Per graph dynamo hands over: aot_autograd traces forward and backward (ATen level, with torch's
decompositions of every op neither torchlib nor our registry translates, and of training batch
norm), then each graph is translated whole when every node translates, else partitioned
(`onnx_custom.compile.partition`): ORT runs the fused partitions, PyTorch the rest. Sessions come
from an LRU cache (`SessionCache`); symbolic dims stay symbolic in the ONNX graph, so under
``dynamic=True`` one session serves every size.

Registered under the name ``onnx_custom`` through the ``torch_dynamo_backends`` entry point
(`onnx_custom_backend`, default options); ``compile_backend(**options)`` makes a configured one.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from onnx_custom.common.torch_chatter import quiet_torch
from onnx_custom.compile import torch_adapter
from onnx_custom.compile.aten_extra import aten_extra_registry
from onnx_custom.compile.backward_ops import backward_registry
from onnx_custom.compile.fx_to_onnx import TranslationFailure, translate
from onnx_custom.compile.options import CompileOptions
from onnx_custom.compile.partition import Fallback, OrtSupport, fill_placeholder_meta, fuse
from onnx_custom.compile.session import OrtPartition, SessionCache
from onnx_custom.errors import CompileError, VerificationError

__all__ = [
    "GraphRecord",
    "OnnxCustomBackend",
    "PartitionRecord",
    "compile_backend",
    "onnx_custom_backend",
]


@dataclasses.dataclass(frozen=True)
class PartitionRecord:
    """One ORT partition: its name, how many FX nodes it runs, our translations in it, its file."""

    name: str
    nodes: int
    custom_ops: tuple[str, ...]
    translate_seconds: float
    session_seconds: float
    saved: str | None = None
    runner: Any = dataclasses.field(default=None, repr=False, compare=False)  # the OrtPartition


@dataclasses.dataclass
class GraphRecord:
    """What the backend did with one aot graph (``kind``: forward, backward or inference)."""

    name: str
    kind: str
    nodes: int
    partitions: list[PartitionRecord] = dataclasses.field(default_factory=list)
    fallbacks: list[Fallback] = dataclasses.field(default_factory=list)

    @property
    def ort_nodes(self) -> int:
        return sum(p.nodes for p in self.partitions)


def _compute_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem]


class OnnxCustomBackend:
    """A ``torch.compile`` backend with fixed `CompileOptions`; keeps its sessions and a
    `GraphRecord` per compiled graph (``records``, read by ``explain_compile``)."""

    def __init__(self, options: CompileOptions | None = None) -> None:
        self.options = options if options is not None else CompileOptions()
        self.sessions = SessionCache(self.options.cache_size)
        self.records: list[GraphRecord] = []
        self._graphs = 0
        self._lock = threading.Lock()
        self._setup: tuple[Any, dict[Any, Any], dict[Any, Any]] | None = None
        self._warned = False
        self.fusion_reports: list[Any] = []  # one `FusionReport` per graph (options.fuse)

    def __repr__(self) -> str:
        return f"OnnxCustomBackend({self.options})"

    # ------------------------------------------------------------------ setup (once per backend)

    def _prepare(self) -> tuple[Any, dict[Any, Any], dict[Any, Any]]:
        """(torchlib registry, our translations, aot decompositions): once per process."""
        with self._lock:
            if self._setup is None:
                from onnx_custom.exporter.dynamo import translation_table

                torch_adapter.check_torch()
                with quiet_torch():
                    registry = torch_adapter.torchlib_registry(self.options.build_opset)
                ours = translation_table(self.options.opset, self.options.resolved_registry())
                for extra in (
                    aten_extra_registry(),
                    backward_registry(),
                ):  # used where ours has none
                    ours.update(
                        (k, v)
                        for k, v in translation_table(self.options.opset, extra).items()
                        if k not in ours
                    )
                self._setup = (registry, ours, torch_adapter.decompositions(registry, ours))
            return self._setup

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
    ) -> Callable[..., Any]:
        self._check_devices(example_inputs)
        missing = torch_adapter.missing_features()
        if missing and self.options.fallback == "eager":
            return self._eager(gm, missing)
        if self.options.fuse is not False and self.options.fuse is not None:
            from onnx_custom.fusion import fuse_graph

            self.fusion_reports.append(fuse_graph(gm, example_inputs, self.options.fuse))
        _registry, _ours, table = self._prepare()
        with self._lock:
            index = self._graphs
            self._graphs += 1
        compile_graph = functools.partial(_boxed, functools.partial(self._compile, index=index))
        aot = torch_adapter.aot_autograd(
            fw_compiler=functools.partial(compile_graph, kind="forward"),
            bw_compiler=functools.partial(compile_graph, kind="backward"),
            inference_compiler=functools.partial(compile_graph, kind="inference"),
            decompositions=table,
        )
        return aot(gm, example_inputs)  # type: ignore[no-any-return]

    def _eager(self, gm: torch.fx.GraphModule, missing: Sequence[str]) -> Callable[..., Any]:
        """fallback="eager" on a torch without the translator pieces: the graph runs in PyTorch
        (one warning per backend), as a node without a translation would."""
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"onnx_custom backend: torch {torch.__version__} lacks {', '.join(missing)}, so"
                " every graph runs in PyTorch (fallback='eager'). Fix: install torch 2.11 to 2.15,"
                " or compile with fallback='error' to raise instead.",
                stacklevel=2,
            )
        return gm.forward  # type: ignore[no-any-return]

    def _check_devices(self, example_inputs: Sequence[Any]) -> None:
        for value in example_inputs:
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                raise CompileError(
                    f"an input is on {value.device}, but the onnx_custom backend hands tensors to"
                    f" ONNX Runtime on CPU only (providers {list(self.options.providers)}). Fix:"
                    " move the model and inputs to CPU (.cpu()), or compile with another backend"
                    " for this device."
                )

    # ------------------------------------------------------------------ one aot graph

    def _compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, kind: str, index: int
    ) -> Callable[..., Any]:
        registry, ours, _ = self._prepare()
        with quiet_torch():
            torch_adapter.prepare_graph(gm)
        support = OrtSupport(registry, ours)
        name = f"graph{index}_{kind}"
        record = GraphRecord(name, kind, len(_compute_nodes(gm.graph)))
        with self._lock:
            self.records.append(record)
        fallbacks = support.fallbacks(gm.graph)
        self._refuse(name, fallbacks)
        if not fallbacks:
            try:
                return self._partition(gm, name, record, registry, ours)
            except TranslationFailure as failure:
                self._refuse(
                    name,
                    [
                        Fallback(
                            failure.node, failure.target, f"its translation raised {failure.reason}"
                        )
                    ],
                )
                support.refused[failure.node] = f"its translation raised {failure.reason}"
                fallbacks = support.fallbacks(gm.graph)
        record.fallbacks = fallbacks
        fused = fuse(gm, support)
        for call, sub in fill_placeholder_meta(fused):
            try:
                runner = self._partition(sub, f"{name}_{call.target}", record, registry, ours)
            except TranslationFailure as failure:  # the whole partition stays eager
                record.fallbacks.append(
                    Fallback(
                        failure.node,
                        failure.target,
                        f"its translation raised {failure.reason} (its partition runs eager)",
                    )
                )
                continue
            del fused._modules[str(call.target)]
            object.__setattr__(fused, str(call.target), runner)
        if record.nodes and not record.partitions and not self._warned:
            self._warned = True
            why = "; ".join(str(f) for f in record.fallbacks[:3])
            warnings.warn(
                f"onnx_custom backend: nothing in {name} runs in ONNX Runtime (every op falls back"
                f" to PyTorch: {why}). Fix: register translations for these ops, or see"
                " onnx_custom.explain_compile(model, *args).",
                stacklevel=2,
            )
        return fused  # type: ignore[no-any-return]

    def _refuse(self, name: str, fallbacks: list[Fallback]) -> None:
        if fallbacks and self.options.fallback == "error":
            lines = "\n".join(f"  {f}" for f in fallbacks)
            raise CompileError(
                f"{name}: {len(fallbacks)} node(s) cannot run in ONNX Runtime and"
                f" fallback='error':\n{lines}\nFix: register translations for these ops"
                " (onnx_custom.symbolic), or compile with fallback='eager' to run them in PyTorch."
            )

    def _partition(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        record: GraphRecord,
        registry: Any,
        ours: dict[Any, Any],
    ) -> OrtPartition:
        start = time.perf_counter()
        translated = translate(gm.graph, registry=registry, ours=ours, opset=self.options.opset)
        translated_at = time.perf_counter()
        saved = None
        if self.options.save_dir is not None:
            from onnx_custom.exporter.pipeline import save_model

            self.options.save_dir.mkdir(parents=True, exist_ok=True)
            saved = str(self.options.save_dir / f"{name}.onnx")
            save_model(translated.proto, saved)
        session = (
            self.sessions.get(translated.proto.SerializeToString(), self.options)
            if translated.output_names
            else None
        )
        verify = functools.partial(_verify, gm, name) if self.options.verify else None
        runner = OrtPartition(translated, session, name, verify)
        record.partitions.append(
            PartitionRecord(
                name,
                len(_compute_nodes(gm.graph)),
                translated.custom_ops,
                translated_at - start,
                time.perf_counter() - translated_at,
                saved,
                runner,
            )
        )
        return runner


def _boxed(
    compile_graph: Callable[..., Callable[..., Any]],
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    kind: str,
) -> Callable[..., Any]:
    """aot_autograd's boxed convention (one list argument): no extra wrapper on every call."""
    function = compile_graph(gm, example_inputs, kind=kind)

    def run(args: list[Any]) -> Any:
        return function(*args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _verify(gm: torch.fx.GraphModule, name: str, args: Sequence[Any], result: Any) -> None:
    """Raise `VerificationError` if ``result`` (ORT) differs from ``gm`` run eagerly on ``args``."""
    from onnx_custom.verification.compare import compare_arrays, flatten_outputs, to_numpy

    with torch.no_grad():
        expected = gm(*args)
    pairs = zip(flatten_outputs(expected, name), flatten_outputs(result, name), strict=True)
    for (path, want), (_, got) in pairs:
        if not isinstance(want, torch.Tensor):
            if want != got:
                raise VerificationError(f"{path}: ONNX Runtime gave {got!r}, PyTorch {want!r}.")
            continue
        comparison = compare_arrays(want, to_numpy(got), name=path, trial=0)
        if comparison.mismatched:
            raise VerificationError(
                f"{path} ({comparison.dtype}{list(comparison.shape)}): ONNX Runtime differs from"
                f" PyTorch in {comparison.mismatched}/{comparison.total} elements (max abs diff"
                f" {comparison.max_abs_diff:.3g}, rtol {comparison.rtol}, atol {comparison.atol})."
                " Fix: check the translations and kernels of this graph's ops (save_dir= writes"
                " its .onnx; onnx_custom.verify localizes the node).",
                comparison,
            )


def compile_backend(**options: Any) -> OnnxCustomBackend:
    """A ``torch.compile`` backend with these options (validated now; see `CompileOptions`)::

    model = torch.compile(model, backend=onnx_custom.compile_backend(kernels="native"))
    """
    return OnnxCustomBackend(CompileOptions.create(**options))


_default: OnnxCustomBackend | None = None
_default_lock = threading.Lock()
_configured: dict[str, OnnxCustomBackend] = {}


def onnx_custom_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
) -> Callable[..., Any]:
    """``backend="onnx_custom"`` (the entry point): one process-wide backend with default
    options; ``torch.compile(..., options={...})`` gets one backend per distinct set of options."""
    global _default
    options = kwargs.pop("options", None)
    with _default_lock:
        if options:
            key = repr(sorted(options.items()))
            if key not in _configured:
                _configured[key] = compile_backend(**options)
            backend = _configured[key]
        else:
            if _default is None:
                _default = OnnxCustomBackend()
            backend = _default
    return backend(gm, example_inputs, **kwargs)
