from __future__ import annotations

import pytest
from _compile_util import fresh_dynamo


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    fresh_dynamo()
