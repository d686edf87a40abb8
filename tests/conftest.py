"""Fixtures shared by the whole suite (helper functions live in tests/support)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` inside the block, restored after it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread for a test: reproducible CPU reductions across processes and thread
    pools, and no oversubscription of a loaded 2-core machine."""
    with intra_op_threads(1):
        yield


@pytest.fixture(scope="module")
def one_thread_module() -> Iterator[None]:
    """One intra-op thread for every test of a module (and its module-scoped fixtures that
    request it): ``pytestmark = pytest.mark.usefixtures("one_thread_module")``."""
    with intra_op_threads(1):
        yield
