"""The strategy: one object per task run that plans, prompts, judges, stops and fuses it.

:func:`create_strategy` returns the :class:`Strategy` of a task; the worker drives every
mode (``fast``, ``standard``, ``deep``) the same way. What differs between modes is the
mode's settings (:class:`ponder.config.ModeConfig`: samples, ``early_stop``, ``paths``,
``progressive``, ``clarify``, ``preliminary``: whether it gives anytime answers,
``cascade``: whether it escalates by stages);
what differs between task types is the task's answer type
(:class:`ponder.enhance.answers.AnswerType`: its paths and instructions, the sandbox runs
of :meth:`~ponder.enhance.answers.AnswerType.prepare` and
:meth:`~ponder.enhance.answers.AnswerType.check`, the groups that may win the vote).

1. :meth:`Strategy.plan` — the samples. Sample 0 of a multi-sample task is greedy
   (temperature 0), so the vote starts from the model's most likely answer (the
   anytime answer of the promoted first sample); the others run at the task's
   temperature, each with a seed derived from the task id and its index.
2. :meth:`Strategy.window` — how many samples run at once while the vote is open; when
   one ends and the vote is still open, the next starts (a slow sample does not hold
   back the others).
3. :meth:`Strategy.judge` — extract a finished sample's answer (the answer type runs its
   program or the task's tests where there are any) and set its calibrated confidence.
4. :meth:`Strategy.stop` — after each finished sample: stop when the estimated
   probability that the leading answer stays the leader reaches the target
   (Adaptive-Consistency's Beta criterion over the two largest groups; the request's
   ``target_confidence`` or the mode's default), or when the samples left cannot change
   the leader. The rest are skipped; :meth:`Strategy.saved` says what that saved.
5. :meth:`Strategy.preliminary` — the anytime answer while samples run (standard and
   deep): a new one each time the leading answer or its confidence changes (rate-limited).
6. :meth:`Strategy.fuse` — the vote: each sample weighs 1 (the greedy one too, see
   :data:`GREEDY_WEIGHT`), times ``exp(CONFIDENCE_POWER * confidence)`` (CISC: the
   calibrated sample confidence), so groups with as many votes are ranked by their
   samples' confidences; the heaviest group wins. Equal weights go to the larger summed
   confidence, then the higher mean logprob of the group's samples, then the group
   with the lowest sample index. ``result.confidence`` is the calibrated probability
   that the answer is right (:mod:`ponder.enhance.calibration`).
7. Auto mode, a cascade over deep's plan (:meth:`Strategy.wave`, :meth:`Strategy.stop`):
   stage 1 runs the greedy sample alone and ends the task when its calibrated
   confidence reaches the target; stage 2 runs one sample on a different reasoning path
   (program of thought for math, the type's next deep path otherwise) and ends the task
   when both answers agree and their fused confidence (``1 - (1 - c0)(1 - c1)``) reaches
   the target; stage 3 runs the rest of the deep plan under the stop rule at the mode's
   ``vote_target`` (0.5: it ends once a sample breaks the tie of stages 1 and 2). The
   samples run one at a time, each only while the answer is unsure, and each reuses
   every earlier one; the escalation rows run one priority level below the task's
   (:meth:`Strategy.priority`), so they do not hold back the first answers of newer
   tasks.
8. Deep mode: spreads samples over reasoning paths (chain-of-thought, decomposition,
   program-of-thought where the answer type allows it), promotes the first sample
   (:meth:`Strategy.priority`), and, when the vote is genuinely split, asks one
   clarifying question
   (:meth:`Strategy.clarification_messages` / :meth:`Strategy.clarification`).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ponder.config import NUM_PRIORITIES, ModeConfig, Settings
from ponder.enhance.answers import ANSWER_TYPES, AnswerType, group_answers, infer_task_type
from ponder.enhance.calibration import (
    Calibration,
    default_calibration,
    result_features,
    sample_features,
)
from ponder.types import Mode, ReasoningPath, Result, Sample, SampleStatus, Task, TaskType

__all__ = [
    "CONFIDENCE_POWER",
    "ESCALATIONS",
    "GREEDY_WEIGHT",
    "Fusion",
    "StopCheck",
    "StopReason",
    "Strategy",
    "create_strategy",
    "leader_probability",
    "register_structured",
    "resolve_task_type",
    "sample_seed",
]

#: the greedy sample's vote weight. 1: it does not break ties; a tie of votes is decided by
#: the samples' confidences (SmolLM2's greedy reply to a multiple-choice question is "A"
#: whatever the question, a position bias that an extra weight would turn into the answer
#: of every tie)
GREEDY_WEIGHT = 1.0
#: CISC: a sample's vote is multiplied by exp(CONFIDENCE_POWER * its confidence)
CONFIDENCE_POWER = 1.0
#: a new preliminary answer needs its confidence to move by this much (or a new leader)
PRELIMINARY_STEP = 0.05
#: and at least this long since the last one
PRELIMINARY_INTERVAL_S = 0.5
#: the longest clarifying question accepted from the model
MAX_QUESTION_CHARS = 240
#: auto mode: the escalation that starts stage 2, and the one that starts stage 3
ESCALATIONS = ("second_path", "deep_plan")

#: how a question opens: a question word or an auxiliary verb
_ASKS = re.compile(
    r"(?:what|which|who|whom|whose|when|where|why|how|do|does|did|is|are|was|were|am|can|"
    r"could|should|would|will|shall|may|might|must|have|has|had)\b",
    re.IGNORECASE,
)


_S = TypeVar("_S", bound="Strategy")

StopReason = Literal["confident", "decided", "budget", "complete", "deadline"]


def sample_seed(task_id: str, index: int) -> int:
    """A stable seed per sample: a rerun after a crash draws the same sample."""
    digest = hashlib.sha256(f"{task_id}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def task_prompt(task: Task) -> str:
    return task.prompt or "\n".join(str(m.get("content", "")) for m in task.messages or [])


def resolve_task_type(task: Task) -> TaskType:
    """The task's type, inferring ``auto`` from the prompt."""
    if task.task_type != TaskType.auto:
        return task.task_type
    return infer_task_type(task_prompt(task))


def leader_probability(counts: Sequence[int]) -> float:
    """P(the largest group's share exceeds the second's), Adaptive-Consistency's Beta rule.

    With ``a`` and ``b`` votes for the two largest groups and a uniform prior, the
    leader's share of their votes is Beta(a + 1, b + 1) and P(share > 1/2) =
    P(Binomial(a + b + 1, 1/2) <= a), exact for whole votes. Empty or all-zero counts
    give 0.
    """
    top = sorted((c for c in counts if c > 0), reverse=True)
    if not top:
        return 0.0
    a, b = top[0], top[1] if len(top) > 1 else 0
    n = a + b + 1
    return sum(math.comb(n, j) for j in range(a + 1)) / float(1 << n)


@dataclass(frozen=True)
class StopCheck:
    stop: bool
    #: the estimated probability that the leader stays the leader (auto mode's first
    #: stages: the stage's calibrated confidence)
    probability: float
    #: why sampling stops (``Result.stop_reason``); None while it goes on
    reason: StopReason | None = None


@dataclass
class Fusion:
    result: Result
    #: the competing answers, best first, when the vote is genuinely split (deep mode)
    contested: list[str]
    #: what the result's confidence was computed from (see ponder.enhance.calibration)
    features: dict[str, float] = field(default_factory=dict)


@dataclass
class _Group:
    samples: list[Sample]
    weight: float

    @property
    def first(self) -> int:
        return min(s.index for s in self.samples)


def _done(samples: Sequence[Sample]) -> list[Sample]:
    return [s for s in samples if s.status == SampleStatus.done]


def _ended(samples: Sequence[Sample]) -> int:
    """Samples that ran to an end (done, failed, timed out; not skipped or cancelled)."""
    return sum(
        s.status in (SampleStatus.done, SampleStatus.error, SampleStatus.timeout) for s in samples
    )


def _display(answer: str) -> str:
    return answer if len(answer) <= 200 else answer[:197] + "..."


def _reasoning(text: str) -> str:
    """The chain of thought: the text before its final "the answer is" statement."""
    idx = text.lower().rfind("the answer is")
    return (text[:idx] if idx > 0 else text).strip()


class Strategy:
    """How one task is run; one instance per task run (it keeps the preliminary state).

    The task's mode decides through its :class:`~ponder.config.ModeConfig`, the task's
    type through its answer type (:attr:`answers`).
    """

    def __init__(
        self,
        task: Task,
        settings: Settings,
        *,
        calibration: Calibration | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task = task
        self.settings = settings
        self.mode = Mode(task.mode)
        self.config: ModeConfig = settings.mode(task.mode)
        #: a preliminary answer while samples run
        self.anytime = self.config.preliminary
        #: auto mode's cascade (module docstring, step 7)
        self.cascade = self.config.cascade
        self.calibration = calibration or default_calibration(settings.model)
        self.task_type = resolve_task_type(task)
        self.answers: AnswerType = ANSWER_TYPES[self.task_type]
        self.question = self.answers.question(task_prompt(task))
        self.greedy_weight = GREEDY_WEIGHT
        self.confidence_power = CONFIDENCE_POWER
        self._clock = clock
        self._last_preliminary: tuple[str | None, float, float] | None = None
        #: auto mode: the last stage a preliminary answer was given for
        self._preliminary_stage = 0

    # --- planning -----------------------------------------------------------------------
    @property
    def early_stop(self) -> bool:
        return self.config.early_stop if self.task.early_stop is None else self.task.early_stop

    @property
    def target_confidence(self) -> float:
        target = self.task.target_confidence
        return target if target is not None else self.config.target_confidence

    @property
    def vote_target(self) -> float:
        """The stop rule's target: ``target_confidence``; auto mode's stage 3: the mode's
        ``vote_target`` where it has one."""
        if self.cascade and self.config.vote_target is not None:
            return self.config.vote_target
        return self.target_confidence

    def plan(self) -> list[Sample]:
        """The task's samples (sample 0 greedy when there are several)."""
        task = self.task
        paths = self.sample_paths(task.samples_planned)
        return [
            Sample(
                index=i,
                path=paths[i],
                temperature=0.0 if i == 0 and task.samples_planned > 1 else task.temperature,
                seed=sample_seed(task.id, i),
            )
            for i in range(task.samples_planned)
        ]

    def sample_paths(self, planned: int) -> list[ReasoningPath]:
        """The path of each planned sample: the mode's ``paths`` in turn, a path the answer
        type does not allow run as cot. Auto mode's second sample (stage 2) takes the
        first other path the type allows, moved forward from its place in deep's order."""
        cycle = [p if p in self.answers.paths else ReasoningPath.cot for p in self.config.paths]
        paths = [cycle[i % len(cycle)] for i in range(planned)]
        if self.cascade and planned > 2:
            other = next((i for i, p in enumerate(paths) if i > 0 and p != paths[0]), None)
            if other is not None:
                paths.insert(1, paths.pop(other))
        return paths

    def window(self, planned: int) -> int:
        """How many samples run at once while the vote is open: all of them without early
        stopping; with it, a strict majority of the planned ones, at most
        ``early_stop_window``. When one ends and the vote is still open, the next starts."""
        if not self.early_stop or planned <= 2:
            return planned
        return min(planned, planned // 2 + 1, self.settings.early_stop_window)

    def wave(self, samples: Sequence[Sample]) -> int:
        """How many samples run at once now: :meth:`window`; in auto mode one at a time
        (each further sample only while the answer is unsure)."""
        return 1 if self.cascade else self.window(len(samples))

    def stage(self, samples: Sequence[Sample]) -> int:
        """Auto mode: the stage the samples that ran belong to (1, 2 or 3)."""
        return min(3, max(1, _ended(samples)))

    def priority(self, sample: Sample) -> int:
        """The engine priority of a sample (0 is the most urgent): the first sample of a
        ``progressive`` mode (deep, by default) is promoted for an early answer; auto
        mode's escalation rows (stages 2 and 3) run one level below the task's."""
        if sample.index == 0 and self.config.progressive:
            return max(0, self.task.priority - self.settings.promote_first_by)
        if self.cascade and sample.index > 0:
            return min(NUM_PRIORITIES - 1, self.task.priority + 1)
        return self.task.priority

    def messages(self, sample: Sample) -> list[dict[str, Any]]:
        """The chat messages of one sample: its instruction, then the user's input (its
        last message followed by the path's reminder, if the answer type has one)."""
        instruction = self.answers.instruction_for(sample.path)
        task = self.task
        user = task.messages or [{"role": "user", "content": task.prompt or ""}]
        reminder = self.answers.reminder_for(sample.path)
        last = user[-1] if user else {}
        if reminder and last.get("role") == "user" and isinstance(last.get("content"), str):
            user = [*user[:-1], {**last, "content": f"{last['content']}\n\n{reminder}"}]
        if user and user[0].get("role") == "system":
            first = {**user[0], "content": f"{instruction}\n\n{user[0].get('content', '')}"}
            return [first, *user[1:]]
        return [{"role": "system", "content": instruction}, *user]

    # --- judging ------------------------------------------------------------------------
    async def judge(self, sample: Sample) -> None:
        """Extract the sample's answer (the answer type runs its program or the task's
        tests where there are any) and set its calibrated confidence."""
        await self.answers.prepare(sample, self.task, self.settings)
        self._extract(sample)
        await self.answers.check(sample, self.task, self.settings)
        sample.confidence = self.sample_confidence(sample)  # once: after the check

    def rejudge(self, sample: Sample) -> None:
        """Set the answer and confidence from the sample's text (the answer type's
        :meth:`~ponder.enhance.answers.AnswerType.answer_text`: a math program-of-thought
        sample's is the last line its program printed). The quality benchmark calls this
        on recorded samples."""
        self._extract(sample)
        sample.confidence = self.sample_confidence(sample)

    def _extract(self, sample: Sample) -> None:
        text = self.answers.answer_text(sample)
        sample.answer = self.answers.extract(text, self.question) if text.strip() else None

    def sample_confidence(self, sample: Sample) -> float:
        """P(this sample's answer is right); 0 without an answer."""
        if sample.answer is None:
            return 0.0
        return round(self.calibration.sample_confidence(self.sample_features(sample)), 4)

    def sample_features(self, sample: Sample) -> dict[str, float]:
        """What the sample's confidence is computed from (:mod:`ponder.enhance.calibration`)."""
        signals = self.answers.signals(sample.text or "", sample.answer)
        return sample_features(sample, signals, self.task_type.value, task_prompt(self.task))

    # --- the vote -----------------------------------------------------------------------
    def _weight(self, sample: Sample) -> float:
        greedy = sample.temperature == 0 and self.task.samples_planned > 1
        base = self.greedy_weight if greedy else 1.0
        return base * math.exp(self.confidence_power * (sample.confidence or 0.0))

    def _groups(self, voters: Sequence[Sample]) -> list[_Group]:
        parts = group_answers([s.answer for s in voters], self.task_type)
        contenders = self.answers.contenders([[voters[i] for i in g] for g in parts])
        groups = [_Group(g, sum(self._weight(s) for s in g)) for g in contenders]
        return sorted(groups, key=_rank)

    def fuse(self, samples: Sequence[Sample]) -> Fusion | None:
        """The vote over the finished samples; None when none finished.

        Samples that state no answer do not vote; when no sample states one, the result
        has answer None, agreement 0 and confidence 0.
        """
        done = _done(samples)
        if not done:
            return None
        voters = [s for s in done if s.answer is not None]
        if not voters:
            first = min(done, key=lambda s: s.index)
            return Fusion(
                Result(answer=None, text=first.text or "", confidence=0.0, agreement=0.0,
                       votes={}, chosen_sample=first.index, reasoning=_reasoning(first.text or "")),
                [],
            )  # fmt: skip
        ranked = self._groups(voters)
        winner = ranked[0]
        chosen = max(winner.samples, key=lambda s: (s.confidence or 0.0, -s.index))
        runner_up = len(ranked[1].samples) if len(ranked) > 1 else 0
        votes = len(winner.samples)
        greedy = [s for s in done if s.temperature == 0]
        features = result_features(
            votes=votes,
            runner_up=runner_up,
            finished=len(done),
            greedy_agrees=any(s in winner.samples for s in greedy),
            logprobs=[s.mean_logprob for s in winner.samples],
            signals=[self.answers.signals(s.text or "", s.answer) for s in winner.samples],
            confidences=[s.confidence or 0.0 for s in winner.samples],
        )
        confidence = self.calibration.result_confidence(self.mode.value, features, votes, len(done))
        tally: dict[str, int] = {}
        for group in ranked:
            label = _display(group.samples[0].answer or "")
            tally[label] = tally.get(label, 0) + len(group.samples)
        result = Result(
            answer=chosen.answer,
            text=chosen.text or "",
            confidence=round(confidence, 4),
            agreement=round(votes / len(done), 4),
            votes=tally,
            chosen_sample=chosen.index,
            reasoning=_reasoning(chosen.text or ""),
        )
        if self.cascade:
            result.stage = self.stage(samples)
            result.escalations = list(ESCALATIONS[: result.stage - 1])
        contested = self._contested(ranked) if self.config.clarify else []
        return Fusion(result=result, contested=contested, features=features)

    def _contested(self, ranked: Sequence[_Group]) -> list[str]:
        """The competing answers when the vote is genuinely split: the winner has at most
        ``clarify_below`` of the votes and is not a likely leader (Beta rule < 0.8)."""
        sizes = [len(g.samples) for g in ranked]
        if (
            len(sizes) < 2
            or sizes[0] / sum(sizes) > self.settings.clarify_below
            or leader_probability(sizes) >= 0.8
        ):
            return []
        return [_display(g.samples[0].answer or "") for g in ranked[:4]]

    # --- stopping -----------------------------------------------------------------------
    def stop(self, samples: Sequence[Sample]) -> StopCheck:
        """After a finished sample: whether the rest of the samples can be skipped."""
        remaining = sum(s.status in (SampleStatus.queued, SampleStatus.running) for s in samples)
        voters = [s for s in _done(samples) if s.answer is not None]
        if self.cascade and _ended(samples) < 3:
            check = self._stage_check(samples, voters)
            if check.stop or remaining:
                return check
            return StopCheck(True, check.probability, self._ran_out(samples))
        if not voters:
            return StopCheck(remaining == 0, 0.0, self._ran_out(samples) if not remaining else None)
        sizes = sorted(
            (len(g) for g in group_answers([s.answer for s in voters], self.task_type)),
            reverse=True,
        )
        probability = leader_probability(sizes)
        if remaining == 0:
            settled = self.early_stop and probability >= self.vote_target
            return StopCheck(True, probability, "confident" if settled else self._ran_out(samples))
        if not self.early_stop:
            return StopCheck(False, probability)
        runner_up = sizes[1] if len(sizes) > 1 else 0
        if sizes[0] > runner_up + remaining:
            return StopCheck(True, 1.0, "decided")
        if probability >= self.vote_target:
            return StopCheck(True, probability, "confident")
        return StopCheck(False, probability)

    def _stage_check(self, samples: Sequence[Sample], voters: Sequence[Sample]) -> StopCheck:
        """Auto mode after stage 1 or 2: stop when the stage's confidence reaches the target
        (stage 1: the greedy sample's; stage 2: both answers agree, fused)."""
        if not self.early_stop:
            return StopCheck(False, 0.0)
        if _ended(samples) == 1:
            confidence = (voters[0].confidence or 0.0) if voters else 0.0
        elif (
            len(voters) == 2 and len(group_answers([s.answer for s in voters], self.task_type)) == 1
        ):
            confidence = 1.0 - math.prod(1.0 - (s.confidence or 0.0) for s in voters)
        else:
            confidence = 0.0
        stop = confidence >= self.target_confidence
        return StopCheck(stop, confidence, "confident" if stop else None)

    def _ran_out(self, samples: Sequence[Sample]) -> StopReason:
        """Why sampling ended when no sample is left and the vote is not settled: the
        budget when ``max_samples`` allowed no more, else every planned sample ran."""
        cap = self.task.max_samples
        return "budget" if cap is not None and len(samples) >= cap else "complete"

    def saved(self, samples: Sequence[Sample]) -> tuple[int, int]:
        """(samples, tokens) the stop rule saved: skipped samples, times the mean
        completion tokens of the finished ones."""
        skipped = sum(s.status == SampleStatus.skipped for s in samples)
        done = _done(samples)
        mean_tokens = sum(s.tokens.completion for s in done) / len(done) if done else 0.0
        return skipped, round(skipped * mean_tokens)

    # --- anytime answers ----------------------------------------------------------------
    def preliminary(self, samples: Sequence[Sample]) -> Result | None:
        """A new preliminary answer when the leader or its confidence changed (at most one
        per :data:`PRELIMINARY_INTERVAL_S`); in auto mode also after each stage that
        ended. None otherwise."""
        if not self.anytime:
            return None
        now = self._clock()
        stage_ended = self.cascade and self.stage(samples) != self._preliminary_stage
        last = self._last_preliminary
        if not stage_ended and last is not None and now - last[2] < PRELIMINARY_INTERVAL_S:
            return None
        fusion = self.fuse(samples)
        if fusion is None:
            return None
        result = fusion.result
        if (
            not stage_ended
            and last is not None
            and last[0] == result.answer
            and abs(last[1] - result.confidence) < PRELIMINARY_STEP
        ):
            return None
        self._last_preliminary = (result.answer, result.confidence, now)
        if self.cascade:
            self._preliminary_stage = self.stage(samples)
        return result

    # --- clarification ------------------------------------------------------------------
    def clarification_messages(self, contested: Sequence[str]) -> list[dict[str, Any]]:
        """A request asking the model for one question that would settle the split."""
        options = "; ".join(contested)
        return [
            {
                "role": "system",
                "content": "You help resolve ambiguous questions. Reply with one short "
                "question to the user, ending with a question mark. Do not answer it.",
            },
            {
                "role": "user",
                "content": (
                    f"Question: {task_prompt(self.task)}\nDifferent careful readings gave "
                    f"these answers: {options}.\nAsk the user one short question whose "
                    "answer would tell which reading they meant."
                ),
            },
        ]

    def clarification(self, contested: Sequence[str], reply: str | None) -> str:
        """The model's question if it is one, else a template built from the answers.

        The model's reply is accepted when its first line is one question: it opens with a
        question word or an auxiliary verb ("Do you mean …?", "Which …?"), ends in its
        only "?", is at most :data:`MAX_QUESTION_CHARS` long, closes every quote it opens,
        states no answer ("the answer is") and copies neither the prompt nor a sample's
        text. Otherwise (model text such as 'The user asked you to find the answer to the
        question "What is 17 * 24?') it is "Did you mean A, or B?" over the answers.
        """
        question = (reply or "").strip().split("\n", 1)[0].strip().strip("*\"' ")
        texts = [task_prompt(self.task), *(s.text for s in self.task.samples if s.text)]
        if (
            _ASKS.match(question)
            and question.endswith("?")
            and 8 <= len(question) <= MAX_QUESTION_CHARS
            and question.count("?") == 1
            and question.count('"') % 2 == 0
            and question.count("\u201c") == question.count("\u201d")
            and not re.search(r"\banswer\s+(?:is|:)", question, re.IGNORECASE)
            and not any(question.rstrip("?").strip() in t for t in texts)
        ):
            return question
        answers = [a if len(a) <= 60 else a[:57] + "..." for a in contested[:3]]
        if len(answers) == 1:
            return f"Did you mean {answers[0]}?"
        return f"Did you mean {', '.join(answers[:-1])}, or {answers[-1]}?"


def _rank(group: _Group) -> tuple[float, float, float, int]:
    """The vote's order: weight, then summed confidence, then mean logprob, then the
    earliest sample (rounded, so that float noise does not decide a tie)."""
    logprobs = [s.mean_logprob for s in group.samples if s.mean_logprob is not None]
    mean_logprob = sum(logprobs) / len(logprobs) if logprobs else -math.inf
    confidence = sum(s.confidence or 0.0 for s in group.samples)
    return (-round(group.weight, 9), -round(confidence, 9), -mean_logprob, group.first)


#: the strategy of structured tasks (registered by ponder.enhance.structured_strategy)
_STRUCTURED: list[type[Strategy]] = []


def register_structured(cls: type[_S]) -> type[_S]:
    """Class decorator: the strategy of structured tasks (the package imports its module:
    this one cannot, a cycle)."""
    _STRUCTURED[:] = [cls]
    return cls


def create_strategy(
    task: Task, settings: Settings, *, calibration: Calibration | None = None
) -> Strategy:
    """The strategy of the task (a structured task's: the registered one); ValueError for
    a mode that does not exist."""
    try:
        Mode(task.mode)
    except ValueError:
        raise ValueError(
            f"Unknown mode: {task.mode!r}; expected one of {', '.join(Mode)}"
        ) from None
    if task.response_format is not None:
        return _STRUCTURED[0](task, settings, calibration=calibration)
    return Strategy(task, settings, calibration=calibration)
