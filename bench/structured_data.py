"""The structured benchmark's problems, generated offline (``bench/structured.py``).

- **Extraction** (:func:`extraction_set`): short texts built from templates, each about
  a person, an order or an event, with distractors (a second person, a list price beside
  the total, a date the event moved from, last year's attendance …); the gold JSON is
  known because the text was written from it. One schema per family.
- **Math as JSON** (:func:`math_set`): the quality benchmark's reasoning-gym problems
  (``quality_collect.Scorer``, the same seed, so the prose answers already recorded for
  the same problems can be compared), asked for ``{"reasoning": string, "answer":
  number}`` — reasoning first, since constrained decoding writes the properties in the
  schema's order and an answer written before its reasoning would be a greedy guess.

Every string has a ``maxLength`` and every list a ``maxItems``: a small model that loops
inside a string would otherwise run to the token limit and leave the object unclosed.

Everything is a pure function of the seed: the same seed gives the same texts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

FIRST = (
    "Amira", "Bruno", "Chen", "Dalia", "Emeka", "Fatima", "Goran", "Hana", "Ivan", "Jonas",
    "Keiko", "Lars", "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Samir", "Tove",
    "Uma", "Viktor", "Wen", "Ximena", "Yusuf", "Zofia",
)  # fmt: skip
LAST = (
    "Okafor", "Lindqvist", "Moreau", "Tanaka", "Kowalski", "Haddad", "Novak", "Ferreira",
    "Castillo", "Nakamura", "Brennan", "Dubois", "Petrov", "Sato", "Varga", "Weber",
)  # fmt: skip
CITIES = (
    "Lisbon", "Osaka", "Nairobi", "Tallinn", "Porto", "Lyon", "Krakow", "Valencia", "Bergen",
    "Leipzig", "Quito", "Hobart", "Tampere", "Bilbao", "Graz", "Malmo",
)  # fmt: skip
ROLES = ("engineer", "teacher", "nurse", "chef", "lawyer", "farmer", "pilot", "artist")
CATEGORIES = ("conference", "concert", "workshop", "festival", "meetup")
CURRENCIES = ("USD", "EUR", "GBP")
PRODUCTS = ("lamp", "kettle", "chair", "notebook", "backpack", "blender", "mirror", "rug")
EVENT_WORDS = ("Harbour", "Northern", "Open", "Spring", "Digital", "River", "Summit", "Night")
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip

PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 60, "description": "the main person's full name"},
        "age": {"type": "integer"},
        "city": {
            "type": "string",
            "maxLength": 40,
            "description": "where the main person lives now",
        },
        "occupation": {"type": "string", "enum": list(ROLES)},
    },
    "required": ["name", "age", "city", "occupation"],
    "additionalProperties": False,
}
ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "maxLength": 20},
        "customer": {"type": "string", "maxLength": 60},
        "total": {"type": "number", "description": "the amount paid"},
        "currency": {"type": "string", "enum": list(CURRENCIES)},
        "items": {
            "type": "array",
            "maxItems": 5,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 20},
                    "quantity": {"type": "integer"},
                },
                "required": ["sku", "quantity"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["order_id", "customer", "total", "currency", "items"],
    "additionalProperties": False,
}
EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "date": {
            "type": "string",
            "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
            "description": "the date it takes place, YYYY-MM-DD",
        },
        "city": {"type": "string", "maxLength": 40, "description": "where it takes place"},
        "attendees": {"type": "integer", "description": "attendees expected this time"},
        "category": {"type": "string", "enum": list(CATEGORIES)},
    },
    "required": ["title", "date", "city", "attendees", "category"],
    "additionalProperties": False,
}
MATH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reasoning": {"type": "string", "maxLength": 600},
        "answer": {"type": "number"},
    },
    "required": ["reasoning", "answer"],
    "additionalProperties": False,
}
SCHEMAS = {"person": PERSON_SCHEMA, "order": ORDER_SCHEMA, "event": EVENT_SCHEMA}
INSTRUCTION = {
    "person": "Extract the main person described in the text.",
    "order": "Extract the order described in the text.",
    "event": "Extract the event described in the text, as it will take place.",
}


@dataclass(frozen=True)
class Problem:
    """One problem: its key (``family/index``), the prompt, the schema and the gold object
    (for math, the expected answer as reasoning-gym states it, under ``answer``)."""

    key: str
    family: str
    prompt: str
    schema: dict[str, Any]
    gold: dict[str, Any]


def _name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _date(rng: random.Random) -> tuple[str, str]:
    """(ISO date, the date as a text writes it)."""
    year, month, day = rng.choice((2025, 2026, 2027)), rng.randrange(1, 13), rng.randrange(1, 29)
    return f"{year:04d}-{month:02d}-{day:02d}", f"{day} {MONTHS[month - 1]} {year}"


def _person(rng: random.Random) -> tuple[str, dict[str, Any]]:
    name, other = _name(rng), _name(rng)
    age, other_age = rng.randrange(22, 70), rng.randrange(22, 70)
    city, old_city, other_city = rng.sample(CITIES, 3)
    role, other_role = rng.sample(ROLES, 2)
    moved = rng.randrange(2001, 2024)
    text = rng.choice((
        f"{name} is a {age}-year-old {role} who moved from {old_city} to {city} in {moved}. "
        f"Her neighbour, {other}, is {other_age} and works as a {other_role} in {other_city}.",
        f"Meet {name}: {age} years old, a {role} by trade, living in {city} since {moved} "
        f"(before that, {old_city}). {name.split()[0]}'s cousin {other}, a {other_role}, "
        f"turned {other_age} last week.",
        f"After {moved - 2000} years in {old_city}, {role} {name} ({age}) now lives in {city}. "
        f"The flat was found by {other}, {other_age}, a {other_role} from {other_city}.",
    ))  # fmt: skip
    return text, {"name": name, "age": age, "city": city, "occupation": role}


def _order(rng: random.Random) -> tuple[str, dict[str, Any]]:
    order_id = f"{rng.choice('ABCDEFGH')}{rng.randrange(10000, 99999)}"
    customer, courier = _name(rng), _name(rng)
    currency = rng.choice(CURRENCIES)
    lines = [
        (f"{product[:3].upper()}-{rng.randrange(100, 999)}", rng.randrange(1, 6))
        for product in rng.sample(PRODUCTS, rng.choice((1, 2, 2, 3)))
    ]
    listed = rng.randrange(40, 400)
    discount = rng.choice((5, 10, 15, 20))
    total = round(listed * (100 - discount) / 100, 2)
    _, placed = _date(rng)
    items = " and ".join(f"{q} x {sku}" for sku, q in lines)
    text = rng.choice((
        f"Order {order_id} was placed by {customer} on {placed}: {items}. The list price was "
        f"{listed} {currency}; after a {discount}% discount the total paid was {total} "
        f"{currency}. Courier: {courier}.",
        f"{customer} ordered {items} ({order_id}). With {discount}% off the {listed} "
        f"{currency} list price, {customer.split()[0]} paid {total} {currency}. It ships on "
        f"{placed} with {courier}.",
    ))  # fmt: skip
    gold = {
        "order_id": order_id,
        "customer": customer,
        "total": total,
        "currency": currency,
        "items": [{"sku": sku, "quantity": q} for sku, q in lines],
    }
    return text, gold


def _event(rng: random.Random) -> tuple[str, dict[str, Any]]:
    category = rng.choice(CATEGORIES)
    title = f"{rng.choice(EVENT_WORDS)} {rng.choice(EVENT_WORDS)} {category.title()}"
    city, first_city = rng.sample(CITIES, 2)
    (date, said), (_, first_said) = _date(rng), _date(rng)
    attendees, last_year = rng.randrange(40, 5000), rng.randrange(40, 5000)
    organiser = _name(rng)
    text = rng.choice((
        f"The {title} was first planned for {first_said} in {first_city}, but it has moved "
        f"to {said} in {city}. Organisers expect {attendees} attendees, against {last_year} "
        "last year.",
        f"{organiser} confirmed that the {title} takes place in {city} on {said} (not "
        f"{first_said}, as first announced in {first_city}). {attendees} people are expected; "
        f"{last_year} came last time.",
    ))  # fmt: skip
    gold = {"title": title, "date": date, "city": city, "attendees": attendees,
            "category": category}  # fmt: skip
    return text, gold


_MAKERS = {"person": _person, "order": _order, "event": _event}


def extraction_set(size: int, seed: int) -> list[Problem]:
    """``size`` extraction problems, the families in turn."""
    problems = []
    for i in range(size):
        family = tuple(_MAKERS)[i % len(_MAKERS)]
        text, gold = _MAKERS[family](random.Random(seed * 1_000_003 + i))
        prompt = f"{INSTRUCTION[family]}\n\nText: {text}"
        problems.append(Problem(f"{family}/{i}", family, prompt, SCHEMAS[family], gold))
    return problems


def math_set(size: int, seed: int) -> list[Problem]:
    """The first ``size`` math problems of the quality benchmark's list (its datasets
    without the text and choice ones), as JSON tasks."""
    from quality_collect import DATASETS, TASK_TYPES, Scorer

    math = [d for d in DATASETS if d not in TASK_TYPES]
    scorer = Scorer(math, size, seed)
    return [
        Problem(p.key, "math", p.question, MATH_SCHEMA, {"answer": p.expected})
        for p in scorer.problems()[:size]
    ]
