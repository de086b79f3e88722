"""Training through aot_autograd: forward and backward graphs in ONNX Runtime.

Reference: the same model run eagerly (a deep copy with the same weights); gradients compared with
torch.testing's float32 tolerances. Ops whose backward has no translation (convolution_backward,
our ops' backward ops) run eager inside the backward graph, and must not change the result.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from _compile_util import ZOO_MODELS, load_zoo

import onnx_custom


def _loss(output: Any) -> torch.Tensor:
    outputs = output if isinstance(output, tuple) else (output,)
    return sum(o.float().square().mean() for o in outputs if o.is_floating_point())  # type: ignore[return-value]


def _leaves(args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]


@pytest.mark.parametrize("variants", [(), ("custom",)], ids=["default", "custom"])
@pytest.mark.parametrize("name", ZOO_MODELS)
def test_gradients_match_eager(name: str, variants: tuple[str, ...]) -> None:
    module = load_zoo(name)
    model = module.Model().train()
    reference = copy.deepcopy(model)
    args = _leaves(module.example_inputs())
    ref_args = _leaves(module.example_inputs())
    backend = onnx_custom.compile_backend(variants=variants)
    loss = _loss(torch.compile(model, backend=backend)(*args))
    loss.backward()
    ref_loss = _loss(reference(*ref_args))
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    for (pname, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, n=pname: f"grad of {n}: {m}")
    for index, (a, r) in enumerate(zip(args, ref_args, strict=True)):
        if r.grad is not None:
            torch.testing.assert_close(
                a.grad, r.grad, msg=lambda m, i=index: f"grad of input {i}: {m}"
            )
    kinds = [r.kind for r in backend.records]
    assert kinds == ["forward", "backward"], kinds
    forward = backend.records[0]
    assert not forward.fallbacks and len(forward.partitions) == 1


class ConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(y.mean(dim=(2, 3)))


def test_training_batch_norm_running_stats_and_gradients(tmp_path: Path) -> None:
    """Pitfall: torchlib's batch norm is inference-only (running_mean off by ~0.1 in a training
    graph); training graphs must decompose it."""
    torch.manual_seed(0)
    model = ConvBn().train()
    reference = copy.deepcopy(model)
    backend = onnx_custom.compile_backend(save_dir=tmp_path)
    compiled = torch.compile(model, backend=backend)
    for step in range(3):
        x = torch.randn(4, 3, 10, 10, generator=torch.Generator().manual_seed(step)) * 2 + 1
        _loss(compiled(x)).backward()
        _loss(reference(x)).backward()
        torch.testing.assert_close(
            model.bn.running_mean, reference.bn.running_mean, msg=lambda m: f"running_mean: {m}"
        )
        torch.testing.assert_close(
            model.bn.running_var, reference.bn.running_var, msg=lambda m: f"running_var: {m}"
        )
        assert (
            int(model.bn.num_batches_tracked) == int(reference.bn.num_batches_tracked) == step + 1
        )
    for (pname, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, n=pname: f"grad of {n}: {m}")
    assert not [f for r in backend.records for f in r.fallbacks]  # convolution_backward: aten_extra
    for path in tmp_path.glob(
        "*.onnx"
    ):  # decomposed: no BatchNormalization node in training graphs
        assert "BatchNormalization" not in {n.op_type for n in onnx.load(path).graph.node}, (
            path.name
        )
    # eval mode after training: the inference graph (torchlib's batch norm is right there)
    model.eval()
    reference.eval()
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), reference(x))


def test_dcn_optimizer_loop_tracks_eager() -> None:
    """5 SGD steps on the DCN zoo model: the compiled loss follows eager's step by step."""
    module = load_zoo("deform_conv")
    model = module.Model().train()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=onnx_custom.compile_backend())
    optimizers = [
        torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, reference)
    ]
    target = torch.randn(2, 32, 8, 8, generator=torch.Generator().manual_seed(3))
    losses: list[tuple[float, float]] = []
    for step in range(5):
        x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(step))
        pair = []
        for net, opt in zip((compiled, reference), optimizers, strict=True):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), target)
            loss.backward()
            opt.step()
            pair.append(loss.item())
        losses.append((pair[0], pair[1]))
    got, want = zip(*losses, strict=True)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    assert want[-1] < want[0], f"the loop did not train: {want}"
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_dynamic_training_sweep_no_recompile() -> None:
    module = load_zoo("custom_linear")
    model = module.Model().train()
    reference = copy.deepcopy(model)
    backend = onnx_custom.compile_backend(variants=("custom",))
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in (2, 9, 33, 64):
            x = torch.randn(batch, 16)
            _loss(compiled(x)).backward()
            _loss(reference(x)).backward()
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad)
    assert [r.kind for r in backend.records] == ["forward", "backward"]
    assert backend.sessions.created == 2


@pytest.mark.parametrize("kernels", ["python", "native"])
def test_dcn_backward_one_partition_with_either_kernels(kernels: str) -> None:
    """Our deform_conv2d backward op runs as one custom node (its Python kernel serves both)."""
    module = load_zoo("deform_conv")
    model = module.Model().train()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    backend = onnx_custom.compile_backend(kernels=kernels)
    _loss(torch.compile(model, backend=backend)(x)).backward()
    _loss(reference(x)).backward()
    for (pname, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, n=pname: f"grad of {n}: {m}")
    assert [len(r.partitions) for r in backend.records] == [1, 1]
    assert not [f for r in backend.records for f in r.fallbacks]
