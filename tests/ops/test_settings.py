"""vmamba2d.ops.settings.env_choice: the word settings of the scan ops."""
from __future__ import annotations

import pytest

from vmamba2d.ops.settings import env_choice

CHOICES = ("auto", "nvrtc", "built")


@pytest.mark.parametrize("raw, expected", [(None, "auto"), ("", "auto"), ("  ", "auto"), ("NVRTC", "nvrtc"),
                                           (" built\n", "built")])
def test_known_words_any_case_and_unset(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("VMAMBA2D_TEST_SETTING", raising=False)
    else:
        monkeypatch.setenv("VMAMBA2D_TEST_SETTING", raw)
    assert env_choice("VMAMBA2D_TEST_SETTING", CHOICES, "auto") == expected


def test_other_words_are_refused_with_the_variable_and_its_choices(monkeypatch):
    monkeypatch.setenv("VMAMBA2D_TEST_SETTING", "nvcc")
    with pytest.raises(ValueError, match=r"^VMAMBA2D_TEST_SETTING: expected one of auto, nvrtc, built, got 'nvcc'$"):
        env_choice("VMAMBA2D_TEST_SETTING", CHOICES, "auto")
