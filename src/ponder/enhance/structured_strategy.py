"""The strategy of a structured task (``Task.response_format``): every sample answers with
one JSON object, the vote is field by field (:mod:`ponder.enhance.structured`).

What differs from :class:`~ponder.enhance.strategy.Strategy`:

- the prompt: the system instruction asks for one JSON object valid for the schema (the
  schema included), and every sample is a chain-of-thought one (a program, or a
  decomposition in prose, does not fit a JSON reply); no program or test runs;
- judging: a sample's ``object`` is its parsed, validated object (else None and
  ``schema_error`` says why), its ``answer`` the object's canonical JSON; its
  confidence is that of its least confident required field (below), 0 when invalid;
- the vote (:meth:`StructuredStrategy.fuse`): the object voted leaf by leaf, each
  field with its votes, agreement and calibrated confidence; the result's confidence and
  agreement are those of its least confident required field, its ``votes`` are over
  whole objects;
- stopping: when every required field is decided (the Beta rule over that field's
  groups reaches the target, or the samples left cannot change its winner); auto mode's
  stages look at the least confident required field.

A field's confidence uses the fitted calibration as it stands (it has no structured fit
yet): each sample is scored as if it had answered that field alone (its log-probability,
length, truncation and repetition, with the field's value as the answer and the answer
type of the field's kind: a number as a math answer, a string as a text answer, an enum
or boolean as a choice), and the mode's result model turns the winners' scores and the
field's vote (share, margin, finished samples, greedy agreement) into the probability
that the field is right, as :meth:`Strategy.fuse` does for a whole answer.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ponder.config import Settings
from ponder.enhance.answers import AnswerType, Question
from ponder.enhance.calibration import Calibration, result_features, sample_features
from ponder.enhance.strategy import (
    ESCALATIONS,
    Fusion,
    StopCheck,
    Strategy,
    leader_probability,
    register_structured,
    task_prompt,
)
from ponder.enhance.structured import (
    FieldwiseVote,
    Leaf,
    LeafKind,
    canonical_json,
    display,
    object_key,
    parse_sample,
    vote_fields,
)
from ponder.types import ReasoningPath, Result, Sample, SampleStatus, Task

__all__ = ["JsonAnswers", "StructuredStrategy", "json_instruction"]

#: the answer type whose calibration a field's kind borrows (see the module docstring)
_KIND_TYPES: Mapping[LeafKind, str] = {
    "number": "math",
    "string": "text",
    "whole": "text",
    "members": "text",
    "exact": "choice",
    "presence": "choice",
}


#: a top-level property by one of these names is where the model should reason
_WORKING = frozenset({"reasoning", "working", "explanation", "steps", "thinking", "rationale"})


def json_instruction(schema: Mapping[str, Any], named: bool) -> str:
    """The system instruction of a structured task's samples."""
    if not named:
        return "Answer with one JSON object and nothing else: no prose, no code fence."
    working = ""
    if any(name in _WORKING for name in schema.get("properties", {})):
        working = (
            " In that field, work the problem out step by step: write out every calculation "
            "with its result, then give the answer fields from that working."
        )
    return (
        "Answer with one JSON object that is valid for this JSON Schema, and nothing else: "
        "no prose, no code fence. Where the schema has a field for reasoning or working, "
        f"fill it in before the answer fields.{working}\nJSON Schema: "
        + json.dumps(schema, ensure_ascii=False)
    )


class JsonAnswers(AnswerType):
    """A structured task's answer type: one JSON object valid for the schema, compared
    leaf by leaf; the only path is ``cot``, nothing runs before or after extraction."""

    paths = frozenset({ReasoningPath.cot})

    def __init__(self, schema: Mapping[str, Any], named: bool) -> None:
        self.schema = schema
        self._instruction = json_instruction(schema, named)

    def instruction_for(self, path: ReasoningPath) -> str:
        return self._instruction

    def extract(self, text: str, question: Question) -> str | None:
        found, _ = parse_sample(text, self.schema)
        return canonical_json(found) if found is not None else None

    def key(self, answer: str) -> str:
        return object_key(json.loads(answer), self.schema)

    def signals(self, text: str, answer: str | None) -> float:
        return 0.0 if answer is None else 1.0


def _done(samples: Sequence[Sample]) -> list[Sample]:
    return [s for s in samples if s.status == SampleStatus.done]


def _ended(samples: Sequence[Sample]) -> int:
    ended = (SampleStatus.done, SampleStatus.error, SampleStatus.timeout)
    return sum(s.status in ended for s in samples)


def _probability(leaf: Leaf, remaining: int) -> float:
    """P(the leaf's winner stays ahead): 1 when the samples left cannot change it, else
    the Beta rule over the winner's votes and the largest other group's."""
    votes = len(leaf.winners)
    if remaining and votes > leaf.runner_up + remaining:
        return 1.0
    return leader_probability([votes, leaf.runner_up]) if votes >= leaf.runner_up else 0.0


@register_structured
class StructuredStrategy(Strategy):
    """A structured task's strategy (see the module docstring)."""

    def __init__(
        self,
        task: Task,
        settings: Settings,
        *,
        calibration: Calibration | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(task, settings, calibration=calibration, clock=clock)
        fmt = task.response_format
        if fmt is None:
            raise ValueError("a structured strategy needs a task with a response_format")
        self.schema: Mapping[str, Any] = fmt.answer_schema()
        self.answers = JsonAnswers(self.schema, named=fmt.json_schema is not None)

    # --- judging ------------------------------------------------------------------------
    def _extract(self, sample: Sample) -> None:
        sample.object, sample.schema_error = parse_sample(
            self.answers.answer_text(sample), self.schema
        )
        sample.answer = canonical_json(sample.object) if sample.object is not None else None

    def sample_confidence(self, sample: Sample) -> float:
        """Its least confident required field's (each scored as in the module docstring);
        0 without a valid object."""
        if sample.object is None:
            return 0.0
        leaves = vote_fields([sample.object], self.schema).deciding()
        if not leaves:
            return super().sample_confidence(sample)
        return round(min(self.leaf_sample_confidence(sample, leaf) for leaf in leaves), 4)

    def leaf_sample_confidence(self, sample: Sample, leaf: Leaf) -> float:
        """P(the sample's answer to this field is right), from the sample's features with
        the field's value as its answer (module docstring)."""
        answer = leaf.value if isinstance(leaf.value, str) else leaf.label
        scored = sample.model_copy(update={"answer": answer})
        features = sample_features(scored, 1.0, _KIND_TYPES[leaf.kind], task_prompt(self.task))
        return self.calibration.sample_confidence(features)

    # --- the vote -----------------------------------------------------------------------
    def field_features(
        self, leaf: Leaf, voters: Sequence[Sample], finished: int
    ) -> dict[str, float]:
        """What a field's confidence is computed from: the field's vote and its winners'
        per-field sample confidences (:func:`result_features`), and its kind."""
        winners = [voters[i] for i in leaf.winners]
        features = result_features(
            votes=len(winners),
            runner_up=leaf.runner_up,
            finished=finished,
            greedy_agrees=any(s.temperature == 0 for s in winners),
            logprobs=[s.mean_logprob for s in winners],
            signals=[1.0] * len(winners),
            confidences=[self.leaf_sample_confidence(s, leaf) for s in winners],
        )
        return {**features, f"kind_{leaf.kind}": 1.0}

    def field_confidence(self, leaf: Leaf, voters: Sequence[Sample], finished: int) -> float:
        """P(the field's voted value is right): the fields' model fitted on the structured
        benchmark where the calibration has one, else the mode's result model."""
        features = self.field_features(leaf, voters, finished)
        return self.calibration.field_confidence(
            self.mode.value, features, len(leaf.winners), finished
        )

    def vote(self, voters: Sequence[Sample], finished: int | None = None) -> FieldwiseVote:
        """The field-wise vote over valid samples; with ``finished`` (the finished
        samples, valid or not) each field's calibrated confidence, else its Laplace share."""
        rate = None
        if finished is not None:
            rate = lambda leaf: self.field_confidence(leaf, voters, finished)  # noqa: E731
        objects = [s.object or {} for s in voters]
        return vote_fields(objects, self.schema, [self._weight(s) for s in voters], confidence=rate)

    def fuse(self, samples: Sequence[Sample]) -> Fusion | None:
        """The field-wise vote over the valid samples; None when none finished. Without a
        valid sample the result has answer None, agreement 0 and confidence 0."""
        done = _done(samples)
        if not done:
            return None
        voters = [s for s in done if s.object is not None]
        if not voters:
            first = min(done, key=lambda s: s.index)
            return Fusion(
                Result(
                    answer=None,
                    text=first.text or "",
                    confidence=0.0,
                    agreement=0.0,
                    votes={},
                    chosen_sample=first.index,
                    fields={},
                ),
                [],
            )
        vote = self.vote(voters, len(done))
        weakest, confidence = self._weakest(vote, voters, len(done))
        answer = canonical_json(vote.object)
        result = Result(
            answer=answer,
            text=answer,
            confidence=confidence,
            agreement=round(weakest.agreement, 4),
            votes=self._whole_votes(voters),
            chosen_sample=self._chosen(vote, voters).index,
            object=vote.object,
            fields=vote.fields,
            object_from=vote.object_from,
        )
        if self.cascade:
            result.stage = self.stage(samples)
            result.escalations = list(ESCALATIONS[: result.stage - 1])
        return Fusion(result=result, contested=[])

    def _weakest(
        self, vote: FieldwiseVote, voters: Sequence[Sample], finished: int
    ) -> tuple[Leaf, float]:
        """The least confident required field (of every field where none is required) and
        its confidence; the vote over whole objects for an object without fields."""
        leaves = vote.deciding()
        if leaves:
            weakest = min(leaves, key=lambda leaf: (vote.fields[leaf.path].confidence, leaf.path))
            return weakest, vote.fields[weakest.path].confidence
        whole = self._whole_leaf(voters)
        return whole, round(self.field_confidence(whole, voters, finished), 4)

    def _whole_groups(self, voters: Sequence[Sample]) -> list[list[int]]:
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(voters):
            groups.setdefault(object_key(s.object or {}, self.schema), []).append(i)

        def rank(g: list[int]) -> tuple[float, int, int]:
            return (-round(sum(self._weight(voters[i]) for i in g), 9), -len(g), g[0])

        return sorted(groups.values(), key=rank)

    def _whole_votes(self, voters: Sequence[Sample]) -> dict[str, int]:
        """Votes over whole objects (equal leaf by leaf), by the first one's display."""
        votes: dict[str, int] = {}
        for g in self._whole_groups(voters):
            label = display(voters[g[0]].object)
            votes[label] = votes.get(label, 0) + len(g)
        return votes

    def _whole_leaf(self, voters: Sequence[Sample]) -> Leaf:
        groups = self._whole_groups(voters)
        winner = voters[groups[0][0]].object
        votes = self._whole_votes(voters)
        runner_up = len(groups[1]) if len(groups) > 1 else 0
        return Leaf("", "whole", winner, False, True, votes, groups[0], runner_up, len(voters))

    def _chosen(self, vote: FieldwiseVote, voters: Sequence[Sample]) -> Sample:
        """The sample the answer is: the fallback's, else the one that agrees with the
        most voted fields (the heavier, then the earlier, of equals)."""
        if vote.sample is not None:
            return voters[vote.sample]
        agrees = [0] * len(voters)
        for leaf in vote.leaves.values():
            for i in leaf.winners:
                agrees[i] += 1
        best = min(
            range(len(voters)),
            key=lambda i: (-agrees[i], -round(self._weight(voters[i]), 9), voters[i].index),
        )
        return voters[best]

    # --- stopping -----------------------------------------------------------------------
    def stop(self, samples: Sequence[Sample]) -> StopCheck:
        """After a finished sample: stop when every required field is decided (module
        docstring); auto mode's first stages and a vote without a valid sample as
        :meth:`Strategy.stop`."""
        voters = [s for s in _done(samples) if s.object is not None]
        if not voters or (self.cascade and _ended(samples) < 3):
            return super().stop(samples)
        remaining = sum(s.status in (SampleStatus.queued, SampleStatus.running) for s in samples)
        leaves = self.vote(voters).deciding() or [self._whole_leaf(voters)]
        probability = min(_probability(leaf, remaining) for leaf in leaves)
        if remaining == 0:
            settled = self.early_stop and probability >= self.vote_target
            return StopCheck(True, probability, "confident" if settled else self._ran_out(samples))
        if not self.early_stop:
            return StopCheck(False, probability)
        if all(len(leaf.winners) > leaf.runner_up + remaining for leaf in leaves):
            return StopCheck(True, 1.0, "decided")
        if probability >= self.vote_target:
            return StopCheck(True, probability, "confident")
        return StopCheck(False, probability)

    def _stage_check(self, samples: Sequence[Sample], voters: Sequence[Sample]) -> StopCheck:
        """Auto mode after stage 1 or 2, on the least confident required field: stage 1,
        the greedy sample's confidence (its weakest field's); stage 2, both samples agree
        on every required field and the weakest field's fused confidence
        ``1 - (1 - c0)(1 - c1)`` reaches the target."""
        if not self.early_stop:
            return StopCheck(False, 0.0)
        confidence = 0.0
        if _ended(samples) == 1:
            confidence = (voters[0].confidence or 0.0) if voters else 0.0
        elif len(voters) == 2:
            leaves = self.vote(voters).deciding() or [self._whole_leaf(voters)]
            if all(len(leaf.winners) == 2 for leaf in leaves):
                confidence = min(
                    1.0 - math.prod(1.0 - self.leaf_sample_confidence(s, leaf) for s in voters)
                    for leaf in leaves
                )
        stop = confidence >= self.target_confidence
        return StopCheck(stop, confidence, "confident" if stop else None)
