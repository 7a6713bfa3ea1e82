"""Objects with properties are closed for constrained decoding unless the schema says
otherwise (omni/api/schemas/response_format.py closed_objects)."""

from __future__ import annotations

from omni.api.schemas.response_format import closed_objects

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}}


def test_nested_objects_are_closed_and_explicit_choices_kept():
    schema = {"type": "object", "properties": {
        "person": PERSON,
        "pets": {"type": "array", "items": PERSON},
        "either": {"anyOf": [PERSON, {"type": "string"}]},
        "open": {**PERSON, "additionalProperties": True},
        "patterned": {**PERSON, "patternProperties": {"^x": {"type": "string"}}},
        "free": {"type": "object"}},  # no properties: any object, as sent
        "$defs": {"p": PERSON}}
    out = closed_objects(schema)
    assert out["additionalProperties"] is False
    props = out["properties"]
    assert props["person"]["additionalProperties"] is False
    assert props["pets"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] is True
    assert "additionalProperties" not in props["patterned"]
    assert props["free"] == {"type": "object"}
    assert out["$defs"]["p"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's own schema is not changed


def test_all_of_branches_stay_open_but_their_insides_close():
    schema = {"allOf": [PERSON, {"type": "object", "properties": {"pet": PERSON}}]}
    out = closed_objects(schema)
    first, second = out["allOf"]
    assert "additionalProperties" not in first and "additionalProperties" not in second
    assert second["properties"]["pet"]["additionalProperties"] is False
