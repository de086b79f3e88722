"""Models built with torch's RNG seeded, so two processes building the same model agree."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DEFAULT_SEED", "seeded"]

DEFAULT_SEED = 0
"""Seed of the global torch RNG while a model is built (``--seed``): two processes building the
same spec get the same random weights, so a file exported by one verifies in the other."""


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with torch's global CPU RNG seeded; the caller's RNG state is restored."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
