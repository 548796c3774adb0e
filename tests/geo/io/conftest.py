"""Each test of ``pipekit.geo.io`` starts and ends with no handle cached on its thread and the default budget."""

from __future__ import annotations

import pytest

from pipekit.geo.io import handles


@pytest.fixture(autouse=True)
def _fresh_cache():
    handles.close_cached_handles()
    budget = handles.handle_budget()
    yield
    handles.set_handle_budget(**budget)
    handles.close_cached_handles()
