"""Strategies: one object per mode (plan, waves, stop rule, vote, anytime answers)."""

from __future__ import annotations

from typing import Any

import pytest

from ponder.config import load_settings
from ponder.enhance.calibration import Calibration, LogisticModel
from ponder.enhance.strategy import (
    Strategy,
    create_strategy,
    leader_probability,
)
from ponder.types import Mode, Sample, SampleStatus, Task, TaskType, Tokens

SETTINGS = load_settings(engine="scripted", redis_url=None)
#: a flat calibration: every answer 0.5 sure, results 0.9 (capped by the Laplace share)
FLAT = Calibration(
    sample=LogisticModel(0.0, {}), modes={"standard": LogisticModel(2.2, {})}, info={}
)


def task(mode: str = "standard", n: int = 5, **kw: Any) -> Task:
    base: dict[str, Any] = {
        "id": "1764412800123-a-1",
        "mode": mode,
        "samples_planned": n,
        "temperature": 0.5,
        "task_type": TaskType.math,
        "prompt": "2+2?",
    }
    return Task(**(base | kw))


def strategy(mode: str = "standard", n: int = 5, **kw: Any) -> Strategy:
    return create_strategy(task(mode, n, **kw), SETTINGS, calibration=FLAT)


def done(
    index: int,
    answer: str | None,
    *,
    temperature: float = 0.5,
    tokens: int = 10,
    confidence: float = 0.5,
    path: str = "cot",
) -> Sample:
    return Sample(
        index=index,
        path=path,
        temperature=temperature,
        seed=index,
        status=SampleStatus.done,
        text=f"work... The answer is {answer}." if answer is not None else "no idea",
        answer=answer,
        confidence=confidence,
        tokens=Tokens(completion=tokens),
    )


def queued(index: int) -> Sample:
    return Sample(index=index, temperature=0.5, seed=index)


def test_one_strategy_per_mode_from_one_factory() -> None:
    assert strategy("fast", 1).mode is Mode.fast and not strategy("fast", 1).anytime
    assert strategy("standard").mode is Mode.standard and strategy("standard").anytime
    assert strategy("deep").mode is Mode.deep and strategy("deep").anytime


def test_the_plan_starts_from_greedy() -> None:
    plan = strategy("standard", 4).plan()
    assert [s.temperature for s in plan] == [0.0, 0.5, 0.5, 0.5]
    assert [s.seed for s in plan] == [s.seed for s in strategy("standard", 4).plan()]
    assert len({s.seed for s in plan}) == 4
    assert [s.temperature for s in strategy("fast", 1).plan()] == [0.5]


def test_deep_promotes_its_first_sample() -> None:
    deep = strategy("deep", 3, priority=3)
    plan = deep.plan()
    assert [deep.priority(s) for s in plan] == [1, 3, 3]
    standard = strategy("standard", 3, priority=3)
    assert {standard.priority(s) for s in standard.plan()} == {3}


def test_deep_spreads_paths_and_pot_only_for_math() -> None:
    assert [s.path for s in strategy("deep", 5).plan()] == [
        "cot",
        "pot",
        "decompose",
        "cot",
        "pot",
    ]
    text = strategy("deep", 3, task_type=TaskType.text)
    assert [s.path for s in text.plan()] == ["cot", "cot", "decompose"]
    assert {s.path for s in strategy("standard", 3).plan()} == {"cot"}


def test_the_window_of_running_samples() -> None:
    assert strategy("standard", 8, early_stop=True).window(8) == 3
    assert strategy("standard", 3, early_stop=True).window(3) == 2
    assert strategy("standard", 8, early_stop=False).window(8) == 8
    assert strategy("fast", 1).window(1) == 1


def test_messages_carry_the_path_and_type_instruction() -> None:
    s = strategy("deep")
    pot = s.messages(Sample(index=0, path="pot", temperature=0, seed=0))
    assert pot[0]["role"] == "system" and "Python" in pot[0]["content"]
    # the program-of-thought instruction is repeated after the question
    assert pot[-1] == {"role": "user", "content": f"2+2?\n\n{pot[0]['content']}"}
    cot = s.messages(Sample(index=0, temperature=0, seed=0))
    assert "The answer is" in cot[0]["content"]
    assert cot[-1] == {"role": "user", "content": "2+2?"}
    chat = strategy(
        "deep",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3+3?"},
        ],
    ).messages(Sample(index=0, path="pot", temperature=0, seed=0))
    assert chat[0]["content"].endswith("\n\nBe brief.") and chat[1]["content"] == "2+2?"
    assert chat[-1]["content"].startswith("and 3+3?\n\nWrite a short Python program")
    choice = strategy(task_type=TaskType.choice, prompt="Pick: A) 1 B) 2")
    assert "letter" in choice.messages(Sample(index=0, temperature=0, seed=0))[0]["content"]


@pytest.mark.parametrize(
    ("counts", "probability"),
    [((3,), 15 / 16), ((2,), 7 / 8), ((1, 1), 0.5), ((4, 1), 57 / 64), ((), 0.0), ((0, 0), 0.0)],
)
def test_leader_probability_is_the_beta_rule(counts: tuple[int, ...], probability: float) -> None:
    assert leader_probability(counts) == pytest.approx(probability)


def test_the_stop_rule_uses_the_target_confidence() -> None:
    rest = [queued(i) for i in range(3, 8)]
    three = [done(0, "4", temperature=0), done(1, "4"), done(2, "4"), *rest]
    assert strategy(n=8, early_stop=True).stop(three).probability == pytest.approx(15 / 16)
    assert strategy(n=8, early_stop=True).stop(three).stop  # 0.9375 >= the default 0.8
    assert not strategy(n=8, early_stop=True, target_confidence=0.95).stop(three).stop
    assert strategy(n=8, early_stop=True, target_confidence=0.9).stop(three).stop
    assert not strategy(n=8, early_stop=False, target_confidence=0.5).stop(three).stop
    split = [done(0, "4", temperature=0), done(1, "5"), done(2, "4"), *rest]
    assert not strategy(n=8, early_stop=True, target_confidence=0.9).stop(split).stop


def test_the_stop_rule_stops_when_the_leader_cannot_be_overtaken() -> None:
    samples = [done(0, "4", temperature=0), done(1, "4"), done(2, "4"), queued(3)]
    check = strategy(n=4, early_stop=True, target_confidence=1.0).stop(samples)
    assert check.stop and check.probability == 1.0
    everything = [done(0, "4"), done(1, "5")]
    assert strategy(n=2, early_stop=False).stop(everything).stop  # nothing left to run


def test_the_greedy_sample_weighs_like_any_other() -> None:
    s = strategy(n=3)
    two_against = [done(0, "4", temperature=0), done(1, "5"), done(2, "5")]
    fusion = s.fuse(two_against)
    assert fusion is not None and fusion.result.answer == "5"
    assert fusion.result.votes == {"5": 2, "4": 1}
    surer = [done(0, "4", temperature=0, confidence=0.2), done(1, "5", confidence=0.3)]
    fusion = s.fuse(surer)
    assert fusion is not None and fusion.result.answer == "5"


CHOICE = "Calculate 71 + 31.\nA) 102\nB) 103\nC) -102\nD) 112\nAnswer with the letter."


def test_a_tie_of_votes_is_not_the_greedy_samples_to_break() -> None:
    """A multiple-choice vote tied 1/1/1 took the greedy sample's letter ("A" is what
    SmolLM2's greedy sample answers to every such question). Equal votes are ranked by
    the samples' confidences, equal confidences by mean logprob, then the first sample."""
    s = strategy(n=3, task_type=TaskType.choice, prompt=CHOICE)
    tied = [
        done(0, "A", temperature=0, confidence=0.2019),
        done(1, "C", confidence=0.2070),
        done(2, "D", confidence=0.2124),
    ]
    fusion = s.fuse(tied)
    assert fusion is not None and fusion.result.answer == "D"
    assert fusion.result.votes == {"D": 1, "C": 1, "A": 1}
    even = [done(i, "ACD"[i], temperature=0 if i == 0 else 0.5) for i in range(3)]
    for sample, logprob in zip(even, (-0.5, -0.3, -0.4), strict=True):
        sample.mean_logprob = logprob
    fusion = s.fuse(even)
    assert fusion is not None and fusion.result.answer == "C"
    for sample in even:
        sample.mean_logprob = None
    fusion = s.fuse(even)
    assert fusion is not None and fusion.result.answer == "A"  # nothing else tells them apart


def test_confidence_weighting_breaks_an_even_split() -> None:
    s = strategy(n=2)
    fusion = s.fuse([done(0, "1", confidence=0.1), done(1, "2", confidence=0.9)])
    assert fusion is not None and fusion.result.answer == "2" and fusion.result.agreement == 0.5


def test_samples_without_an_answer_do_not_vote() -> None:
    fusion = strategy(n=3).fuse([done(0, None), done(1, "7"), done(2, None)])
    assert fusion is not None and fusion.result.answer == "7"
    assert fusion.result.votes == {"7": 1}
    assert fusion.result.agreement == pytest.approx(1 / 3, abs=1e-4)


def test_a_null_answer_has_no_agreement_and_no_confidence() -> None:
    fusion = strategy(n=2).fuse([done(0, None), done(1, None)])
    assert fusion is not None and fusion.result.answer is None
    assert fusion.result.agreement == 0.0 and fusion.result.confidence == 0.0
    assert fusion.result.votes == {}


def test_one_sample_is_not_confident_by_construction() -> None:
    fusion = strategy("fast", 1).fuse([done(0, "4", confidence=0.99)])
    assert fusion is not None and fusion.result.confidence <= 2 / 3 + 1e-4
    unanimous = strategy(n=5).fuse([done(i, "4") for i in range(5)])
    assert unanimous is not None and fusion.result.confidence < unanimous.result.confidence


def test_failed_samples_do_not_vote() -> None:
    error = done(1, "6").model_copy(update={"status": SampleStatus.error})
    fusion = strategy(n=2).fuse([done(0, "5"), error])
    assert fusion is not None and fusion.result.answer == "5"
    assert strategy(n=1).fuse([error]) is None


def test_passing_code_candidates_win() -> None:
    s = strategy(n=3, task_type=TaskType.code)
    samples = [done(i, f"def f(): return {i // 2 + 1}") for i in range(3)]
    samples[0].tests_passed, samples[0].tests_failed = 0, 2
    samples[1].tests_passed, samples[1].tests_failed = 0, 2
    samples[2].tests_passed, samples[2].tests_failed = 2, 0
    fusion = s.fuse(samples)
    assert fusion is not None and fusion.result.answer == "def f(): return 2"


def test_the_result_says_what_the_stop_rule_saved() -> None:
    samples = [done(0, "4", tokens=30), done(1, "4", tokens=10)]
    samples += [queued(2).model_copy(update={"status": SampleStatus.skipped}) for _ in range(3)]
    assert strategy().saved(samples) == (3, 60)


def test_clarification_only_when_the_vote_is_split() -> None:
    deep = strategy("deep", 4)
    split = deep.fuse([done(0, "10"), done(1, "12"), done(2, "10"), done(3, "12")])
    assert split is not None and split.contested == ["10", "12"]
    clear = deep.fuse([done(0, "10"), done(1, "10"), done(2, "10"), done(3, "12")])
    assert clear is not None and clear.contested == []
    standard = strategy("standard", 4).fuse([done(i, str(i)) for i in range(4)])
    assert standard is not None and standard.contested == []


def test_the_clarification_is_a_question() -> None:
    deep = strategy("deep", 2)
    deep.task.samples = [done(0, "10"), done(1, "12")]
    asked = "Do you mean feet of rope per day or in total?"
    assert deep.clarification(["10", "12"], asked + "\nMore text.") == asked
    template = "Did you mean 10, or 12?"
    assert deep.clarification(["10", "12"], "The answer is 10.5.") == template
    assert deep.clarification(["10", "12"], "So, 17 * 18 = 25 feet. So,") == template
    assert deep.clarification(["10", "12"], "The answer is 10?") == template
    assert deep.clarification(["10", "12"], None) == template
    copied = "work... The answer is 10?"  # a sample's own text
    assert deep.clarification(["10", "12"], copied) == template
    assert deep.clarification(["10", "12"], "Which total do you mean, per day?") == (
        "Which total do you mean, per day?"
    )


@pytest.mark.parametrize(
    "reply",
    [
        'The user asked you to find the answer to the question "What is 17 * 24?',
        '"What is 17 * 24?',
        "What is 17 * 24? The answer is 408.",
        "17 * 24 is 408, isn't it?",
        "Is it 408 or 418?\nOr something else?",
        "",
        None,
    ],
)
def test_a_clarification_is_always_a_question(reply: str | None) -> None:
    """A deep task asked 'The user asked you to find the answer to the question "What is
    17 * 24?' — model text cut short, not a question. The template is used instead."""
    deep = strategy("deep", 2, prompt="What is 17 * 24?")
    deep.task.samples = [done(0, "408"), done(1, "418")]
    asked = deep.clarification(["408", "418"], reply)
    assert asked.endswith("?")
    assert not any(asked.rstrip("?") in (s.text or "") for s in deep.task.samples)
    if reply is None or not reply.startswith("Is it"):
        assert asked == "Did you mean 408, or 418?"
    assert deep.clarification(["a", "b", "c"], "") == "Did you mean a, b, or c?"
    messages = deep.clarification_messages(["10", "12"])
    assert "10; 12" in messages[-1]["content"] and "question mark" in messages[0]["content"]


def test_preliminary_answers_follow_the_leader_rate_limited() -> None:
    now = [0.0]
    s = Strategy(task(n=5), SETTINGS, calibration=FLAT, clock=lambda: now[0])
    first = s.preliminary([done(0, "4", temperature=0), queued(1)])
    assert first is not None and first.answer == "4"
    now[0] = 0.1
    assert s.preliminary([done(0, "4", temperature=0), done(1, "5"), done(2, "5")]) is None
    now[0] = 1.0
    changed = s.preliminary([done(0, "4", temperature=0), done(1, "5"), done(2, "5")])
    assert changed is not None and changed.answer == "5"
    now[0] = 2.0
    assert s.preliminary([done(0, "4", temperature=0), done(1, "5"), done(2, "5")]) is None
    fast = Strategy(task("fast", 1), SETTINGS, calibration=FLAT)
    assert fast.preliminary([done(0, "4")]) is None


def test_rejudge_reads_a_program_output() -> None:
    s = strategy("deep", 3)
    sample = done(0, None, path="pot").model_copy(update={"program_output": "debug\n42\n"})
    s.rejudge(sample)
    assert sample.answer == "42" and sample.confidence == 0.5
    silent = done(1, None, path="pot").model_copy(update={"program_output": ""})
    s.rejudge(silent)
    assert silent.answer is None and silent.confidence == 0.0


async def test_judge_runs_the_program_of_a_pot_sample() -> None:
    s = strategy("deep", 3)
    sample = done(0, None, path="pot")
    sample.text = "```python\nprint(6 * 7)\n```"
    await s.judge(sample)
    assert sample.program_output == "42\n" and sample.answer == "42"
    # a program that ends in a bare expression (Qwen's '65 + 71') has it printed
    bare = done(1, None, path="pot")
    bare.text = "```python\n65 + 71\n```"
    await s.judge(bare)
    assert bare.program_output == "136\n" and bare.answer == "136"


def test_unknown_mode_says_what_is_allowed() -> None:
    bad = task().model_copy(update={"mode": "turbo"})
    with pytest.raises(ValueError, match="Unknown mode: 'turbo'"):
        create_strategy(bad, SETTINGS)


def test_auto_is_resolved_from_the_prompt() -> None:
    assert strategy(task_type=TaskType.auto, prompt="What is 17 * 24?").task_type is TaskType.math
    choice = strategy(task_type=TaskType.auto, prompt="Which? A) Venus B) Mars")
    assert choice.task_type is TaskType.choice


def test_short_answers_vote_and_a_text_without_one_does_not() -> None:
    family = "Kai is married to Aria. They have a child called David.\nWhat is Kai to Aria?"
    s = strategy(n=4, task_type=TaskType.text, prompt=family)
    texts = [
        "Kai is the husband of Aria.",
        "The answer is husband.",
        "I am not sure.",
        "Aria is the wife of Kai.",
    ]
    samples = [done(i, None).model_copy(update={"text": t}) for i, t in enumerate(texts)]
    for sample in samples:
        s.rejudge(sample)
    assert [x.answer for x in samples] == ["husband", "husband", None, "wife"]
    fusion = s.fuse(samples)
    assert fusion is not None and fusion.result.answer == "husband"
    assert fusion.result.votes == {"husband": 2, "wife": 1}
    math = strategy(n=2, prompt="Calculate 9 + 2.")
    quiet = done(0, None).model_copy(update={"text": "To calculate 9 + 2, we add them."})
    math.rejudge(quiet)
    assert quiet.answer is None and quiet.confidence == 0.0


# --- auto mode: the cascade -----------------------------------------------------------------
def auto(n: int = 5, target: float = 0.7, **kw: Any) -> Strategy:
    return strategy("auto", n, target_confidence=target, temperature=0.4, **kw)


def test_auto_plans_deep_with_the_second_path_at_stage_two() -> None:
    plan = auto().plan()
    assert [s.path for s in plan] == ["cot", "pot", "decompose", "cot", "pot"]
    assert [s.temperature for s in plan] == [0.0, 0.4, 0.4, 0.4, 0.4]
    # a type without program of thought: decompose moves forward to stage 2
    choice = auto(task_type=TaskType.choice, prompt="Pick one: A) 1 B) 2")
    assert [s.path for s in choice.plan()] == ["cot", "decompose", "cot", "cot", "cot"]


def test_auto_runs_one_sample_at_a_time() -> None:
    s = auto()
    assert s.wave([queued(i) for i in range(5)]) == 1
    assert s.wave([done(0, "4", temperature=0), *[queued(i) for i in range(1, 5)]]) == 1
    two = [done(0, "4", temperature=0), done(1, "5"), *[queued(i) for i in range(2, 5)]]
    assert s.wave(two) == 1 and strategy("deep").wave(two) == 3


def test_auto_stage_one_ends_when_the_greedy_answer_is_confident() -> None:
    rest = [queued(i) for i in range(1, 5)]
    sure = auto(target=0.7).stop([done(0, "4", temperature=0, confidence=0.8), *rest])
    assert sure.stop and sure.reason == "confident" and sure.probability == 0.8
    unsure = auto(target=0.7).stop([done(0, "4", temperature=0, confidence=0.6), *rest])
    assert not unsure.stop
    # no answer: nothing to be sure of
    assert not auto(target=0.01).stop([done(0, None, temperature=0, confidence=0.0), *rest]).stop


def test_auto_stage_two_ends_when_both_paths_agree_and_are_sure_together() -> None:
    rest = [queued(i) for i in range(2, 5)]
    agree = [done(0, "4", temperature=0, confidence=0.5), done(1, "4", confidence=0.5), *rest]
    check = auto(target=0.7).stop(agree)
    assert check.stop and check.probability == pytest.approx(0.75)  # 1 - (1 - .5)(1 - .5)
    assert not auto(target=0.8).stop(agree).stop
    disagree = [done(0, "4", temperature=0, confidence=0.9), done(1, "5", confidence=0.9), *rest]
    assert not auto(target=0.1).stop(disagree).stop


def test_auto_stage_three_is_the_stop_rule_at_the_modes_vote_target() -> None:
    ran = [done(0, "4", temperature=0), done(1, "5"), done(2, "4")]
    # 2 of 3 for "4" with two samples left: P(leader stays) = 11/16 >= the vote target 0.5,
    # whatever the task's target (which ends stages 1 and 2)
    check = auto(target=0.99).stop([*ran, queued(3), queued(4)])
    assert check.stop and check.reason == "confident" and check.probability == 11 / 16
    stricter = SETTINGS.model_copy(deep=True)
    stricter.modes[Mode.auto] = stricter.modes[Mode.auto].model_copy(update={"vote_target": 0.7})
    s = create_strategy(task("auto", 5, target_confidence=0.99), stricter, calibration=FLAT)
    assert not s.stop([*ran, queued(3), queued(4)]).stop
    decided = s.stop([*ran, done(3, "4"), queued(4)])
    assert decided.stop and decided.reason == "decided"
    last = s.stop([*ran, done(3, "5"), done(4, "6")])
    assert last.stop and last.reason == "complete"


def test_auto_escalation_rows_run_below_the_task_priority() -> None:
    s = auto(priority=3)
    plan = s.plan()
    assert [s.priority(x) for x in plan] == [3, 4, 4, 4, 4]
    assert [auto(priority=5).priority(x) for x in plan] == [5, 5, 5, 5, 5]


def test_auto_results_say_the_stage_and_escalations() -> None:
    s = auto()
    one = s.fuse([done(0, "4", temperature=0), *[queued(i) for i in range(1, 5)]])
    assert one is not None and one.result.stage == 1 and one.result.escalations == []
    three = s.fuse([done(0, "4", temperature=0), done(1, "5"), done(2, "4"), queued(3), queued(4)])
    assert three is not None and three.result.stage == 3
    assert three.result.escalations == ["second_path", "deep_plan"]
    assert strategy("standard").fuse([done(0, "4")]).result.stage is None  # type: ignore[union-attr]


def test_auto_gives_a_preliminary_answer_after_each_stage() -> None:
    now = [100.0]
    s = create_strategy(task("auto", 5, target_confidence=0.99), SETTINGS, calibration=FLAT)
    s._clock = lambda: now[0]
    samples = [done(0, "4", temperature=0), *[queued(i) for i in range(1, 5)]]
    assert s.preliminary(samples) is not None
    samples[1] = done(1, "4")  # the same answer, at once: still a new stage
    second = s.preliminary(samples)
    assert second is not None and second.stage == 2
    assert s.preliminary(samples) is None  # nothing new


def test_a_budget_of_samples_ends_an_open_vote_as_budget() -> None:
    s = strategy("standard", 2, max_samples=2)
    check = s.stop([done(0, "4", temperature=0), done(1, "5")])
    assert check.stop and check.reason == "budget"
    assert strategy("standard", 2).stop([done(0, "4"), done(1, "5")]).reason == "complete"
    # the last sample settled the vote: it is the confidence that ended it
    settled = strategy("standard", 3, max_samples=3, target_confidence=0.9)
    assert settled.stop([done(0, "4"), done(1, "4"), done(2, "4")]).reason == "confident"
