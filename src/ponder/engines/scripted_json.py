"""The scripted engine's JSON objects: a value for a schema of the subset, built by hand.

:func:`build` walks a schema of :mod:`ponder.schema_subset` and returns a value valid for
it: an object has every property, an array 1 to 3 items (within ``minItems``/``maxItems``),
a string a word (its ``format``'s shape, a string matching its ``pattern``, padded or cut
to its length bounds), a number one inside its bounds, an ``enum`` one of its values, a
``const`` itself. Each leaf draws from its own :class:`random.Random`, given by the caller
per path (``"person.name"``, ``"tags.0"``), so one field can vary while the others stay.
Overrides (``{path: value}``) replace a value as given, valid or not: a test can make a
sample invalid on purpose. Hand-written: the subset is small, and no library generates
examples deterministically without a test framework (hypothesis) at run time.
"""

from __future__ import annotations

import importlib
import json
import math
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["build", "coerce"]

_WORDS = ["alpha", "bravo", "delta", "echo", "lima", "oscar", "sierra", "tango", "zulu"]
_FORMATS = {
    "date": "2024-05-17",
    "date-time": "2024-05-17T09:30:00Z",
    "time": "09:30:00",
    "email": "ann@example.com",
    "uri": "https://example.com/a",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
}

Pick = Callable[[str], random.Random]


def build(
    schema: Mapping[str, Any],
    pick: Pick,
    overrides: Mapping[str, Any] | None = None,
    path: str = "",
) -> Any:
    """A value for ``schema`` (see the module docstring); ``pick(path)`` is the leaf's rng."""
    if overrides and path in overrides:
        return overrides[path]
    if "const" in schema:
        return schema["const"]
    rng = pick(path)
    if "enum" in schema:
        return rng.choice(list(schema["enum"]))
    kinds = schema.get("type", "string")
    kind = rng.choice(kinds) if isinstance(kinds, list) else kinds
    if kind == "object":
        return {
            name: build(sub, pick, overrides, f"{path}.{name}" if path else name)
            for name, sub in schema.get("properties", {}).items()
        }
    if kind == "array":
        low, high = schema.get("minItems", 0), schema.get("maxItems", math.inf)
        count = int(min(max(rng.randint(1, 3), low), high))
        items = schema.get("items", {"type": "string"})
        return [build(items, pick, overrides, f"{path}.{i}") for i in range(count)]
    if kind in ("number", "integer"):
        return _number(schema, rng, integer=kind == "integer")
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def coerce(text: str, schema: Mapping[str, Any] | None) -> Any:
    """A directive's ``text`` as the value ``schema`` wants where it can be one (``42`` a
    number for a number, ``true`` a boolean, an enum's member by its text), else as JSON
    if it parses, else the text itself."""
    text = text.strip()
    schema = schema or {}
    for member in [*schema.get("enum", []), *([schema["const"]] if "const" in schema else [])]:
        if text in (str(member), json.dumps(member)):
            return member
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if "string" in kinds:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if "integer" in kinds and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _number(schema: Mapping[str, Any], rng: random.Random, *, integer: bool) -> int | float:
    low = schema.get("minimum", -math.inf)
    high = schema.get("maximum", math.inf)
    ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if integer:  # an open side stays infinite until _span closes it
        lo = low if ex_low is None else max(low, math.floor(ex_low) + 1)
        hi = high if ex_high is None else min(high, math.ceil(ex_high) - 1)
        lo, hi = _span(lo, hi, 100)
        return rng.randint(math.ceil(lo), math.floor(hi))
    lo = max(low, ex_low if ex_low is not None else -math.inf)
    hi = min(high, ex_high if ex_high is not None else math.inf)
    lo, hi = _span(lo, hi, 100.0)
    value = round(rng.uniform(lo, hi), 2)
    inside = (ex_low is None or value > ex_low) and (ex_high is None or value < ex_high)
    return value if inside and lo <= value <= hi else (lo + hi) / 2


def _span(lo: float, hi: float, width: float) -> tuple[float, float]:
    """Finite bounds: an open side ``width`` away from the other (from 0 when both are)."""
    if math.isinf(lo) and math.isinf(hi):
        return 0, width
    if math.isinf(lo):
        return hi - width, hi
    if math.isinf(hi):
        return lo, lo + width
    return lo, hi


def _string(schema: Mapping[str, Any], rng: random.Random) -> str:
    word = _FORMATS.get(schema.get("format", ""), rng.choice(_WORDS))
    pattern = schema.get("pattern")
    if pattern is not None:
        candidates = [word, *_WORDS, *(_from_regex(pattern, random.Random(i)) for i in range(8))]
        word = next((c for c in candidates if c is not None and re.search(pattern, c)), "")
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    while len(word) < low:
        word += rng.choice(_WORDS)
    return word if high is None else word[:high]


def _from_regex(pattern: str, rng: random.Random) -> str | None:
    """A string the regular expression matches, from its parse tree (``re._parser``, the
    standard library's own); None where it holds what this does not draw."""
    try:
        parser: Any = importlib.import_module("re._parser")
        return "".join(_draw(list(parser.parse(pattern)), rng))
    except Exception:
        return None


def _draw(nodes: list[Any], rng: random.Random) -> list[str]:
    out: list[str] = []
    for op, arg in nodes:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "IN":
            out.append(_char_in(arg, rng))
        elif name == "ANY":
            out.append("a")
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            for _ in range(rng.randint(low, max(low, min(high, low + 2)))):
                out.extend(_draw(list(sub), rng))
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            out.extend(_draw(list(arg[-1] if name == "SUBPATTERN" else arg), rng))
        elif name == "BRANCH":
            out.extend(_draw(list(rng.choice(arg[1])), rng))
        elif name == "CATEGORY":
            out.append(_char_in([(op, arg)], rng))
        elif name != "AT":
            raise ValueError(name)
    return out


def _char_in(items: list[Any], rng: random.Random) -> str:
    if items and str(items[0][0]) == "NEGATE":
        raise ValueError("NEGATE")
    op, arg = rng.choice(items)
    name = str(op)
    if name == "LITERAL":
        return chr(arg)
    if name == "RANGE":
        return chr(rng.randint(*arg))
    if name == "CATEGORY":
        return {"CATEGORY_DIGIT": "7", "CATEGORY_SPACE": " ", "CATEGORY_WORD": "w"}[str(arg)]
    raise ValueError(name)
