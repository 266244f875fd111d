"""Planning, early stopping and the confidence-weighted vote (pure functions)."""

from __future__ import annotations

import pytest

from ponder.config import load_settings
from ponder.enhance.strategy import decided, first_wave, fuse, plan_samples, sample_messages
from ponder.types import Sample, SampleStatus, Task, TaskType

SETTINGS = load_settings()


def s(index: int, answer: str | None, *, conf: float = 0.5, status: str = "done", path: str = "cot",
      passed: int | None = None, failed: int | None = None) -> Sample:  # fmt: skip
    return Sample(
        index=index, path=path, temperature=0.5, seed=index, status=SampleStatus(status),
        text=f"work... The answer is {answer}." if answer is not None else "no idea",
        answer=answer, confidence=conf, tests_passed=passed, tests_failed=failed,
    )  # fmt: skip


def test_deep_spreads_paths_and_pot_only_for_math() -> None:
    deep = SETTINGS.mode("deep")
    math_task = Task(id="1764412800123-a-1", task_type=TaskType.math, samples_planned=5)
    assert [x.path for x in plan_samples(math_task, deep)] == [
        "cot", "decompose", "pot", "cot", "decompose"
    ]  # fmt: skip
    text_task = Task(id="1764412800123-a-2", task_type=TaskType.text, samples_planned=3)
    assert [x.path for x in plan_samples(text_task, deep)] == ["cot", "decompose", "cot"]
    seeds = [x.seed for x in plan_samples(math_task, deep)]
    assert seeds == [x.seed for x in plan_samples(math_task, deep)] and len(set(seeds)) == 5


def test_messages_carry_the_path_instruction() -> None:
    task = Task(id="1764412800123-a-1", prompt="What is 2+2?", task_type=TaskType.math)
    pot = sample_messages(task, Sample(index=0, path="pot", temperature=0, seed=0))
    assert pot[0]["role"] == "system" and "Python" in pot[0]["content"]
    assert pot[-1] == {"role": "user", "content": "What is 2+2?"}
    cot = sample_messages(task, Sample(index=0, path="cot", temperature=0, seed=0))
    assert "The answer is" in cot[0]["content"]


@pytest.mark.parametrize(("planned", "early", "wave"), [(1, True, 1), (3, True, 2), (5, True, 3),
                                                         (8, True, 3), (8, False, 8)])  # fmt: skip
def test_first_wave(planned: int, early: bool, wave: int) -> None:
    assert first_wave(planned, early, window=3) == wave


def test_decided_when_leader_cannot_be_overtaken() -> None:
    two_agree = [s(0, "42"), s(1, "42"), s(2, None, status="queued")]
    assert decided(two_agree, TaskType.math, window=3)
    split = [s(0, "42"), s(1, "17"), s(2, None, status="queued")]
    assert not decided(split, TaskType.math, window=3)
    # 3 unanimous of 8: the bound says no (3 > 0 + 5 is false), the ESC window says yes
    esc = [s(i, "9") for i in range(3)] + [s(i, None, status="queued") for i in range(3, 8)]
    assert decided(esc, TaskType.math, window=3)
    assert not decided(esc, TaskType.math, window=4)
    # equivalent answers count together
    assert decided([s(0, "12"), s(1, "12.0"), s(2, None, status="running")], TaskType.math, 3)


def test_confidence_breaks_an_even_split() -> None:
    samples = [s(0, "1", conf=0.2), s(1, "2", conf=0.9)]
    fusion = fuse(samples, TaskType.math, SETTINGS)
    assert fusion is not None
    assert fusion.result.answer == "2" and fusion.result.chosen_sample == 1
    assert fusion.result.agreement == 0.5
    assert fusion.result.votes == {"2": 1, "1": 1}


def test_majority_beats_confidence_and_ties_are_deterministic() -> None:
    fusion = fuse([s(0, "7", conf=0.4), s(1, "7", conf=0.4), s(2, "8", conf=0.8)],
                  TaskType.math, SETTINGS)  # fmt: skip
    assert fusion is not None and fusion.result.answer == "7"
    # score = (0.7 * share + 0.3 * confidence): 0.587 for "7" against 0.473 for "8"
    assert fusion.result.confidence == pytest.approx(0.7 * 2 / 3 + 0.3 * 0.4, abs=1e-3)
    assert fusion.result.votes == {"7": 2, "8": 1}
    assert 0 <= fusion.result.confidence <= 1
    tie = fuse([s(0, "3"), s(1, "4")], TaskType.math, SETTINGS)
    assert tie is not None and tie.result.answer == "3"


def test_failed_samples_do_not_vote() -> None:
    fusion = fuse([s(0, "5"), s(1, "6", status="error"), s(2, "6", status="timeout")],
                  TaskType.math, SETTINGS)  # fmt: skip
    assert fusion is not None and fusion.result.answer == "5"
    assert fuse([s(0, "5", status="error")], TaskType.math, SETTINGS) is None


def test_passing_code_candidates_win() -> None:
    samples = [
        s(0, "def f(): return 1", passed=0, failed=2),
        s(1, "def f(): return 1", passed=0, failed=2),
        s(2, "def f(): return 2", passed=2, failed=0),
    ]
    fusion = fuse(samples, TaskType.code, SETTINGS)
    assert fusion is not None and fusion.result.answer == "def f(): return 2"


def test_disagreement_asks_for_clarification() -> None:
    spread = [s(i, str(i)) for i in range(4)]
    fusion = fuse(spread, TaskType.math, SETTINGS, clarify=True)
    assert fusion is not None and len(fusion.contested) == 4
    agreed = fuse([s(0, "1"), s(1, "1"), s(2, "2")], TaskType.math, SETTINGS, clarify=True)
    assert agreed is not None and agreed.contested == []


def test_reasoning_is_the_chain_before_the_answer() -> None:
    fusion = fuse([s(0, "42")], TaskType.math, SETTINGS)
    assert fusion is not None and fusion.result.reasoning == "work..."


def test_temperature_falls_as_samples_grow() -> None:
    standard = SETTINGS.mode("standard")
    temps = [standard.temperature_for(n) for n in (1, 3, 5, 8)]
    assert temps[0] == temps[1] == 0.5
    assert temps[1] > temps[2] > temps[3] >= 0.3
