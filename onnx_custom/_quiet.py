"""Silence the exporters' noise nobody can act on, during the command line's own calls only.

torch's dynamo exporter logs "torchvision is not installed. Skipping torchvision::nms" (four
lines per export) when torchvision is absent; a zoo run printed 104 of them. These are dropped
by exact message while the CLI runs; every other log record and warning, in particular those of
the user's own code, still reaches the terminal.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NOISE", "quiet_exporters"]

# logger name -> message prefixes dropped from it
NOISE: dict[str, tuple[str, ...]] = {
    "torch.onnx._internal.exporter._registration": ("torchvision is not installed",),
}


class _DropNoise(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


@contextmanager
def quiet_exporters() -> Iterator[None]:
    """Drop the `NOISE` log records inside the block (filters removed afterwards)."""
    installed = [(logging.getLogger(name), _DropNoise(prefixes)) for name, prefixes in NOISE.items()]
    for logger, noise_filter in installed:
        logger.addFilter(noise_filter)
    try:
        yield
    finally:
        for logger, noise_filter in installed:
            logger.removeFilter(noise_filter)
