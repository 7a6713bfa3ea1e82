"""A function's schema is checked once per distinct JSON (omni/api/tools.py): agents send
the same tools with every request; a bad one stays a 400 every time."""

from __future__ import annotations

import pytest

from omni.api.errors import APIError
from omni.api.tools import _check_schemas, schema_problem

GOOD = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}
BAD = {"name": "look", "parameters": {"type": "object", "properties": {
    "x": {"type": "string", "pattern": "(?<=a)b"}}}}


def test_the_same_tools_are_checked_once_and_a_bad_one_fails_each_time():
    schema_problem.cache_clear()
    for _ in range(3):
        _check_schemas([GOOD], ["tools[0].function.parameters"])
    assert schema_problem.cache_info().misses == 1 and schema_problem.cache_info().hits == 2
    reordered = {"parameters": GOOD["parameters"], "name": GOOD["name"]}  # same JSON, keys sorted
    _check_schemas([reordered], ["tools[0].function.parameters"])
    assert schema_problem.cache_info().misses == 1
    for _ in range(2):
        with pytest.raises(APIError) as caught:
            _check_schemas([GOOD, BAD], ["p0", "p1"])
        assert caught.value.param == "p1" and "not a JSON Schema" in str(caught.value)
