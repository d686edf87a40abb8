"""Fixtures of the OpenMMLab tests."""
from pathlib import Path

import pytest

from support.seg_runs import make_ade_tree


@pytest.fixture(scope="module")
def ade_root(tmp_path_factory) -> Path:
    """A tiny dataset in ADE20K's layout (support.seg_runs.make_ade_tree), one per test module."""
    return make_ade_tree(tmp_path_factory.mktemp("ade"))
