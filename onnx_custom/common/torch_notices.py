"""torch's import-time notices that say nothing to our users, dropped by message (stdlib only).

``torch.utils.cpp_extension`` logs "No CUDA runtime is found, using CUDA_HOME='...'" when it is
imported on a machine with a CUDA toolkit but no GPU (the regular PyPI wheels on a CPU machine).
Our C++ builds are CPU-only, so the line is noise on our commands' console. Only that record is
dropped (a filter on torch's logger); every other record of the logger still reaches handlers.
"""

from __future__ import annotations

import logging

__all__ = ["CPP_EXTENSION_LOGGER", "drop_cuda_home_notice"]

CPP_EXTENSION_LOGGER = "torch.utils.cpp_extension"
_NOTICE = "No CUDA runtime is found"


class _CudaHomeNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_NOTICE)


_FILTER = _CudaHomeNotice()


def drop_cuda_home_notice() -> None:
    """Drop the CUDA_HOME notice of ``torch.utils.cpp_extension`` (idempotent; call before the
    first import of that module: it logs once, at import)."""
    logger = logging.getLogger(CPP_EXTENSION_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
