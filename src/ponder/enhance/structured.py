"""Structured answers: a sample's JSON object, and the vote field by field.

A structured task (``Task.response_format``) asks every sample for one JSON object valid
for a schema (:mod:`ponder.schema_subset`). :func:`parse_sample` finds the object in a
sample's text (a ```json fence or prose around it, as small models write) and validates
it (JSON Schema draft 2020-12); a sample without a valid object does not vote.

:func:`vote_fields` builds the answer leaf by leaf over the valid objects, each leaf voted
with its type's equivalence (the groups of equal keys, heaviest group first; weights are
the samples' vote weights, ties go to more votes, then the earliest sample):

- numbers as math answers (the math answer type's key: ``12``, ``12.0`` and ``1.2e1``
  are one answer); strings as text answers (the text answer type's key: case,
  punctuation, articles and plural -s do not split a vote); ``enum``/``const`` values,
  booleans and null exactly;
- arrays whose items are objects with a key property (:func:`array_key`) element by
  element: an element (its key, normalised as a string) is kept when the samples that
  hold it outweigh those whose array lacks it, in the mean order of its positions, and
  its fields are voted among the samples that hold it; the set of elements is a leaf of
  its own at the array's path (``members``). Other arrays are voted whole (the
  equivalence key of each item, in order);
- an optional property missing from a sample is a vote for "absent" (shown as
  ``(absent)``); an optional object or keyed array is first voted present or absent.

The winner's value is the spelling its samples wrote most (by weight). Each leaf's
statistics count every valid sample: one that lacks the leaf's parent counts as
``(absent)`` there, so ``agreement`` is the winner's share of the valid samples. Where
the assembled object would not validate (``minItems`` of a voted array, say), the answer
is the best whole valid sample (the heaviest; the earliest of equals) and its fields are
the votes of its own values (``object_from == "sample"``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from ponder.enhance.answers import ANSWER_TYPES
from ponder.enhance.calibration import laplace_cap
from ponder.enhance.fences import fenced_blocks
from ponder.types import FieldVote, TaskType

__all__ = [
    "ABSENT_LABEL",
    "DISPLAY_CHARS",
    "FieldwiseVote",
    "Leaf",
    "LeafKind",
    "array_key",
    "canonical_json",
    "display",
    "object_key",
    "parse_sample",
    "vote_fields",
]

#: a vote label is the value's canonical JSON cut to this many characters
DISPLAY_CHARS = 60
#: the label of the votes for "this field is not there"
ABSENT_LABEL = "(absent)"
#: the names a key property of an array's items is looked for under, in order
KEY_NAMES = ("id", "key", "sku", "code", "name", "title")
#: parse_sample looks at the end of long texts only, and at this many {…} spans at most
_TAIL_CHARS = 20_000
_MAX_SPANS = 50
_ERROR_CHARS = 200

#: how a leaf was voted: ``number`` (math keys), ``string`` (text keys), ``exact`` (enum,
#: const, boolean, null), ``whole`` (an array or object as one value), ``members`` (the
#: elements of a keyed array), ``presence`` (an optional object or array voted absent)
LeafKind = Literal["number", "string", "exact", "whole", "members", "presence"]


class _Missing:
    """A sample's entry where the leaf is not: ``absent`` (its parent lacks it: a vote for
    absent where the leaf is optional) or ``gone`` (the parent itself is not there)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_ABSENT = _Missing("absent")
_GONE = _Missing("gone")


# --- parsing ----------------------------------------------------------------------------
def canonical_json(value: Any) -> str:
    """The JSON text of ``value`` with sorted keys and no spaces (a structured answer)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def display(value: Any) -> str:
    """A vote's label: the canonical JSON cut to :data:`DISPLAY_CHARS` characters."""
    text = canonical_json(value)
    return text if len(text) <= DISPLAY_CHARS else text[: DISPLAY_CHARS - 1] + "\u2026"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constant)


def _spans(text: str) -> Iterator[tuple[int, int | None]]:
    """The outermost ``{…}`` spans of ``text`` (braces inside JSON strings not counted),
    in order; an object that never closes ends the text (its end None). Linear."""
    depth, quoted, escaped, start = 0, False, False, 0
    for i, c in enumerate(text):
        if quoted:
            escaped, quoted = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            quoted = depth > 0
        elif c == "{":
            start = i if depth == 0 else start
            depth += 1
        elif c == "}" and depth:
            depth -= 1
            if depth == 0:
                yield start, i + 1
    if depth:
        yield start, None


def _find_object(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object in ``text``: the whole text, else a fenced block's body, else the
    last ``{…}`` span that decodes to an object (prose around it)."""
    text = text[-_TAIL_CHARS:].strip()
    bodies = [text] + [body for lang, body in fenced_blocks(text) if lang in ("", "json")]
    for body in bodies:
        if body.strip().startswith("{"):
            with contextlib.suppress(ValueError, RecursionError):
                found = _loads(body)
                if isinstance(found, dict):
                    return found, None
    last: dict[str, Any] | None = None
    why: str | None = None
    for start, end in itertools.islice(_spans(text), _MAX_SPANS):
        try:
            found = _loads(text[start:end])
        except (ValueError, RecursionError) as e:
            why = why or f"invalid JSON: {e}"
            continue
        if isinstance(found, dict):
            last = found
    if last is not None:
        return last, None
    return None, why or "no JSON object in the text"


@functools.lru_cache(maxsize=64)
def _validator(schema_text: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema_text))


def _validator_of(schema: Mapping[str, Any]) -> Draft202012Validator:
    return _validator(canonical_json(schema))


def _schema_error(obj: Any, schema: Mapping[str, Any]) -> str | None:
    error = best_match(_validator_of(schema).iter_errors(obj))
    if error is None:
        return None
    where = _path_text(error.absolute_path) or "the object"
    message = " ".join(f"{where}: {error.message}".split())
    return message if len(message) <= _ERROR_CHARS else message[: _ERROR_CHARS - 1] + "\u2026"


def _path_text(parts: Sequence[str | int]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def parse_sample(text: str, schema: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """``(the object, None)`` when ``text`` holds one JSON object valid for ``schema``
    (draft 2020-12), else ``(None, why)`` in one short line. Never raises on any text."""
    found, why = _find_object(text or "")
    if found is None:
        return None, " ".join((why or "").split())[:_ERROR_CHARS]
    error = _schema_error(found, schema)
    return (None, error) if error is not None else (found, None)


# --- equivalence ------------------------------------------------------------------------
def _sub(schema: Any, name: str) -> Mapping[str, Any]:
    """A subschema (``items``, ``additionalProperties``): {} (anything) unless a mapping."""
    value = schema.get(name) if isinstance(schema, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _properties(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    value = schema.get("properties")
    return value if isinstance(value, Mapping) else {}


def _may_be(schema: Mapping[str, Any], kind: str) -> bool:
    """Whether the schema allows values of JSON type ``kind`` (no ``type``: any)."""
    kinds = schema.get("type")
    return kinds is None or kinds == kind or (isinstance(kinds, list) and kind in kinds)


def _exact(schema: Mapping[str, Any], value: Any) -> bool:
    return "enum" in schema or "const" in schema or value is None or isinstance(value, bool)


def _number_key(value: int | float) -> str:
    return ANSWER_TYPES[TaskType.math].key(repr(value) if isinstance(value, float) else str(value))


def _value_key(value: Any, schema: Mapping[str, Any]) -> str:
    """Equal keys: the same answer (see the module docstring)."""
    if _exact(schema, value):
        return "=" + canonical_json(value)
    if isinstance(value, int | float):
        return "n" + _number_key(value)
    if isinstance(value, str):
        return "s" + ANSWER_TYPES[TaskType.text].key(value)
    if isinstance(value, list):
        items = _sub(schema, "items")
        return "a" + json.dumps([_value_key(v, items) for v in value])
    if isinstance(value, dict):
        props, extra = _properties(schema), _sub(schema, "additionalProperties")
        keys = {k: _value_key(v, _sub(props, k) if k in props else extra) for k, v in value.items()}
        return "o" + json.dumps(keys, sort_keys=True)
    return "=" + canonical_json(value)


def object_key(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> str:
    """The equivalence key of a whole object: equal keys, equal leaf by leaf."""
    return _value_key(dict(obj), schema)


def _kind(value: Any, schema: Mapping[str, Any]) -> LeafKind:
    if _exact(schema, value):
        return "exact"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "whole"


def array_key(schema: Mapping[str, Any]) -> str | None:
    """The key property of an array's items, where they are objects: a required string
    property named like :data:`KEY_NAMES` (``id``, ``sku``, ``name``, … or ending in
    ``_id``), else the first required string property; None otherwise."""
    items = _sub(schema, "items")
    if items.get("type") != "object":
        return None
    props = _properties(items)
    required = items.get("required") or []
    strings: list[str] = [n for n in required if _sub(props, n).get("type") == "string"]
    for name in KEY_NAMES:
        if name in strings:
            return name
    named = [n for n in strings if n.lower().endswith("id")]
    return (named or strings)[0] if strings else None


def _text_key(value: Any) -> str:
    return ANSWER_TYPES[TaskType.text].key(value) if isinstance(value, str) else repr(value)


# --- the vote ---------------------------------------------------------------------------
@dataclass
class Leaf:
    """One leaf's vote: the voted value (None where "absent" won), the votes of each
    value by its label, the samples of the winning group (indices into the objects) and
    the size of the largest other group ("absent" included)."""

    path: str
    kind: LeafKind
    value: Any
    absent: bool
    #: reached from the root through required properties only (keyed arrays' elements
    #: included): the stop rule and the result's confidence look at these
    required: bool
    votes: dict[str, int]
    winners: list[int]
    runner_up: int
    voters: int

    @property
    def agreement(self) -> float:
        return len(self.winners) / self.voters if self.voters else 0.0

    @property
    def label(self) -> str:
        return ABSENT_LABEL if self.absent else display(self.value)


@dataclass
class FieldwiseVote:
    """The voted object, each leaf's :class:`~ponder.types.FieldVote` by path, how the
    object was made (``fields`` or ``sample``) and the leaves' full tallies."""

    object: dict[str, Any]
    fields: dict[str, FieldVote]
    object_from: Literal["fields", "sample"]
    leaves: dict[str, Leaf] = field(default_factory=dict)
    #: object_from == "sample": the index of that object
    sample: int | None = None

    def deciding(self) -> list[Leaf]:
        """The leaves the answer stands on: the required ones, else every leaf."""
        required = [leaf for leaf in self.leaves.values() if leaf.required]
        return required or list(self.leaves.values())


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _tally(labels: Sequence[tuple[str, int]]) -> dict[str, int]:
    votes: dict[str, int] = {}
    for label, count in labels:
        votes[label] = votes.get(label, 0) + count
    return dict(sorted(votes.items(), key=lambda kv: -kv[1]))


class _Walk:
    """One pass over the schema and the objects, recording a :class:`Leaf` per leaf.
    ``prefer``: every choice goes to the group that holds that object (the fallback)."""

    def __init__(self, weights: Sequence[float], prefer: int | None) -> None:
        self.weights = weights
        self.prefer = prefer
        self.leaves: dict[str, Leaf] = {}

    def choose(self, groups: Sequence[Sequence[int]]) -> int | None:
        """The winning group: the preferred object's, else the heaviest, then the larger,
        then the one with the earliest object. None when every group is empty."""
        live = [j for j, g in enumerate(groups) if g]
        if self.prefer is not None:
            held = [j for j in live if self.prefer in groups[j]]
            if held:
                return held[0]

        def rank(j: int) -> tuple[float, int, int]:
            g = groups[j]
            return (-round(sum(self.weights[i] for i in g), 9), -len(g), min(g))

        return min(live, key=rank, default=None)

    def node(
        self,
        schema: Mapping[str, Any],
        entries: list[Any],
        path: str,
        required: bool,
        optional: bool,
    ) -> Any:
        present = [e for e in entries if not isinstance(e, _Missing)]
        if present and all(isinstance(e, dict) for e in present) and _may_be(schema, "object"):
            if optional and not self.present(entries, path):
                return _ABSENT
            return self.object(schema, entries, path, required)
        key = array_key(schema)
        if key is not None and present and all(_keyed(e, key) for e in present):
            if optional and not self.present(entries, path):
                return _ABSENT
            return self.array(schema, entries, path, required, key)
        return self.leaf(schema, entries, path, required, optional)

    def present(self, entries: Sequence[Any], path: str) -> bool:
        """An optional object or array: whether the samples that hold it outweigh those
        whose parent lacks it; a lost vote is recorded as a ``presence`` leaf."""
        has = [i for i, e in enumerate(entries) if not isinstance(e, _Missing)]
        lacks = [i for i, e in enumerate(entries) if e is _ABSENT]
        if self.choose([has, lacks]) == 0:
            return True
        missing = [i for i, e in enumerate(entries) if isinstance(e, _Missing)]
        votes = _tally([(ABSENT_LABEL, len(missing)), ("(present)", len(has))])
        self.leaves[path] = Leaf(
            path, "presence", None, True, False, votes, missing, len(has), len(entries)
        )
        return False

    def object(
        self, schema: Mapping[str, Any], entries: Sequence[Any], path: str, required: bool
    ) -> dict[str, Any]:
        props, extra = _properties(schema), schema.get("additionalProperties", True)
        names = dict.fromkeys(props)
        if extra is not False:
            for e in entries:
                names.update(dict.fromkeys(e if isinstance(e, dict) else ()))
        needed = set(schema.get("required") or [])
        out: dict[str, Any] = {}
        for name in names:
            sub = _sub(props, name) if name in props else _sub(schema, "additionalProperties")
            child = [e.get(name, _ABSENT) if isinstance(e, dict) else _GONE for e in entries]
            is_required = name in needed
            value = self.node(
                sub, child, _join(path, name), required and is_required, not is_required
            )
            if value is not _ABSENT:
                out[name] = value
        return out

    def leaf(
        self,
        schema: Mapping[str, Any],
        entries: Sequence[Any],
        path: str,
        required: bool,
        optional: bool,
    ) -> Any:
        groups: dict[str, list[int]] = {}
        for i, e in enumerate(entries):
            if not isinstance(e, _Missing):
                groups.setdefault(_value_key(e, schema), []).append(i)
        options = list(groups.values())
        own_absent = [i for i, e in enumerate(entries) if e is _ABSENT]
        winner = self.choose([*options, own_absent if optional else []])
        if winner is None:
            return _ABSENT
        missing = [i for i, e in enumerate(entries) if isinstance(e, _Missing)]
        absent = winner == len(options)
        winners = missing if absent else options[winner]
        value = None if absent else self.spelling(entries, winners)
        others = [len(g) for j, g in enumerate(options) if absent or j != winner]
        runner_up = max([*others, 0 if absent else len(missing)])
        labels = [(display(self.spelling(entries, g)), len(g)) for g in options]
        votes = _tally([*labels, (ABSENT_LABEL, len(missing))] if missing else labels)
        first = next((e for e in entries if not isinstance(e, _Missing)), None)
        self.leaves[path] = Leaf(
            path,
            _kind(first, schema),
            value,
            absent,
            required,
            votes,
            winners,
            runner_up,
            len(entries),
        )
        return _ABSENT if absent else value

    def spelling(self, entries: Sequence[Any], members: Sequence[int]) -> Any:
        """The group's value as its samples wrote it most (by weight); the preferred
        object's own where it is in the group."""
        if self.prefer is not None and self.prefer in members:
            return entries[self.prefer]
        forms: dict[str, list[int]] = {}
        for i in members:
            forms.setdefault(canonical_json(entries[i]), []).append(i)
        best = self.choose(list(forms.values()))
        return entries[list(forms.values())[best or 0][0]]

    def array(
        self, schema: Mapping[str, Any], entries: Sequence[Any], path: str, required: bool, key: str
    ) -> list[Any]:
        """A keyed array, element by element (see the module docstring)."""
        found: dict[tuple[str, int], dict[int, tuple[int, Any]]] = {}
        for i, e in enumerate(entries):
            seen: dict[str, int] = {}
            for pos, element in enumerate(e if isinstance(e, list) else []):
                k = _text_key(element[key])
                seen[k] = seen.get(k, 0) + 1
                found.setdefault((k, seen[k]), {})[i] = (pos, element)
        having = [i for i, e in enumerate(entries) if isinstance(e, list)]
        kept = [
            ident
            for ident, where in found.items()
            if self.choose([list(where), [i for i in having if i not in where]]) == 0
        ]
        order = {ident: n for n, ident in enumerate(found)}

        def position(ident: tuple[str, int]) -> tuple[float, int]:
            where = found[ident]
            if self.prefer is not None and self.prefer in where:
                return (where[self.prefer][0], order[ident])
            return (sum(p for p, _ in where.values()) / len(where), order[ident])

        kept.sort(key=position)
        self.members(path, entries, found, kept, key, required)
        items = _sub(schema, "items")
        return [
            self.object(
                items,
                [found[ident].get(i, (0, _GONE))[1] for i in range(len(entries))],
                f"{path}[{n}]",
                required,
            )
            for n, ident in enumerate(kept)
        ]

    def members(
        self,
        path: str,
        entries: Sequence[Any],
        found: Mapping[tuple[str, int], Mapping[int, tuple[int, Any]]],
        kept: Sequence[tuple[str, int]],
        key: str,
        required: bool,
    ) -> None:
        """The ``members`` leaf of a keyed array: the set of its elements, voted whole."""
        sets: dict[frozenset[tuple[str, int]] | None, list[int]] = {}
        for i, e in enumerate(entries):
            mine = frozenset(ident for ident, where in found.items() if i in where)
            sets.setdefault(mine if isinstance(e, list) else None, []).append(i)
        chosen = frozenset(kept)
        winners = sets.get(chosen, [])
        names = {ident: next(iter(where.values()))[1][key] for ident, where in found.items()}

        def label(members: frozenset[tuple[str, int]] | None) -> str:
            if members is None:
                return ABSENT_LABEL
            return display(sorted(names[ident] for ident in members))

        votes = _tally([(label(s), len(g)) for s, g in sets.items()])
        runner_up = max((len(g) for s, g in sets.items() if s != chosen), default=0)
        value = [names[ident] for ident in kept]
        self.leaves[path] = Leaf(
            path, "members", value, False, required, votes, winners, runner_up, len(entries)
        )


def _keyed(entry: Any, key: str) -> bool:
    return isinstance(entry, list) and all(
        isinstance(e, dict) and isinstance(e.get(key), str) for e in entry
    )


def vote_fields(
    objects: Sequence[Mapping[str, Any]],
    schema: Mapping[str, Any],
    weights: Sequence[float] | None = None,
    *,
    confidence: Callable[[Leaf], float] | None = None,
) -> FieldwiseVote:
    """The object voted leaf by leaf over ``objects`` (valid for ``schema``; at least
    one), each weighing its ``weights`` entry (1 by default). Each field's confidence is
    ``confidence(leaf)``, by default the Laplace share ``(votes + 1) / (valid + 2)``.
    Where the assembled object is not valid for the schema, the heaviest object (the
    earliest of equals) with the votes of its own values (see the module docstring)."""
    if not objects:
        raise ValueError("vote_fields needs at least one object")
    weights = list(weights) if weights is not None else [1.0] * len(objects)
    if len(weights) != len(objects):
        raise ValueError(f"{len(weights)} weights for {len(objects)} objects")
    entries: list[Any] = [dict(o) for o in objects]
    walk = _Walk(weights, None)
    voted = walk.object(schema, entries, "", True)
    source: Literal["fields", "sample"] = "fields"
    best: int | None = None
    if _schema_error(voted, schema) is not None:
        best = min(range(len(objects)), key=lambda i: (-round(weights[i], 9), i))
        walk = _Walk(weights, best)
        walk.object(schema, entries, "", True)
        voted, source = entries[best], "sample"
    rate = confidence or (lambda leaf: laplace_cap(len(leaf.winners), leaf.voters))
    fields = {
        path: FieldVote(
            value=leaf.value,
            votes=leaf.votes,
            agreement=round(leaf.agreement, 4),
            confidence=round(rate(leaf), 4),
        )
        for path, leaf in walk.leaves.items()
    }
    return FieldwiseVote(voted, fields, source, walk.leaves, best)
