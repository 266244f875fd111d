"""Extraction on real model output: a table of samples labelled by reading each one.

``extraction_table.jsonl`` holds samples that SmolLM2-135M (the current engine and an
earlier one) and Qwen2.5-Coder-0.5B wrote for the quality benchmark
(``bench/quality_collect.py``), drawn only from problems of the fit half
(``bench/quality_replay.py: half_of(key) == 0``; ``key`` says which problem), one row per
distinct text. ``expected`` is the answer a reader finds in the text, or None when it
states none; texts where a reader cannot tell (a loop cut off mid-number, a contradiction)
were left out. How they were read:

* math: the last ``\\boxed{}``/``####``/"the answer is …" statement, else the last
  result the text states (a number after "=", "is", "gives us", a number alone on its
  line) — not an operand, a list or step number, or a number of the question restated;
  None when there is no result (only the question's numbers, or a statement cut before
  its result). A program-of-thought sample is read from the last line its program
  printed (``program_output``), as the strategy does.
* choice: the letter stated ("B) 0", "The answer is D) 10", an option's text alone);
  a copy of two or more options with no answer statement states none.
* text (family relationships): the short answer of the answer statement, else of the
  first sentence that states one: the relation word ("Aria is the mother of David" →
  ``mother``, "Phoenix is married to Lisa" → ``married``), the name or word given
  ("The answer is "Victoria"" → ``Victoria``); None when it only restates the question
  ("The answer is Kai to Aria") or states no relation.

Extraction must agree (same answer for the task type) on at least 97 % of the rows; the
rows it misses are printed and listed by the assertion.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from ponder.enhance.answers import answer_type

TABLE = Path(__file__).with_name("extraction_table.jsonl")
ROWS: list[dict[str, Any]] = [
    json.loads(line) for line in TABLE.read_text(encoding="utf-8").splitlines() if line.strip()
]
PASS_RATE = 0.97


def extracted(row: dict[str, Any]) -> str | None:
    """What the strategy extracts from the row (a program's last printed line for pot)."""
    text = row["text"]
    if row.get("program_output") is not None:
        lines = [line for line in row["program_output"].splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    kind = answer_type(row["task_type"])
    return kind.extract(text, kind.question(row["question"])) if text.strip() else None


def agrees(row: dict[str, Any]) -> bool:
    got, expected = extracted(row), row["expected"]
    if got is None or expected is None:
        return got == expected
    return answer_type(row["task_type"]).same(got, expected)


def test_the_table_covers_both_models_and_every_dataset() -> None:
    assert len(ROWS) >= 300
    cells = Counter((r["model"], r["dataset"]) for r in ROWS)
    assert {m for m, _ in cells} == {"smollm2-135m", "qwen0.5b"}
    assert {d for _, d in cells} == {
        "gsm_symbolic", "basic_arithmetic", "chain_sum", "family_relationships",
        "arithmetic_choice",
    }  # fmt: skip
    assert sum(r["expected"] is None for r in ROWS) >= 10
    distinct = {(r["model"], r["question"], r["text"], r.get("program_output")) for r in ROWS}
    assert len(distinct) == len(ROWS)


def test_the_rows_come_from_the_fit_half_only() -> None:
    import hashlib

    assert all(hashlib.sha256(r["key"].encode()).digest()[0] & 1 == 0 for r in ROWS)


def test_extraction_agrees_with_the_labelled_table() -> None:
    missed = [r for r in ROWS if not agrees(r)]
    for r in missed:
        print(
            f"{r['model']} {r['key']} {r['mode']}/{r['path']}: expected {r['expected']!r}, "
            f"got {extracted(r)!r}\n    {r['text'][-160:]!r}"
        )
    rate = 1 - len(missed) / len(ROWS)
    print(f"extraction agrees on {len(ROWS) - len(missed)}/{len(ROWS)} rows ({rate:.1%})")
    assert rate >= PASS_RATE, [(r["key"], r["expected"], extracted(r)) for r in missed]


def test_the_check_can_fail() -> None:
    """A wrong label is caught: the agreement test is not vacuous."""
    wrong = [{**r, "expected": "no such answer" if r["expected"] is None else None} for r in ROWS]
    assert sum(agrees(r) for r in wrong) / len(wrong) < 0.05
