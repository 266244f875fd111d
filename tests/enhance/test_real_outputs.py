"""Extraction on real model output: a table collected from the quality benchmark.

``real_outputs.json`` holds samples that SmolLM2-135M and Qwen2.5-Coder-0.5B wrote for
the benchmark's problems (``bench/quality_collect.py``, a pilot of 12 and 8 problems),
each with the answer a person reads in it, written by hand (None: the text states no
answer; texts where a reader cannot tell were left out). Extraction must agree on at
least 95 % of them; the cases it misses are listed by the assertion.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ponder.enhance.answers import answer_type

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).with_name("real_outputs.json")).read_text(encoding="utf-8")
)


def _agrees(case: dict[str, Any]) -> bool:
    kind = answer_type(case["task_type"])
    got = kind.extract(case["text"], kind.question(case["prompt"]))
    expected = case["expected"]
    if got is None or expected is None:
        return got == expected
    return kind.same(got, expected)


def test_the_table_is_large_and_from_both_models() -> None:
    assert len(CASES) >= 150
    assert {c["model"] for c in CASES} == {"smollm2-135m", "qwen0.5b"}
    assert any(c["expected"] is None for c in CASES)


def test_extraction_agrees_with_the_hand_checked_answers() -> None:
    missed = [(c["model"], c["problem"], c["expected"], c["text"][-120:]) for c in CASES
              if not _agrees(c)]  # fmt: skip
    assert len(missed) <= 0.05 * len(CASES), missed
