"""The shared option readers of omni/engines/base.py: flag_option and number_option refuse
what would silently mean something else (a quoted "false" is truthy; True reads as 1)."""

from __future__ import annotations

import math

import pytest

from omni.engines.base import EngineLoadError, flag_option, number_option


def test_flag_option_takes_only_booleans():
    assert flag_option({}, "x", True) is True
    assert flag_option({"x": False}, "x", True) is False
    with pytest.raises(EngineLoadError, match="option x must be true or false"):
        flag_option({"x": "false"}, "x", True)


@pytest.mark.parametrize("value", [True, "5", math.inf, math.nan, -1, None])
def test_number_option_refuses_non_numbers_and_values_below_the_minimum(value):
    with pytest.raises(EngineLoadError, match="option gap must be a number >= 0"):
        number_option({"gap": value}, "gap", 5.0, float, 0)


def test_number_option_returns_its_kind():
    assert number_option({}, "gap", 5, float, 0) == 5.0
    assert isinstance(number_option({}, "gap", 5, float, 0), float)
    assert number_option({"steps": 3}, "steps", 10, int, 1) == 3
    assert number_option({"sway": -1.5}, "sway", 0.0) == -1.5  # no minimum
    with pytest.raises(EngineLoadError, match="option steps must be an integer >= 1"):
        number_option({"steps": 2.5}, "steps", 10, int, 1)
    with pytest.raises(EngineLoadError, match="option steps must be an integer >= 1"):
        number_option({"steps": 0}, "steps", 10, int, 1)
