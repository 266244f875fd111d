"""Structured answers: parsing a sample's object and the vote field by field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from ponder.enhance.structured import (
    ABSENT_LABEL,
    Leaf,
    array_key,
    canonical_json,
    object_key,
    parse_sample,
    vote_fields,
)

ORDER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
            "required": ["name"],
        },
        "total": {"type": "number", "minimum": 0},
        "status": {"enum": ["paid", "Paid", "open"]},
        "gift": {"type": "boolean"},
        "note": {"type": "string"},
        "items": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "sku": {"type": "string"},
                    "price": {"type": "number"},
                },
                "required": ["label", "sku", "price"],
            },
        },
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["customer", "total", "status", "gift", "items"],
}


def order(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "customer": {"name": "Ann Lee"},
        "total": 12,
        "status": "paid",
        "gift": False,
        "items": [
            {"label": "pen", "sku": "A1", "price": 2},
            {"label": "ink", "sku": "B2", "price": 10},
        ],
    }
    return base | changes


def valid(obj: Any, schema: dict[str, Any] = ORDER) -> bool:
    return Draft202012Validator(schema).is_valid(obj)


# --- parsing ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        json.dumps(order()),
        "```json\n" + json.dumps(order(), indent=2) + "\n```",
        "Here is the order:\n\n```\n" + json.dumps(order()) + "\n```\nAnything else?",
        "Sure! The record is " + json.dumps(order()) + " as requested.",
        'A draft {"total": 1} and then the answer: ' + json.dumps(order()),
    ],
    ids=["bare", "json-fence", "plain-fence", "prose", "last-object"],
)
def test_parse_finds_the_object(text: str) -> None:
    assert parse_sample(text, ORDER) == (order(), None)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"customer": {"name": "Ann"}, "total": ', "invalid JSON"),
        ("The total is 12.", "no JSON object"),
        ("", "no JSON object"),
        (json.dumps(order(total="twelve")), "total: 'twelve' is not of type 'number'"),
        (json.dumps(order(status="closed")), "status: 'closed' is not one of"),
        (json.dumps(order(items=[{"sku": "A1", "price": 2}])), "items[0]: 'label' is a required"),
        (json.dumps(order()).replace("12", "NaN"), "NaN is not JSON"),
        ("[1, 2]", "no JSON object"),
    ],
)
def test_parse_says_why_a_sample_does_not_vote(text: str, why: str) -> None:
    obj, error = parse_sample(text, ORDER)
    assert obj is None and error is not None
    assert why in error and "\n" not in error and len(error) <= 200


def test_parse_never_raises_on_pathological_text() -> None:
    for text in ["{" * 5000, "[" * 5000 + "]" * 5000, "{" + '"a":' * 3000, '{"a": "}' * 4000]:
        obj, error = parse_sample(text, {"type": "object"})
        assert obj is None and error
    assert parse_sample("}{" * 4000, {"type": "object"}) == ({}, None)


# --- the vote ---------------------------------------------------------------------------
def test_numbers_are_equal_as_math_answers() -> None:
    vote = vote_fields(
        [order(total=12), order(total=12.0), order(total=1.2e1), order(total=13)], ORDER
    )
    total = vote.fields["total"]
    assert total.value == 12 and vote.object["total"] == 12
    assert total.votes == {"12.0": 3, "13": 1}  # as most samples wrote it
    assert total.agreement == 0.75
    assert object_key(order(total=12), ORDER) == object_key(order(total=12.0), ORDER)


def test_strings_are_normalised_like_text_answers() -> None:
    names = ["ann lee", "Ann Lee.", "Ann  LEE", "Bob"]
    objects = [order(customer={"name": n}) for n in names]
    field = vote_fields(objects, ORDER, [1.0, 1.0, 1.5, 1.0]).fields["customer.name"]
    assert field.votes == {'"Ann  LEE"': 3, '"Bob"': 1}  # the heaviest spelling shows
    assert field.value == "Ann  LEE"


def test_enums_and_booleans_are_exact() -> None:
    objects = [
        order(status="paid", gift=True),
        order(status="Paid", gift=True),
        order(status="paid", gift=False),
    ]
    vote = vote_fields(objects, ORDER)
    assert vote.fields["status"].votes == {'"paid"': 2, '"Paid"': 1}
    assert vote.fields["gift"].votes == {"true": 2, "false": 1}
    assert vote.object["status"] == "paid" and vote.object["gift"] is True


def test_weights_decide_between_groups_of_equal_size() -> None:
    objects = [order(total=1), order(total=2)]
    assert vote_fields(objects, ORDER, [1.0, 2.0]).object["total"] == 2
    assert vote_fields(objects, ORDER).object["total"] == 1  # equal: the earliest


def test_a_missing_optional_field_is_a_vote_for_absent() -> None:
    objects = [order(), order(note="fragile"), order(), order(note="Fragile!")]
    vote = vote_fields(objects, ORDER)
    assert "note" not in vote.object
    assert vote.fields["note"].votes == {ABSENT_LABEL: 2, '"fragile"': 2}
    objects.append(order(note="FRAGILE"))
    assert vote_fields(objects, ORDER).object["note"] == "fragile"


def test_an_optional_object_is_voted_present_or_absent_first() -> None:
    schema = json.loads(json.dumps(ORDER))
    schema["properties"]["shipping"] = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    objects = [order(shipping={"city": "Oslo"}), order(), order()]
    vote = vote_fields(objects, schema)
    assert "shipping" not in vote.object and valid(vote.object, schema)
    assert vote.fields["shipping"].votes == {ABSENT_LABEL: 2, "(present)": 1}
    vote = vote_fields([objects[0], objects[0], objects[1]], schema)
    assert vote.object["shipping"] == {"city": "Oslo"}
    assert vote.fields["shipping.city"].votes == {'"Oslo"': 2, ABSENT_LABEL: 1}
    assert vote.fields["shipping.city"].agreement == pytest.approx(2 / 3, abs=1e-4)


def test_arrays_of_keyed_objects_are_voted_element_by_element() -> None:
    pen, ink = {"label": "pen", "sku": "A1", "price": 2}, {"label": "ink", "sku": "B2", "price": 10}
    objects = [
        order(items=[pen, ink]),
        order(items=[ink | {"price": 10.0}, pen | {"sku": "a1"}]),  # another order, a1 is A1
        order(items=[pen | {"price": 3}, ink, {"label": "cap", "sku": "C3", "price": 1}]),
    ]
    vote = vote_fields(objects, ORDER)
    assert array_key(ORDER["properties"]["items"]) == "sku"
    assert vote.object["items"] == [pen, ink]  # cap: in one sample of three, dropped
    assert vote.object_from == "fields"
    assert vote.fields["items"].value == ["A1", "B2"]
    assert vote.fields["items"].votes == {'["A1","B2"]': 2, '["A1","B2","C3"]': 1}
    assert vote.fields["items[0].price"].votes == {"2": 2, "3": 1}
    assert vote.fields["items[1].price"].votes == {"10": 3}
    assert "items[2].sku" not in vote.fields


def test_the_key_property_is_named_like_a_key_or_the_first_required_string() -> None:
    def items(props: dict[str, str], required: list[str]) -> dict[str, Any]:
        properties = {k: {"type": t} for k, t in props.items()}
        return {
            "type": "array",
            "items": {"type": "object", "properties": properties, "required": required},
        }

    assert (
        array_key(items({"title": "string", "order_id": "string"}, ["title", "order_id"]))
        == "title"
    )
    assert (
        array_key(items({"label": "string", "ref_id": "string"}, ["label", "ref_id"])) == "ref_id"
    )
    assert array_key(items({"label": "string", "n": "integer"}, ["n", "label"])) == "label"
    assert array_key(items({"n": "integer"}, ["n"])) is None
    assert array_key({"type": "array", "items": {"type": "string"}}) is None


def test_other_arrays_are_voted_whole() -> None:
    objects = [
        order(tags=["Gift", "rush"]),
        order(tags=["gift", "rush"]),
        order(tags=["rush", "gift"]),
    ]
    vote = vote_fields(objects, ORDER)
    assert vote.object["tags"] == ["Gift", "rush"]
    assert vote.fields["tags"].votes == {'["Gift","rush"]': 2, '["rush","gift"]': 1}


def test_an_object_that_would_not_validate_falls_back_to_the_best_sample() -> None:
    a, b, c, d = ({"label": x, "sku": x, "price": 1} for x in "abcd")
    objects = [
        order(items=[a, b, c], total=5),
        order(items=[b, c, d], total=6),
        order(items=[a, c, d]),
    ]
    vote = vote_fields(objects, ORDER, [1.0, 1.2, 1.1])
    assert len({json.dumps(i) for o in objects for i in o["items"]}) == 4  # a-d: each kept, 4 > 3
    assert vote.object_from == "sample" and vote.sample == 1
    assert vote.object == objects[1] and valid(vote.object)
    assert vote.fields["total"].value == 6 and vote.fields["total"].votes == {
        "12": 1,
        "5": 1,
        "6": 1,
    }
    assert vote.fields["items"].value == ["b", "c", "d"]
    assert vote.fields["items[0].sku"].value == "b"


def test_a_json_object_format_votes_the_keys_it_finds() -> None:
    objects = [
        {"city": "Oslo", "n": 3},
        {"city": "oslo", "n": 3.0, "x": 1},
        {"city": "Bergen", "n": 3},
    ]
    vote = vote_fields(objects, {"type": "object"})
    assert vote.object == {"city": "Oslo", "n": 3}
    assert vote.fields["x"].votes == {ABSENT_LABEL: 2, "1": 1}
    assert vote.deciding() == list(vote.leaves.values())  # none is required: all decide


def test_confidence_is_the_callers_or_the_laplace_share() -> None:
    objects = [order(), order(), order(total=5)]
    assert vote_fields(objects, ORDER).fields["total"].confidence == pytest.approx(0.6)
    seen: list[str] = []

    def rate(leaf: Leaf) -> float:
        seen.append(leaf.path)
        return 0.25

    vote = vote_fields(objects, ORDER, confidence=rate)
    assert vote.fields["total"].confidence == 0.25 and "customer.name" in seen


def test_canonical_json_sorts_keys() -> None:
    assert (
        canonical_json({"b": 1, "a": [1, {"d": 2, "c": "é"}]}) == '{"a":[1,{"c":"é","d":2}],"b":1}'
    )


# --- the property: the voted object always validates ------------------------------------
_WORDS = st.sampled_from(["ann", "Ann", "bob", "cat", "Cat.", "dee"])
_ITEM = st.fixed_dictionaries(
    {"label": _WORDS, "sku": st.sampled_from(["A1", "a1", "B2", "C3", "D4"]),
     "price": st.one_of(st.integers(0, 3), st.sampled_from([1.0, 2.5]))}
)  # fmt: skip
_ORDER = st.fixed_dictionaries(
    {
        "customer": st.fixed_dictionaries({"name": _WORDS}, optional={"email": _WORDS}),
        "total": st.one_of(st.integers(0, 20), st.floats(0, 20, allow_nan=False)),
        "status": st.sampled_from(["paid", "Paid", "open"]),
        "gift": st.booleans(),
        "items": st.lists(_ITEM, min_size=1, max_size=3),
    },
    optional={"note": _WORDS, "tags": st.lists(_WORDS, max_size=3)},
)


#: ORDER with at least one item: an element-wise vote that keeps none falls back
AT_LEAST_ONE = json.loads(json.dumps(ORDER))
AT_LEAST_ONE["properties"]["items"]["minItems"] = 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ORDER, min_size=1, max_size=7), st.sampled_from([ORDER, AT_LEAST_ONE]), st.data())
def test_the_voted_object_always_validates(
    objects: list[dict[str, Any]], schema: dict[str, Any], data: st.DataObject
) -> None:
    assert all(valid(o, schema) for o in objects)
    weights = data.draw(st.lists(st.floats(1.0, 2.8), min_size=len(objects), max_size=len(objects)))
    vote = vote_fields(objects, schema, weights)
    event(f"object from {vote.object_from}")
    assert valid(vote.object, schema)
    if vote.object_from == "sample":
        assert vote.sample is not None and vote.object == objects[vote.sample]
    for path, field in vote.fields.items():
        assert sum(field.votes.values()) == len(objects), path
        assert 0 <= field.agreement <= 1 and 0 <= field.confidence <= 1
    for name in ("total", "status", "gift", "customer.name"):
        assert vote.fields[name].value == (
            vote.object[name] if "." not in name else vote.object["customer"]["name"]
        )
