"""A module calling one op on its input: the model the per-op export tables wrap each op in."""

from __future__ import annotations

from typing import Any

import torch


class One(torch.nn.Module):
    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)
