"""Evaluate many: replay ponder's strategies offline on the recorded samples.

Every configuration here runs the service's own :class:`ponder.enhance.strategy.Strategy`
code (answer extraction, grouping, the weighted vote, the stop rule, the calibrated
confidence) on samples recorded by ``bench/quality_collect.py``: sample ``i`` of a replay
is the recorded sample ``i`` (same task id, index, seed and temperature as a live task
would draw). The worker's launch policy is replayed too: the strategy's window of
samples runs at once, the stop rule looks after each finished sample, and the next one
starts while the vote is open; a sample is taken to end ``completion_tokens`` engine
steps after it started, as on the continuous engine (the live check counts how often a
live decision differs). A sample the stop rule stopped while it ran counts the tokens it
had written by then, as the worker counts them in the task's usage.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ponder.config import Settings, load_settings
from ponder.enhance.calibration import (
    RESULT_FEATURES,
    SAMPLE_FEATURES,
    Calibration,
    LogisticModel,
)
from ponder.enhance.strategy import Strategy, create_strategy
from ponder.types import Sample, SampleStatus, Task, Tokens

SETTINGS: Settings = load_settings(engine="scripted", redis_url=None, node_id="qbench")
#: deep's recorded plan: auto mode replays it
DEEP_PLAN = 5


@dataclass
class Outcome:
    """One problem under one configuration."""

    key: str
    dataset: str
    correct: bool
    answer: str | None
    samples: int
    tokens: int
    confidence: float | None = None
    features: dict[str, float] = field(default_factory=dict)
    greedy_in: bool = False
    #: auto mode: the stage it ended in
    stage: int | None = None


def half_of(key: str) -> int:
    """0 (fit) or 1 (held out): a fixed split by a hash of the problem key."""
    return hashlib.sha256(key.encode()).digest()[0] & 1


async def rerun_programs(records: Sequence[dict[str, Any]], concurrency: int = 4) -> int:
    """Run every recorded program-of-thought sample's program again, as the service now
    runs it (``programs.run_program``), and replace its recorded output: the replay then
    judges those samples with today's program runner, not the collection's. Returns how
    many outputs changed."""
    import asyncio

    from ponder.enhance.programs import run_program

    gate = asyncio.Semaphore(concurrency)
    changed = 0

    async def one(sample: dict[str, Any]) -> None:
        nonlocal changed
        async with gate:
            run = await run_program(sample["text"] or "", SETTINGS)
        output = run.stdout[-2000:] if run is not None else None
        changed += output != sample.get("program_output")
        sample["program_output"] = output

    await asyncio.gather(
        *(
            one(sample)
            for record in records
            for run in record["runs"].values()
            for sample in run["samples"]
            if sample["path"] == "pot" and sample["status"] == "done"
        )
    )
    return changed


class Replayer:
    """Replays strategies over one model's records."""

    def __init__(self, records: Sequence[dict[str, Any]], scorer: Any, calibration: Calibration):
        self.records = list(records)
        self.scorer = scorer
        self.calibration = calibration
        self._correct: dict[tuple[str, str | None], bool] = {}

    def correct(self, record: dict[str, Any], answer: str | None) -> bool:
        key = (record["key"], answer)
        if key not in self._correct:
            self._correct[key] = (
                self.scorer.score(record["dataset"], record["index"], answer) >= 1.0
            )
        return self._correct[key]

    def strategy(
        self,
        record: dict[str, Any],
        mode: str,
        planned: int,
        as_mode: str | None = None,
        **task: Any,
    ) -> Strategy:
        """The strategy of ``as_mode`` (default ``mode``) over the record's ``mode`` run."""
        run = record["runs"][mode]
        t = Task(
            id=run["task_id"],
            mode=as_mode or mode,  # type: ignore[arg-type]
            task_type=record["task_type"],
            prompt=record["question"],
            samples_planned=planned,
            temperature=run["temperature"],
            max_new_tokens=record["max_new_tokens"],
            **task,
        )
        return create_strategy(t, SETTINGS, calibration=self.calibration)

    def samples(self, strategy: Strategy, recorded: Sequence[dict[str, Any]]) -> list[Sample]:
        out = []
        for r in recorded:
            s = Sample(
                index=r["index"],
                path=r["path"],
                temperature=r["temperature"],
                seed=r["seed"],
                status=SampleStatus.done if r["status"] == "done" else SampleStatus(r["status"]),
                text=r["text"],
                tokens=Tokens(prompt=r["prompt_tokens"], completion=r["completion_tokens"]),
                finish_reason=r["finish_reason"],
                mean_logprob=r["mean_logprob"],
                program_output=r.get("program_output"),
            )
            if s.status == SampleStatus.done:
                strategy.rejudge(s)
            out.append(s)
        return out

    def run(
        self,
        record: dict[str, Any],
        mode: str,
        indices: Sequence[int],
        *,
        early_stop: bool = False,
        target: float | None = None,
        tweak: Callable[[Strategy], None] | None = None,
        as_mode: str | None = None,
    ) -> Outcome:
        """The strategy of ``as_mode`` (default ``mode``) over the ``mode`` run's recorded
        samples ``indices`` (in that order, renumbered 0..), replaying its window of
        running samples and its stop rule."""
        recorded = [dict(record["runs"][mode]["samples"][i]) for i in indices]
        planned = len(recorded)
        strategy = self.strategy(
            record, mode, planned, as_mode, early_stop=early_stop, target_confidence=target
        )
        if tweak is not None:
            tweak(strategy)
        for k, r in enumerate(recorded):
            r["index"] = k
        final = self.samples(strategy, recorded)
        live = [s.model_copy(update={"status": SampleStatus.queued}) for s in final]
        strategy.task.samples = live
        used, stopped_tokens = self._launch(strategy, live, final)
        fusion = strategy.fuse(live)
        answer = fusion.result.answer if fusion else None
        return Outcome(
            key=record["key"],
            dataset=record["dataset"],
            correct=self.correct(record, answer),
            answer=answer,
            samples=len(used),
            tokens=sum(s.tokens.completion for s in used) + stopped_tokens,
            confidence=fusion.result.confidence if fusion else None,
            features=fusion.features if fusion else {},
            greedy_in=any(s.temperature == 0 for s in used),
            stage=fusion.result.stage if fusion else None,
        )

    @staticmethod
    def _launch(
        strategy: Strategy, live: list[Sample], final: Sequence[Sample]
    ) -> tuple[list[Sample], int]:
        """Replay the worker's launch policy; the samples that finished (in ``live``, the
        others end skipped) and the tokens the samples the stop rule stopped had written by
        then (the worker counts them in the task's usage).

        The strategy's wave of samples runs at once (auto mode: one at a time through its
        first two stages); the stop rule looks after each
        finished sample; while the vote is open, the next sample starts. As on the
        continuous engine, a sample ends ``completion_tokens`` steps after it started
        (ties: by index); a prefill or a promoted priority is not modelled.
        """
        planned = len(live)
        running: list[tuple[int, int, int]] = []  # (finish step, index, start step)
        started = 0

        def start(at: int) -> None:
            nonlocal started
            live[started].status = SampleStatus.running
            heapq.heappush(running, (at + final[started].tokens.completion, started, at))
            started += 1

        while started < planned and len(running) < strategy.wave(live):
            start(0)
        finished: list[int] = []
        stopped_tokens = 0
        while running:
            at, index, _ = heapq.heappop(running)
            live[index] = final[index]
            finished.append(index)
            if strategy.stop(live).stop:
                stopped_tokens = sum(at - begun for _, _, begun in running)
                break
            while started < planned and len(running) < strategy.wave(live):
                start(at)
        for k in set(range(planned)) - set(finished):
            live[k] = live[k].model_copy(update={"status": SampleStatus.skipped})
        return [final[k] for k in finished], stopped_tokens

    def auto(self, record: dict[str, Any], target: float | None = None, **kw: Any) -> Outcome:
        """Auto mode over the record's deep run (its sample 0 is the same greedy sample as
        standard's): the recorded deep samples in the order of auto's plan (for a type
        without program of thought, its decompose sample moves to stage 2)."""
        strategy = self.strategy(record, "deep", DEEP_PLAN, "auto")
        recorded = [s["path"] for s in record["runs"]["deep"]["samples"]]
        plan = strategy.sample_paths(len(recorded))
        mapped = [p if p in strategy.answers.paths else "cot" for p in recorded]
        indices: list[int] = []
        for path in plan:
            i = next(k for k, p in enumerate(mapped) if p == path and k not in indices)
            indices.append(i)
        return self.run(
            record, "deep", indices, as_mode="auto", early_stop=True, target=target, **kw
        )

    def fast(self, record: dict[str, Any], index: int) -> Outcome:
        """Fast mode: the recorded standard sample ``index`` alone (0 is the greedy one)."""
        return self.run(record, "standard", [index], as_mode="fast")

    def majority(self, record: dict[str, Any], indices: Sequence[int]) -> Outcome:
        """Plain self-consistency: the most frequent answer (ponder's extraction and
        grouping), ties to the earliest sample, no weights."""
        return self.run(record, "standard", indices, tweak=plain_vote)

    def each(
        self, fn: Callable[[dict[str, Any]], Outcome], half: int | None = None
    ) -> list[Outcome]:
        return [fn(r) for r in self.records if half is None or half_of(r["key"]) == half]

    def sample_rows(self, half: int | None = None) -> list[tuple[dict[str, float], bool, str]]:
        """(features, correct, problem key) of every recorded sample that finished."""
        rows = []
        for record in self.records:
            if half is not None and half_of(record["key"]) != half:
                continue
            for mode, run in record["runs"].items():
                strategy = self.strategy(record, mode, len(run["samples"]))
                for s in self.samples(strategy, run["samples"]):
                    if s.status != SampleStatus.done:
                        continue
                    rows.append(
                        (
                            strategy.sample_features(s),
                            s.answer is not None and self.correct(record, s.answer),
                            record["key"],
                        )
                    )
        return rows


def plain_vote(strategy: Strategy) -> None:
    """Every sample weighs 1: no greedy weight, no confidence weighting."""
    strategy.greedy_weight, strategy.confidence_power = 1.0, 0.0


# --- statistics -----------------------------------------------------------------------
def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Paired:
    """McNemar's exact test of two configurations on the same problems."""

    a_only: int
    b_only: int
    p_value: float

    @property
    def diff(self) -> int:
        return self.a_only - self.b_only


def mcnemar(a: Sequence[Outcome], b: Sequence[Outcome]) -> Paired:
    from scipy.stats import binomtest

    by_key = {o.key: o for o in b}
    a_only = sum(1 for o in a if o.correct and not by_key[o.key].correct)
    b_only = sum(1 for o in a if not o.correct and by_key[o.key].correct)
    n = a_only + b_only
    p = binomtest(a_only, n, 0.5).pvalue if n else 1.0
    return Paired(a_only, b_only, float(p))


def ece(pairs: Iterable[tuple[float, bool]], bins: int = 10) -> tuple[float, int]:
    """Expected calibration error over equal-width bins, and the number of pairs."""
    items = list(pairs)
    if not items:
        return (float("nan"), 0)
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inside = [(p, y) for p, y in items if lo <= p < hi or (b == bins - 1 and p == 1.0)]
        if inside:
            conf = sum(p for p, _ in inside) / len(inside)
            acc = sum(y for _, y in inside) / len(inside)
            total += len(inside) / len(items) * abs(conf - acc)
    return (total, len(items))


def fit_logistic(
    rows: Sequence[tuple[dict[str, float], bool]], names: Sequence[str], l2: float = 10.0
) -> LogisticModel:
    """L2-regularised logistic regression (scipy's L-BFGS) over the named features."""
    import numpy as np
    from scipy.optimize import minimize

    x = np.array([[f.get(n, 0.0) for n in names] for f, _ in rows], dtype=float)
    y = np.array([1.0 if c else 0.0 for _, c in rows])

    def loss(w: Any) -> tuple[float, Any]:
        z = np.clip(w[0] + x @ w[1:], -30, 30)
        p = 1 / (1 + np.exp(-z))
        eps = 1e-9
        value = -np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))
        value += l2 * np.sum(w[1:] ** 2) / (2 * len(y))
        grad_z = (p - y) / len(y)
        grad = np.concatenate([[grad_z.sum()], x.T @ grad_z + l2 * w[1:] / len(y)])
        return float(value), grad

    w0 = np.zeros(len(names) + 1)
    res = minimize(loss, w0, jac=True, method="L-BFGS-B")
    w = res.x
    return LogisticModel(
        float(w[0]), {n: round(float(v), 4) for n, v in zip(names, w[1:], strict=True)}
    )


__all__ = [
    "RESULT_FEATURES",
    "SAMPLE_FEATURES",
    "Outcome",
    "Paired",
    "Replayer",
    "ece",
    "fit_logistic",
    "half_of",
    "mcnemar",
    "wilson",
]
