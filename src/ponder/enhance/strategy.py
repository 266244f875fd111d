"""Strategies: how a task's samples are planned, prompted, judged and stopped early.

- ``fast``: one sample.
- ``standard``: N samples of one chain-of-thought prompt, a self-consistency vote.
- ``deep``: N samples spread over reasoning paths — chain-of-thought (``cot``), step-by-step
  decomposition (``decompose``) and program-of-thought (``pot``: the model writes Python,
  the sandbox runs it, its printed output is the answer) — reranked by agreement,
  confidence and agreement across paths; the first sample runs at a promoted priority and
  gives a preliminary answer.

Early stopping runs samples in two waves: the first wave is just large enough to decide
(a strict majority of N, or the ESC window if smaller); the rest run only if the first
wave left the vote open. The vote is decided when the leader cannot be overtaken by the
samples still to come, or when ``early_stop_window`` answers in a row are unanimous.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ponder.config import ModeConfig, Settings
from ponder.enhance.answers import (
    extract_answer,
    group_answers,
    infer_task_type,
    reasoning_signals,
)
from ponder.enhance.sandbox import extract_program_output, run_python_async, run_tests_async
from ponder.types import Result, Sample, SampleStatus, Task, TaskType

__all__ = [
    "Fusion",
    "clarification_messages",
    "decided",
    "first_wave",
    "fuse",
    "judge_sample",
    "plan_samples",
    "resolve_task_type",
    "sample_messages",
]

_ANSWER_LINE = "End with the sentence: The answer is <answer>."
_PATH_INSTRUCTIONS = {
    "cot": f"Think step by step. {_ANSWER_LINE}",
    "decompose": (
        "Break the problem into smaller sub-questions and answer each one in turn, "
        f"then combine them. {_ANSWER_LINE}"
    ),
    "pot": (
        "Write a short Python program that computes the answer and prints only the "
        "answer. Put the whole program in one ```python code block."
    ),
}
_TYPE_INSTRUCTIONS = {
    TaskType.choice: "Answer with the letter of the correct option. " + _ANSWER_LINE,
    TaskType.code: "Give the complete solution as one ```python code block.",
}
#: the share of the score given to agreement across reasoning paths (deep mode)
_PATH_WEIGHT = 0.1
#: below this margin between the two best groups, there is "no clear leader"
_CLEAR_MARGIN = 0.15


def sample_seed(task_id: str, index: int) -> int:
    """A stable seed per sample: a rerun after a crash draws the same sample."""
    digest = hashlib.sha256(f"{task_id}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def resolve_task_type(task: Task) -> TaskType:
    """The task's type, inferring ``auto`` from the prompt."""
    if task.task_type != TaskType.auto:
        return task.task_type
    prompt = task.prompt or "\n".join(str(m.get("content", "")) for m in task.messages or [])
    return infer_task_type(prompt)


def plan_samples(task: Task, mode: ModeConfig) -> list[Sample]:
    """The task's samples, spread round-robin over the mode's paths.

    Program-of-thought only suits math; other task types use chain-of-thought instead.
    """
    paths = [p if p != "pot" or task.task_type == TaskType.math else "cot" for p in mode.paths]
    return [
        Sample(
            index=i,
            path=paths[i % len(paths)],
            temperature=task.temperature,
            seed=sample_seed(task.id, i),
        )
        for i in range(task.samples_planned)
    ]


def first_wave(planned: int, early_stop: bool, window: int) -> int:
    """How many samples to start at once: all, unless early stopping can save some."""
    if not early_stop or planned <= 2:
        return planned
    return min(planned, planned // 2 + 1, window)


def sample_messages(task: Task, sample: Sample) -> list[dict[str, Any]]:
    """The chat messages of one sample: the path's instruction, then the user's input."""
    instruction = _TYPE_INSTRUCTIONS.get(task.task_type, _PATH_INSTRUCTIONS[sample.path])
    if sample.path == "pot":
        instruction = _PATH_INSTRUCTIONS["pot"]
    user = task.messages or [{"role": "user", "content": task.prompt or ""}]
    if user and user[0].get("role") == "system":
        first = {**user[0], "content": f"{instruction}\n\n{user[0].get('content', '')}"}
        return [first, *user[1:]]
    return [{"role": "system", "content": instruction}, *user]


async def judge_sample(sample: Sample, task: Task, settings: Settings) -> None:
    """Extract the sample's answer (running its program or the task's tests where there
    are any) and set its confidence."""
    text = sample.text or ""
    task_type = task.task_type
    if sample.path == "pot":
        program = extract_program_output(text)
        if program is not None:
            run = await run_python_async(
                program,
                timeout_s=settings.sandbox_timeout_s,
                memory_mb=settings.sandbox_memory_mb,
                isolation=settings.sandbox_isolation,
            )
            sample.program_output = run.stdout[-2000:]
            sample.isolation = run.isolation
            lines = [line for line in run.stdout.splitlines() if line.strip()]
            sample.answer = extract_answer(lines[-1], task_type) if lines else None
        else:
            sample.answer = extract_answer(text, task_type)
    else:
        sample.answer = extract_answer(text, task_type)
    if task_type == TaskType.code and task.tests and sample.answer is not None:
        report = await run_tests_async(
            sample.answer,
            task.tests,
            timeout_s=settings.sandbox_timeout_s * 2,
            memory_mb=settings.sandbox_memory_mb,
            isolation=settings.sandbox_isolation,
        )
        sample.isolation = report.isolation
        sample.tests_passed = report.passed
        sample.tests_failed = report.failed + (1 if report.timed_out else 0)
    sample.confidence = sample_confidence(sample, task_type)


def sample_confidence(sample: Sample, task_type: TaskType) -> float:
    """Mean token probability (from the engine) blended with the reasoning heuristics."""
    signals = reasoning_signals(sample.text or "", sample.answer, task_type)
    if sample.mean_logprob is None:
        return round(signals, 4)
    probability = math.exp(max(sample.mean_logprob, -50.0))
    return round(0.5 * probability + 0.5 * signals, 4)


def _voters(samples: Sequence[Sample]) -> list[Sample]:
    done = [s for s in samples if s.status == SampleStatus.done]
    with_answer = [s for s in done if s.answer is not None]
    return with_answer or done


def _answer_key(sample: Sample) -> str:
    return sample.answer if sample.answer is not None else (sample.text or "").strip()


def decided(samples: Sequence[Sample], task_type: TaskType, window: int) -> bool:
    """True when the vote cannot change any more: stop the remaining samples."""
    remaining = sum(s.status in (SampleStatus.queued, SampleStatus.running) for s in samples)
    if remaining == 0:
        return True
    voters = [s for s in samples if s.status == SampleStatus.done and s.answer is not None]
    if not voters:
        return False
    sizes = sorted(
        (len(g) for g in group_answers([s.answer for s in voters], task_type)), reverse=True
    )
    leader, runner_up = sizes[0], (sizes[1] if len(sizes) > 1 else 0)
    if leader > runner_up + remaining:
        return True
    return len(sizes) == 1 and leader >= window


@dataclass
class Fusion:
    result: Result
    #: the disagreeing answers, best first, when the vote has no clear leader
    contested: list[str]


def fuse(
    samples: Sequence[Sample],
    task_type: TaskType,
    settings: Settings,
    *,
    clarify: bool = False,
) -> Fusion | None:
    """The confidence-weighted vote over the finished samples; None when none finished.

    Each group of equivalent answers scores ``w_vote * share + w_conf * mean confidence``
    (plus, when several paths ran, a small bonus for agreement across paths), normalised
    to [0, 1]. With code tests, only the groups whose candidates pass the most tests
    compete. Ties go to the group whose first sample has the lowest index.
    """
    voters = _voters(samples)
    if not voters:
        return None
    groups = [
        [voters[i] for i in g] for g in group_answers([_answer_key(s) for s in voters], task_type)
    ]
    if task_type == TaskType.code and any(s.tests_passed is not None for s in voters):
        best = max(_pass_rate(g) for g in groups)
        groups = [g for g in groups if _pass_rate(g) == best]
    paths_total = len({s.path for s in voters})
    w_vote, w_conf = settings.vote_weight, settings.confidence_weight
    w_path = _PATH_WEIGHT if paths_total > 1 else 0.0
    total = (w_vote + w_conf + w_path) or 1.0

    def score(group: list[Sample]) -> float:
        share = len(group) / len(voters)
        confidence = sum(s.confidence or 0.0 for s in group) / len(group)
        paths = len({s.path for s in group}) / paths_total
        return (w_vote * share + w_conf * confidence + w_path * paths) / total

    ranked = sorted(groups, key=lambda g: (-score(g), min(s.index for s in g)))
    winner = ranked[0]
    chosen = max(winner, key=lambda s: (s.confidence or 0.0, -s.index))
    agreement = len(winner) / len(voters)
    votes: dict[str, int] = {}
    for group in ranked:
        votes[_display(group[0])] = votes.get(_display(group[0]), 0) + len(group)
    contested: list[str] = []
    if (
        clarify
        and len(ranked) > 1
        and agreement < settings.clarify_below
        and score(ranked[0]) - score(ranked[1]) < _CLEAR_MARGIN
    ):
        contested = [_display(g[0]) for g in ranked[:4]]
    result = Result(
        answer=chosen.answer,
        text=chosen.text or "",
        confidence=round(score(winner), 4),
        agreement=round(agreement, 4),
        votes=votes,
        chosen_sample=chosen.index,
        reasoning=_reasoning(chosen.text or ""),
    )
    return Fusion(result=result, contested=contested)


def _pass_rate(group: list[Sample]) -> float:
    rates = [
        (s.tests_passed or 0) / max(1, (s.tests_passed or 0) + (s.tests_failed or 0)) for s in group
    ]
    return max(rates)


def _display(sample: Sample) -> str:
    key = _answer_key(sample)
    return key if len(key) <= 200 else key[:197] + "..."


def _reasoning(text: str) -> str:
    """The chain of thought: the text before its final "the answer is" statement."""
    idx = text.lower().rfind("the answer is")
    return (text[:idx] if idx > 0 else text).strip()


def clarification_messages(task: Task, contested: Sequence[str]) -> list[dict[str, Any]]:
    """A request asking the model for one question that would settle the disagreement."""
    question = task.prompt or "\n".join(str(m.get("content", "")) for m in task.messages or [])
    options = "; ".join(contested)
    return [
        {
            "role": "system",
            "content": "You help resolve ambiguous questions. Reply with one short question.",
        },
        {
            "role": "user",
            "content": (
                f"Question: {question}\nDifferent careful readings gave these answers: "
                f"{options}.\nAsk the user one short question whose answer would tell "
                "which reading they meant."
            ),
        },
    ]
