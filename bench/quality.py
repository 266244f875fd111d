"""Benchmark: answer quality of ponder's strategies — sample once, evaluate many.

``make bench-quality`` runs every step for both packaged models; each step can run alone:

- ``collect``: every problem through the service once (``bench/quality_collect.py``):
  a standard task of greedy + 8 sampled answers and a deep task of 5 samples, recorded
  in ``bench/results/quality-samples-<model>.jsonl``; an interrupted run resumes.
- ``peer``: optillm's ``self_consistency`` proxy in front of ``ponder serve`` on the
  first ``--peer-limit`` problems of the held-out half (``bench/quality_peer.py``),
  recorded beside it.
- ``live``: the live worker runtime on the first ``--live-limit`` problems, with the same
  task ids (so the same sample seeds): its decisions must match the offline replay.
- ``report``: the offline replay of every configuration (``bench/quality_replay.py``),
  verdicts on the held-out half (a hash of the problem key), all problems beside them,
  the calibration fit (on one half of the problems, ECE on the other), 95 % Wilson
  intervals and McNemar tests, written to ``bench/results/quality.md`` and ``.png``;
  ``--write-calibration`` also writes ``src/ponder/enhance/calibration.json``.

Problems come from reasoning-gym (offline generators with verified answers):
``gsm_symbolic``, ``basic_arithmetic`` and ``chain_sum`` (math),
``family_relationships`` (a one-word text answer) and ``arithmetic_choice`` (arithmetic
as a multiple-choice question, options A-D with generated distractors), ``--size`` of
each, seeds chosen by
the script (``--seed``) and printed; a problem is correct when the dataset's own
``score_answer`` gives 1.0 for the extracted answer.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import math
import os
import platform
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import RESULTS, ROOT, load_avg
from ponder.enhance.answers import answer_type
from ponder.enhance.calibration import (
    Calibration,
    LogisticModel,
    default_calibration,
    laplace_cap,
)
from ponder.enhance.strategy import Strategy
from quality_collect import (
    DATASETS,
    DEEP_SAMPLES,
    SEED,
    TASK_TIMEOUT_S,
    Scorer,
    append_record,
    collect,
    default_checkpoint,
    read_records,
    revision,
    running_service,
    wait_for,
)
from quality_replay import (
    RESULT_FEATURES,
    SAMPLE_FEATURES,
    SETTINGS,
    Outcome,
    Replayer,
    ece,
    fit_logistic,
    half_of,
    mcnemar,
    rerun_programs,
    wilson,
)

MODELS = ("qwen0.5b", "smollm2-135m")
CALIBRATION_PATH = ROOT / "src" / "ponder" / "enhance" / "calibration.json"
#: stop-rule targets replayed (the mode's default is marked in the report)
TARGETS = (0.8, 0.9, 0.95, 0.99)
#: measured on a pilot of 12 (SmolLM2, at 256) and 8 (Qwen, at 512) problems: correct
#: SmolLM2 answers took at most 92 tokens; correct Qwen answers up to 264 (gsm_symbolic)
#: and none of its 84 samples reached 512, so Qwen keeps 512 (the pilot is its first 8
#: records) and SmolLM2, which rambles to any limit, gets 128
MAX_NEW_TOKENS = {"smollm2-135m": 128, "qwen0.5b": 512}
#: the standard mode's default target_confidence (chosen on the fit half: see the report)
DEFAULT_TARGET = 0.8
#: a model with fewer problems in the fit half gets no calibration of its own
MIN_FIT_PROBLEMS = 30
GREEDY_WEIGHTS = (1.0, 1.25, 1.5, 2.0, 3.0)
#: L2 strengths tried for the result models (with or without the Laplace cap)
L2_GRID = (0.01, 0.1, 1.0, 10.0)
CONFIDENCE_POWERS = (0.0, 1.0, 2.0, 4.0)
#: auto mode's targets replayed; its default is the smallest at which every model's fit
#: half gains AUTO_GAIN over standard N=5 (``fit_auto_target``)
AUTO_TARGETS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
AUTO_GAIN = 0.02
#: the service's default target (ponder.config.AUTO_TARGET): the goals are judged on it
AUTO_DEFAULT = SETTINGS.mode("auto").target_confidence
#: the single-sample model's features before this revision (the AUROC/ECE comparison)
OLD_SAMPLE_FEATURES = ("mean_logprob", "signals", "truncated", "repetition")
#: L2 strengths tried for the sample model (2-fold cross-validation, log loss)
SAMPLE_L2_GRID = (0.1, 1.0, 10.0)


def peer_path(model: str) -> Path:
    return RESULTS / f"quality-optillm-{model}.jsonl"


def live_path(model: str) -> Path:
    return RESULTS / f"quality-live-{model}.jsonl"


# --- live check -------------------------------------------------------------------------
async def live(args: argparse.Namespace) -> int:
    """The live worker runtime on a subset, with the collection's task ids."""
    from ponder.admission import build_task
    from ponder.schemas import TaskCreate

    records = read_records(args.checkpoint)[: args.live_limit]
    out = live_path(args.model)
    done = {r["key"] for r in read_records(out)}
    todo = [r for r in records if r["key"] not in done]
    print(f"live: {len(todo)} problems to run ({len(done)} done)", flush=True)
    if not todo:
        return 0
    gate = asyncio.Semaphore(args.in_flight)

    async def one(record: dict[str, Any]) -> None:
        async with gate:
            target = settings.mode("standard").target_confidence
            line: dict[str, Any] = {"key": record["key"], "target": target}
            for mode, n in (("standard", 5), ("deep", 5)):
                run = record["runs"][mode]
                request = TaskCreate(
                    prompt=record["question"],
                    mode=mode,
                    task_type=record["task_type"],
                    samples=n,
                    temperature=run["temperature"],
                    max_new_tokens=record["max_new_tokens"],
                    early_stop=True,
                )  # type: ignore[arg-type]
                task = build_task(request, settings, task_id=run["task_id"], owner="qbench")
                await store.create_task(task, max_pending=settings.max_pending)
                ended = await wait_for(store, task.id, TASK_TIMEOUT_S)
                line[mode] = {
                    "answer": ended.result.answer if ended.result else None,
                    "samples_used": ended.samples_used,
                    "texts": [s.text for s in ended.samples],
                    "status": str(ended.status),
                }
            append_record(out, line)
            print(f"live {record['key']}: {line['standard']['answer']!r}", flush=True)

    async with running_service(args, "ponder-live-") as (settings, store, _runtime):
        await asyncio.gather(*(one(r) for r in todo))
    return 0


# --- report -----------------------------------------------------------------------------
def pct(x: float) -> str:
    return f"{100 * x:.1f}"


class ModelReport:
    """Every replayed configuration of one model."""

    def __init__(
        self, model: str, records: list[dict[str, Any]], scorer: Scorer, calibration: Calibration
    ) -> None:
        self.model = model
        self.records = records
        self.replayer = Replayer(records, scorer, calibration)
        self.configs: dict[str, list[Outcome]] = {}
        self.labels: dict[str, str] = {}
        #: program-of-thought outputs that today's program runner changed
        self.programs_rerun = 0

    def add(self, name: str, label: str, fn: Callable[[dict[str, Any]], Outcome]) -> None:
        self.labels[name] = label
        self.configs[name] = self.replayer.each(fn)

    def acc(self, name: str) -> float:
        rows = self.configs[name]
        return sum(o.correct for o in rows) / len(rows) if rows else float("nan")

    def mean_samples(self, name: str) -> float:
        rows = self.configs[name]
        return sum(o.samples for o in rows) / len(rows) if rows else float("nan")

    def tokens_per_problem(self, name: str) -> float:
        rows = self.configs[name]
        return sum(o.tokens for o in rows) / len(rows) if rows else float("nan")

    def tokens_per_correct(self, name: str) -> float:
        rows = self.configs[name]
        correct = sum(o.correct for o in rows)
        return sum(o.tokens for o in rows) / correct if correct else float("nan")

    def held_out(self) -> ModelReport:
        """The same replays restricted to the held-out half: the report's verdicts."""
        view = ModelReport.__new__(ModelReport)
        view.model, view.replayer, view.labels = self.model, self.replayer, self.labels
        view.programs_rerun = self.programs_rerun
        view.records = [x for x in self.records if half_of(x["key"]) == 1]
        view.configs = {
            name: [o for o in rows if half_of(o.key) == 1] for name, rows in self.configs.items()
        }
        return view


def tweak_vote(weight: float, power: float) -> Callable[[Strategy], None]:
    def apply(s: Strategy) -> None:
        s.greedy_weight, s.confidence_power = weight, power

    return apply


def replay_all(rep: ModelReport) -> None:
    r = rep.replayer
    rep.add("greedy", "greedy (sample 0, T=0)", lambda x: r.fast(x, 0))
    rep.add("single", "one sampled answer (sample 1, T)", lambda x: r.fast(x, 1))
    for k in (3, 5, 8):
        rep.add(
            f"majority@{k}",
            f"majority of {k} sampled answers (self-consistency)",
            lambda x, k=k: r.majority(x, list(range(1, k + 1))),
        )
    for n in range(2, 10):
        rep.add(
            f"ponder@{n}",
            f"ponder standard N={n} (greedy + {n - 1}), no stop",
            lambda x, n=n: r.run(x, "standard", list(range(n))),
        )
    rep.add(
        "ponder@5-plain",
        "N=5, plain majority (no greedy weight, no CISC)",
        lambda x: r.run(x, "standard", list(range(5)), tweak=tweak_vote(1.0, 0.0)),
    )
    rep.add(
        "ponder@5-nocisc",
        "N=5, greedy weight only (no CISC)",
        lambda x: r.run(x, "standard", list(range(5)), tweak=tweak_vote(1.5, 0.0)),
    )
    rep.add(
        "ponder@5-sampled",
        "N=5 over sampled answers only (no greedy sample)",
        lambda x: r.run(x, "standard", list(range(1, 6))),
    )
    for target in TARGETS:
        rep.add(
            f"stop@8-{target}",
            f"N=8, Beta stop rule, target {target}",
            lambda x, t=target: r.run(x, "standard", list(range(8)), early_stop=True, target=t),
        )
    rep.add(
        "stop@5",
        "N=5, Beta stop rule, mode default target",
        lambda x: r.run(x, "standard", list(range(5)), early_stop=True),
    )
    rep.add("deep", "deep N=5 (its paths), no stop", lambda x: r.run(x, "deep", list(range(5))))
    rep.add(
        "deep-stop",
        "deep N=5, stop rule on",
        lambda x: r.run(x, "deep", list(range(5)), early_stop=True),
    )
    for target in AUTO_TARGETS:
        rep.add(
            f"auto@{target}",
            f"auto (greedy → second path → deep + stop rule), target {target}",
            lambda x, t=target: r.auto(x, t),
        )
    for name, (label, tweak) in AUTO_VARIANTS.items():
        rep.add(
            f"{name}@{AUTO_DEFAULT}",
            f"auto variant: {label}, target {AUTO_DEFAULT}",
            lambda x, tw=tweak: r.auto(x, AUTO_DEFAULT, tweak=tw),
        )


def _vote_at_the_task_target(s: Strategy) -> None:
    """Stage 3's stop rule at the task's target, as stages 1 and 2 (no vote_target)."""
    s.config = s.config.model_copy(update={"vote_target": None})


def _deep_window_in_stage_three(s: Strategy) -> None:
    """Stage 3's samples at once, deep's window (3), the others cancelled at the stop."""

    def wave(samples: Sequence[Any]) -> int:
        ran = sum(x.status.value in ("done", "error", "timeout") for x in samples)
        return 1 if ran < 2 else s.window(len(samples))

    setattr(s, "wave", wave)  # noqa: B010 - a replay variant, not the service's code


def _agreement_ends_stage_two(s: Strategy) -> None:
    """Stage 2 ends when both answers agree, whatever their fused confidence."""
    from ponder.enhance.answers import group_answers
    from ponder.enhance.strategy import StopCheck

    stop = s.stop

    def patched(samples: Sequence[Any]) -> Any:
        ended = [x for x in samples if x.status.value in ("done", "error", "timeout")]
        open_ = any(x.status.value in ("queued", "running") for x in samples)
        answers = [x.answer for x in ended if x.answer is not None]
        agree = len(ended) == 2 == len(answers) and len(group_answers(answers, s.task_type)) == 1
        return StopCheck(True, 1.0, "confident") if open_ and agree else stop(samples)

    setattr(s, "stop", patched)  # noqa: B010


#: the policy variants replayed beside auto (the choice among them: the fit half's)
AUTO_VARIANTS: dict[str, tuple[str, Callable[[Strategy], None]]] = {
    "auto-same-target": ("stage 3's stop rule at the task's target", _vote_at_the_task_target),
    "auto-window": ("stage 3's samples at once (deep's window)", _deep_window_in_stage_three),
    "auto-agree": ("stage 2 ends on agreement alone", _agreement_ends_stage_two),
}


def add_optillm_offline(rep: ModelReport) -> None:
    """optillm's aggregation over ponder's own sampled answers 1..5 (paired with
    ``ponder@5-sampled``: same samples, another vote)."""
    from quality_peer import optillm_offline

    reps = optillm_offline(rep.records, [1, 2, 3, 4, 5])
    if not reps:
        return
    by_key = {x["key"]: x for x in rep.records}
    rows = []
    for key, text in reps.items():
        x = by_key[key]
        kind = answer_type(x["task_type"])
        answer = kind.extract(text, kind.question(x["question"])) if text else None
        rows.append(Outcome(key, x["dataset"], rep.replayer.correct(x, answer), answer, 5, 0))
    rep.labels["optillm-offline"] = "optillm's self_consistency vote over ponder's samples 1-5"
    rep.configs["optillm-offline"] = rows


def peer_outcomes(rep: ModelReport, scorer: Scorer) -> list[Outcome]:
    lines = {r["key"]: r for r in read_records(peer_path(rep.model))}
    out = []
    for record in rep.records:
        line = lines.get(record["key"])
        if line is None:
            continue
        answer = line["answer"]
        out.append(
            Outcome(
                record["key"],
                record["dataset"],
                scorer.score(record["dataset"], record["index"], answer) >= 1.0,
                answer,
                5,
                0,
            )
        )
    return out


def in_half(reports: Sequence[ModelReport], half: int) -> Iterator[tuple[Replayer, dict[str, Any]]]:
    """Each model's replayer with each of its records in ``half`` (0: fit, 1: held out)."""
    for rep in reports:
        for x in rep.records:
            if half_of(x["key"]) == half:
                yield rep.replayer, x


def modes_lists() -> dict[str, list[Any]]:
    """An empty list per mode, in the order the reports list them."""
    return {"fast": [], "standard": [], "deep": [], "auto": []}


def fit_calibration(reports: Sequence[ModelReport]) -> tuple[Calibration, dict[str, Any]]:
    """Fit the sample model, choose the vote weights, fit the result models — all on
    the fit half (half 0) of every model's problems."""
    keyed = [(f, c, k) for rep in reports for f, c, k in rep.replayer.sample_rows(half=0)]
    rows = [(f, c) for f, c, _ in keyed]
    sample_l2 = min(SAMPLE_L2_GRID, key=lambda l2: cv_log_loss(keyed, SAMPLE_FEATURES, l2))
    sample_model = fit_logistic(rows, SAMPLE_FEATURES, l2=sample_l2)
    prior = default_calibration()
    calibration = Calibration(sample_model, prior.modes, {})
    for rep in reports:
        rep.replayer.calibration = calibration
    grid: dict[str, int] = {}
    for weight in GREEDY_WEIGHTS:
        for power in CONFIDENCE_POWERS:
            grid[f"{weight}/{power}"] = sum(
                r.run(x, "standard", list(range(n)), tweak=tweak_vote(weight, power)).correct
                for r, x in in_half(reports, 0)
                for n in (3, 5, 8)
            )
    results: dict[str, list[tuple[dict[str, float], bool, str]]] = modes_lists()
    for r, x in in_half(reports, 0):
        for i in range(9):
            o = r.fast(x, i)
            results["fast"].append((o.features, o.correct, x["key"]))
        for n in range(2, 10):
            for es in (False, True):
                o = r.run(x, "standard", list(range(n)), early_stop=es)
                results["standard"].append((o.features, o.correct, x["key"]))
        for n in (3, 5):
            for es in (False, True):
                o = r.run(x, "deep", list(range(n)), early_stop=es)
                results["deep"].append((o.features, o.correct, x["key"]))
        for target in AUTO_TARGETS:
            o = r.auto(x, target)
            results["auto"].append((o.features, o.correct, x["key"]))
    names = {
        "fast": ("mean_logprob", "signals", "sample_confidence"),
        "standard": RESULT_FEATURES,
        "deep": RESULT_FEATURES,
        "auto": RESULT_FEATURES,
    }
    modes, choices = {}, {}
    for mode, rows_m in results.items():
        if rows_m:
            modes[mode], choices[mode] = fit_result_model(rows_m, names[mode])
    info = {
        "fitted": True,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "models": [rep.model for rep in reports],
        "problems_fit_half": sum(1 for _ in in_half(reports, 0)),
        "rows": {"sample": len(rows), **{m: len(v) for m, v in results.items()}},
        "sample_model": {"l2": sample_l2},
        "result_models": choices,
    }
    targets = {"targets": fit_targets(reports), "deep_targets": fit_targets(reports, "deep", 5)}
    return Calibration(sample_model, modes, info), {"grid": grid, **targets}


def cv_log_loss(
    rows: Sequence[tuple[dict[str, float], bool, str]], names: Sequence[str], l2: float
) -> float:
    """Mean held-back log loss of a logistic fit, 2-fold cross-validation inside the fit
    half (folds by problem)."""
    total, n = 0.0, 0
    for fold in (0, 1):
        model = fit_logistic([(f, c) for f, c, k in rows if fold_of(k) != fold], names, l2=l2)
        for f, c, k in rows:
            if fold_of(k) == fold:
                p = min(1 - 1e-9, max(1e-9, model.predict(f)))
                total -= math.log(p if c else 1 - p)
                n += 1
    return total / max(1, n)


def auto_targets(reports: Sequence[ModelReport], half: int) -> dict[str, dict[str, Any]]:
    """Per model, on one half, from the replays of :func:`replay_all`: ``standard`` (N=5),
    auto at each target (by its target) and each variant at the default (by its name):
    (accuracy, tokens per problem as a share of standard N=5's)."""
    names = {"standard": "ponder@5", **{str(t): f"auto@{t}" for t in AUTO_TARGETS}}
    names |= {v: f"{v}@{AUTO_DEFAULT}" for v in AUTO_VARIANTS}
    out: dict[str, dict[str, Any]] = {}
    for rep in reports:
        runs = {k: [o for o in rep.configs[n] if half_of(o.key) == half] for k, n in names.items()}
        std_tokens = sum(o.tokens for o in runs["standard"])
        out[rep.model] = {
            k: (sum(o.correct for o in rows) / len(rows), sum(o.tokens for o in rows) / std_tokens)
            for k, rows in runs.items()
        }
    return out


def fit_auto_target(tables: dict[str, dict[str, Any]]) -> float:
    """Auto's default target, from the fit half: the smallest target at which every
    model's accuracy is at least standard N=5's + :data:`AUTO_GAIN` (the most accurate
    target when none is)."""
    for target in AUTO_TARGETS:
        if all(t[str(target)][0] >= t["standard"][0] + AUTO_GAIN for t in tables.values()):
            return target
    return max(AUTO_TARGETS, key=lambda x: sum(t[str(x)][0] for t in tables.values()))


def fold_of(key: str) -> int:
    """The cross-validation fold of a fit-half problem (another bit of the key's hash)."""
    return hashlib.sha256(key.encode()).digest()[1] & 1


def stated(model: LogisticModel, features: dict[str, float]) -> float:
    """The confidence a result with these features states (``Calibration.result_confidence``)."""
    p = model.predict(features)
    if not model.cap:
        return p
    n = round(math.exp(features["log_finished"]))
    return min(p, laplace_cap(round(features["share"] * n), n))


def fit_result_model(
    rows: Sequence[tuple[dict[str, float], bool, str]], names: Sequence[str]
) -> tuple[LogisticModel, dict[str, Any]]:
    """A mode's result model: its L2 strength and whether it keeps the Laplace cap chosen
    by 2-fold cross-validation inside the fit half (folds by problem), lowest mean ECE.
    Results without an answer state 0 whatever the model, so they are not fitted."""
    rows = [r for r in rows if r[0]]
    scores: dict[tuple[float, bool], float] = {}
    for l2 in L2_GRID:
        fits = [
            fit_logistic([(f, c) for f, c, k in rows if fold_of(k) != fold], names, l2=l2)
            for fold in (0, 1)
        ]
        for cap in (True, False):
            errors = [
                ece(
                    (stated(replace(fits[fold], cap=cap), f), c)
                    for f, c, k in rows
                    if fold_of(k) == fold
                )[0]
                for fold in (0, 1)
            ]
            scores[(l2, cap)] = sum(errors) / 2
    l2, cap = min(scores, key=lambda choice: scores[choice])
    model = replace(fit_logistic([(f, c) for f, c, _ in rows], names, l2=l2), cap=cap)
    return model, {"l2": l2, "cap": cap, "cv_ece": round(scores[(l2, cap)], 4)}


def fit_problems(rep: ModelReport) -> int:
    return sum(1 for x in rep.records if half_of(x["key"]) == 0)


def fit_targets(
    reports: Sequence[ModelReport], mode: str = "standard", n: int = 8
) -> dict[float, tuple[int, int, float]]:
    """On the fit half, ``mode`` with ``n`` samples: per stop-rule target, (correct with the
    stop rule, correct without it, mean samples) — the mode's default target is chosen
    from this table."""
    out: dict[float, tuple[int, int, float]] = {}
    fit = list(in_half(reports, 0))
    full = sum(r.run(x, mode, list(range(n))).correct for r, x in fit)
    for target in TARGETS:
        runs = [r.run(x, mode, list(range(n)), early_stop=True, target=target) for r, x in fit]
        out[target] = (
            sum(o.correct for o in runs),
            full,
            sum(o.samples for o in runs) / max(1, len(runs)),
        )
    return out


def held_out_pairs(reports: Sequence[ModelReport]) -> dict[str, list[tuple[float, bool]]]:
    """(stated confidence, correct) per mode on the held-out half: fast = the greedy and
    one sampled answer alone; standard = N=3, and N=5 and N=8 with the stop rule; deep =
    N=5 with the stop rule; auto = its default target."""
    pairs: dict[str, list[tuple[float, bool]]] = modes_lists()
    for r, x in in_half(reports, 1):
        for o in (r.fast(x, 0), r.fast(x, 1)):
            pairs["fast"].append((o.confidence or 0.0, o.correct))
        for n, es in ((3, False), (5, True), (8, True)):
            o = r.run(x, "standard", list(range(n)), early_stop=es)
            pairs["standard"].append((o.confidence or 0.0, o.correct))
        o = r.run(x, "deep", list(range(5)), early_stop=True)
        pairs["deep"].append((o.confidence or 0.0, o.correct))
        o = r.auto(x, AUTO_DEFAULT)
        pairs["auto"].append((o.confidence or 0.0, o.correct))
    return pairs


def auroc(pairs: Sequence[tuple[float, bool]]) -> float:
    """The area under the ROC curve of a score for right (True) against wrong answers:
    P(a right answer's score > a wrong one's), ties counted half."""
    right = [p for p, y in pairs if y]
    wrong = [p for p, y in pairs if not y]
    if not right or not wrong:
        return float("nan")
    wins = sum((a > b) + 0.5 * (a == b) for a in right for b in wrong)
    return wins / (len(right) * len(wrong))


def greedy_confidence(
    reports: Sequence[ModelReport],
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per model, (AUROC, ECE) of the greedy sample's confidence on the held-out half:
    ``before`` with the sample model of the features before this revision (refitted on
    the same fit half), ``after`` with today's."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for rep in reports:
        r = rep.replayer
        before = fit_logistic([(f, c) for f, c, _ in r.sample_rows(half=0)], OLD_SAMPLE_FEATURES)
        scores: dict[str, list[tuple[float, bool]]] = {"before": [], "after": []}
        for x in rep.records:
            if half_of(x["key"]) != 1:
                continue
            strategy = r.strategy(x, "standard", 1, "fast")
            (sample,) = r.samples(strategy, x["runs"]["standard"]["samples"][:1])
            if sample.status.value != "done":
                continue
            right = sample.answer is not None and r.correct(x, sample.answer)
            features = strategy.sample_features(sample)
            old = before.predict(features) if sample.answer is not None else 0.0
            scores["before"].append((old, right))
            scores["after"].append((sample.confidence or 0.0, right))
        out[rep.model] = {k: (auroc(v), ece(v)[0]) for k, v in scores.items()}
    return out


def live_check(rep: ModelReport) -> tuple[int, int, int]:
    """(problems, answers that match the replay, sample texts that match the record)."""
    lines = {r["key"]: r for r in read_records(live_path(rep.model))}
    problems = matched = texts = 0
    for x in rep.records:
        line = lines.get(x["key"])
        if line is None:
            continue
        problems += 1
        # the target the live run had (lines written before it was recorded: 0.95)
        target = line.get("target", 0.95)
        replay = rep.replayer.run(x, "standard", list(range(5)), early_stop=True, target=target)
        live_std = line["standard"]
        if replay.answer == live_std["answer"] and replay.samples == live_std["samples_used"]:
            matched += 1
        recorded = [s["text"] for s in x["runs"]["standard"]["samples"][:5]]
        texts += sum(a == b for a, b in zip(live_std["texts"], recorded, strict=False) if a)
    return problems, matched, texts


def collection_sessions(model: str) -> list[dict[str, Any]]:
    """The collection runs of ``model``: each start line, completed by its end line."""
    sessions: dict[str, dict[str, Any]] = {}
    for line in read_records(default_checkpoint(model).with_suffix(".log")):
        sessions.setdefault(line["start"], {}).update(line)
    return list(sessions.values())


def sample_notes(rep: ModelReport) -> str:
    """What the recorded samples look like: answers stated, truncation, length."""
    samples = [
        s for x in rep.records for run in x["runs"].values() for s in run["samples"]
        if s["status"] == "done"
    ]  # fmt: skip
    r = rep.replayer
    stated = 0
    for x in rep.records:
        for mode, run in x["runs"].items():
            strategy = r.strategy(x, mode, len(run["samples"]))
            stated += sum(s.answer is not None for s in r.samples(strategy, run["samples"]))
    cut = sum(s["finish_reason"] == "length" for s in samples)
    tokens = sum(s["completion_tokens"] for s in samples)
    n = max(1, len(samples))
    return (
        f"Recorded samples: {len(samples)}; {stated} ({100 * stated / n:.0f} %) state an answer "
        f"(the others do not vote); {cut} ({100 * cut / n:.0f} %) reached the token limit; "
        f"{tokens / n:.0f} completion tokens on average."
    )


def revisions(rep: ModelReport) -> str:
    """Which method revision (``quality_collect.REVISION``) each mode's runs are of."""
    parts = []
    for mode in ("standard", "deep"):
        counts = Counter(revision(x, mode) for x in rep.records)
        paths = Counter(
            "/".join(s["path"] for s in x["runs"][mode]["samples"]) for x in rep.records
        ).most_common(1)[0][0]
        parts.append(
            f"{mode}: "
            + ", ".join(f"revision {r} on {k} problems" for r, k in sorted(counts.items()))
            + f" (paths by sample, most common: {paths})"
        )
    return "Method revisions of the recorded runs: " + "; ".join(parts) + "."


def path_table(rep: ModelReport, datasets: Sequence[str]) -> list[str]:
    """One recorded sample's accuracy per sample (its path and temperature) and dataset,
    on the fit half: what deep mode's paths were chosen on."""
    fit = [x for x in rep.records if half_of(x["key"]) == 0]
    rows = [("standard", 0), ("standard", 1)] + [("deep", i) for i in range(DEEP_SAMPLES)]
    lines = [
        f"One recorded sample alone, fit half ({len(fit)} problems): correct per dataset "
        "(a deep path a task type does not allow runs as cot).",
        "",
        "| run, sample: path (T) | " + " | ".join(datasets) + " | all |",
        "|---|" + "---:|" * (len(datasets) + 1),
    ]
    for mode, i in rows:
        outcomes = [(x["dataset"], rep.replayer.run(x, mode, [i]).correct) for x in fit]
        first = fit[0]["runs"][mode]["samples"][i]
        per = Counter(d for d, ok in outcomes if ok)
        lines.append(
            f"| {mode} {i}: {first['path']} (T {first['temperature']}) | "
            + " | ".join(str(per[d]) for d in datasets)
            + f" | {sum(per.values())} |"
        )
    return lines


def command_line() -> str:
    return shlex.join([".venv/bin/python", "bench/quality.py", *sys.argv[1:]])


#: the paired comparisons printed per model (McNemar)
PAIRS = (
    ("ponder@5", "greedy"),
    ("ponder@5", "majority@5"),
    ("ponder@8", "greedy"),
    ("ponder@5", "ponder@5-plain"),
    ("ponder@5", "ponder@5-nocisc"),
    ("ponder@5", "ponder@5-sampled"),
    (f"stop@8-{DEFAULT_TARGET}", "ponder@8"),
    ("deep", "ponder@5"),
    ("deep-stop", "deep"),
    ("ponder@5-sampled", "optillm-offline"),
    (f"auto@{AUTO_DEFAULT}", "ponder@5"),
    (f"auto@{AUTO_DEFAULT}", "deep"),
    (f"auto@{AUTO_DEFAULT}", "greedy"),
)


def machine() -> str:
    from importlib.metadata import version

    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other work), Python "
        f"{platform.python_version()}, openvino-genai {version('openvino-genai')}"
    )


def compare(rep: ModelReport, a: str, b: str) -> str:
    t = mcnemar(rep.configs[a], rep.configs[b])
    return (
        f"`{a}` {pct(rep.acc(a))} % vs `{b}` {pct(rep.acc(b))} % "
        f"({t.a_only} vs {t.b_only} discordant, McNemar p = {t.p_value:.3g})"
    )


def goals(rep: ModelReport, peer: list[Outcome]) -> list[tuple[str, str, str]]:
    rows = []
    t = mcnemar(rep.configs["ponder@5"], rep.configs["greedy"])
    ok = rep.acc("ponder@5") > rep.acc("greedy") and t.p_value < 0.05
    rows.append(
        (
            "standard (N=5) beats greedy, p < 0.05",
            compare(rep, "ponder@5", "greedy"),
            "met" if ok else "**not met**",
        )
    )
    rows.append(
        (
            "deep (N=5) >= standard (N=5)",
            compare(rep, "deep", "ponder@5"),
            "met" if rep.acc("deep") >= rep.acc("ponder@5") else "**not met**",
        )
    )
    for target in TARGETS:
        name = f"stop@8-{target}"
        saved = 1 - rep.mean_samples(name) / rep.mean_samples("ponder@8")
        t = mcnemar(rep.configs[name], rep.configs["ponder@8"])
        drop = 100 * (rep.acc("ponder@8") - rep.acc(name))
        ok = saved >= 0.30 and drop <= 1.0 and not (t.p_value < 0.05 and t.diff < 0)
        text = (
            f"target {target}: {rep.mean_samples(name):.2f} vs 8 samples "
            f"({100 * saved:.0f} % fewer), accuracy {pct(rep.acc(name))} vs "
            f"{pct(rep.acc('ponder@8'))} % ({drop:+.1f} points, p = {t.p_value:.3g})"
        )
        if target == DEFAULT_TARGET:
            rows.append(
                (
                    f"stop rule (default {DEFAULT_TARGET}): >= 30 % fewer samples than N=8, "
                    "accuracy within 1 point and not significantly lower",
                    text,
                    "met" if ok else "**not met**",
                )
            )
    if peer:
        keys = {o.key for o in peer}
        mine = [o for o in rep.configs["ponder@5"] if o.key in keys]
        t = mcnemar(mine, peer)
        a = sum(o.correct for o in mine) / len(mine)
        b = sum(o.correct for o in peer) / len(peer)
        rows.append(
            (
                "ponder's vote >= optillm self_consistency at 5 samples",
                f"ponder N=5 {pct(a)} % vs optillm {pct(b)} % on {len(peer)} problems "
                f"({t.a_only} vs {t.b_only} discordant, p = {t.p_value:.3g})",
                "met" if a >= b else "**not met**",
            )
        )
    else:
        rows.append(
            (
                "ponder's vote >= optillm self_consistency at 5 samples",
                "optillm not run for this model",
                "not measured",
            )
        )
    rows += auto_goals(rep)
    if "optillm-offline" in rep.configs:
        better = rep.acc("ponder@5-sampled") >= rep.acc("optillm-offline")
        rows.append(
            (
                "ponder's vote >= optillm's vote on the same 5 sampled answers (offline)",
                compare(rep, "ponder@5-sampled", "optillm-offline"),
                "met" if better else "**not met**",
            )
        )
    return rows


def auto_goals(rep: ModelReport) -> list[tuple[str, str, str]]:
    """The auto issue's goals for this model (held-out view): Qwen: +2 points over
    standard N=5 at <= 40 % of its tokens, and a higher target within 1 point of deep at
    <= 60 % of deep's tokens; SmolLM2: +5 points over standard N=5."""
    auto, std, deep = f"auto@{AUTO_DEFAULT}", "ponder@5", "deep"
    share = rep.tokens_per_problem(auto) / rep.tokens_per_problem(std)
    gain = 100 * (rep.acc(auto) - rep.acc(std))
    rows = []
    if rep.model.startswith("smollm2"):
        rows.append(
            (
                f"auto (target {AUTO_DEFAULT}) >= standard N=5 + 5 points",
                f"{compare(rep, auto, std)}; {gain:+.1f} points",
                "met" if gain >= 5 else "**not met**",
            )
        )
        return rows
    rows.append(
        (
            f"auto (target {AUTO_DEFAULT}) >= standard N=5 + 2 points at <= 40 % of its tokens",
            f"{compare(rep, auto, std)}; {gain:+.1f} points at {100 * share:.0f} % of "
            f"standard's tokens ({rep.tokens_per_problem(auto):.0f} vs "
            f"{rep.tokens_per_problem(std):.0f} per problem)",
            "met" if gain >= 2 and share <= 0.40 else "**not met**",
        )
    )
    deep_tokens = rep.tokens_per_problem(deep)
    best: tuple[str, str] | None = None
    for target in (t for t in AUTO_TARGETS if t > AUTO_DEFAULT):
        name = f"auto@{target}"
        t = mcnemar(rep.configs[name], rep.configs[deep])
        close = rep.acc(name) >= rep.acc(deep) - 0.01 and not (t.p_value < 0.05 and t.diff < 0)
        cheap = rep.tokens_per_problem(name) <= 0.60 * deep_tokens
        text = (
            f"target {target}: {compare(rep, name, deep)}; "
            f"{100 * rep.tokens_per_problem(name) / deep_tokens:.0f} % of deep's tokens"
        )
        if close and cheap:
            best = (text, "met")
            break
        if close and best is None:
            best = (text, "**not met** (tokens)")
    rows.append(
        (
            "moonshot: auto at a higher target within 1 point of deep N=5 (not significantly "
            "lower) at <= 60 % of deep's tokens",
            best[0] if best else "no target within 1 point of deep",
            best[1] if best else "**not met**",
        )
    )
    return rows


def cost_table(rep: ModelReport) -> list[str]:
    """Accuracy against completion tokens per problem (the held-out view)."""
    std, deep = rep.tokens_per_problem("ponder@5"), rep.tokens_per_problem("deep")
    names = ["greedy", *(f"ponder@{n}" for n in (2, 3, 5, 8)), "stop@5", "deep", "deep-stop"]
    names += [f"auto@{t}" for t in AUTO_TARGETS]
    names += [f"{v}@{AUTO_DEFAULT}" for v in AUTO_VARIANTS]
    lines = [
        "| policy | accuracy % | completion tokens per problem | vs standard N=5 | vs deep | "
        "mean samples |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        mark = " (default)" if name == f"auto@{AUTO_DEFAULT}" else ""
        tokens = rep.tokens_per_problem(name)
        lines.append(
            f"| `{name}`{mark} | {pct(rep.acc(name))} | {tokens:.0f} | {100 * tokens / std:.0f} % "
            f"| {100 * tokens / deep:.0f} % | {rep.mean_samples(name):.2f} |"
        )
    return lines


def plot(reports: Sequence[ModelReport], eces: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(19, 5.5))
    ax = axes[0]
    for i, rep in enumerate(reports):
        color = plt.get_cmap("tab10")(i)
        xs = list(range(2, 10))
        ax.plot(
            xs,
            [100 * rep.acc(f"ponder@{n}") for n in xs],
            "o-",
            color=color,
            label=f"{rep.model}: ponder (greedy + N-1)",
        )
        ks = (3, 5, 8)
        ax.plot(
            ks,
            [100 * rep.acc(f"majority@{k}") for k in ks],
            "s--",
            color=color,
            alpha=0.6,
            label=f"{rep.model}: majority of N sampled",
        )
        ax.axhline(100 * rep.acc("greedy"), color=color, ls=":", label=f"{rep.model}: greedy")
        for target in TARGETS:
            name = f"stop@8-{target}"
            ax.plot(rep.mean_samples(name), 100 * rep.acc(name), "^", color=color, ms=8)
    ax.set_xlabel("samples per problem (triangles: N=8 with the stop rule, mean samples)")
    ax.set_ylabel("accuracy %")
    ax.set_title("accuracy vs samples")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot([0, 1], [0, 1], color="gray", lw=1)
    for mode, pairs in eces["pairs"].items():
        bins = [
            [p for p in pairs if lo / 10 <= p[0] < (lo + 1) / 10 or (lo == 9 and p[0] == 1)]
            for lo in range(10)
        ]
        xs = [sum(p for p, _ in b) / len(b) for b in bins if b]
        ys = [sum(y for _, y in b) / len(b) for b in bins if b]
        ax.plot(xs, ys, "o-", label=f"{mode} (ECE {eces['ece'][mode][0]:.3f})")
    ax.set_xlabel("stated confidence (held-out half)")
    ax.set_ylabel("observed accuracy")
    ax.set_title("reliability of result.confidence")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[2]
    for i, rep in enumerate(reports):
        held = rep.held_out()
        color = plt.get_cmap("tab10")(i)
        points = {
            "greedy": ("o", "greedy"),
            "ponder@5": ("s", "standard N=5"),
            "deep": ("D", "deep"),
            "deep-stop": ("d", "deep + stop"),
        }
        for name, (marker, label) in points.items():
            ax.plot(held.tokens_per_problem(name), 100 * held.acc(name), marker, color=color,
                    ms=8, label=f"{rep.model}: {label}")  # fmt: skip
        xs = [held.tokens_per_problem(f"ponder@{n}") for n in range(2, 10)]
        ax.plot(xs, [100 * held.acc(f"ponder@{n}") for n in range(2, 10)], ":", color=color)
        autos = [f"auto@{t}" for t in AUTO_TARGETS]
        ax.plot([held.tokens_per_problem(a) for a in autos], [100 * held.acc(a) for a in autos],
                "^-", color=color, label=f"{rep.model}: auto (targets {AUTO_TARGETS[0]}-"
                f"{AUTO_TARGETS[-1]})")  # fmt: skip
    ax.set_xlabel("completion tokens per problem (held-out half)")
    ax.set_ylabel("accuracy %")
    ax.set_title("cost and accuracy (dotted: standard N=2..9)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def report(args: argparse.Namespace) -> int:
    started = time.monotonic()
    reports = []
    for model in args.models:
        records = read_records(default_checkpoint(model))
        if not records:
            print(f"no records for {model} in {default_checkpoint(model)}", flush=True)
            continue
        scorer = Scorer(args.datasets, args.size, args.seed)
        rep = ModelReport(model, records, scorer, default_calibration())
        rep.programs_rerun = asyncio.run(rerun_programs(records))
        reports.append(rep)
    if not reports:
        return 1
    pooled, fit_info = fit_calibration(reports)
    # a model with too few problems for a fit of its own uses the pooled one
    fitted = {
        rep.model: fit_calibration([rep])[0] if fit_problems(rep) >= MIN_FIT_PROBLEMS else pooled
        for rep in reports
    }
    for rep in reports:
        rep.replayer.calibration = fitted[rep.model]
        replay_all(rep)
        add_optillm_offline(rep)
    fit_info["auto_targets"] = auto_targets(reports, half=0)
    pairs = held_out_pairs(reports)
    eces = {m: ece(p) for m, p in pairs.items()}
    fit_info["greedy"] = greedy_confidence(reports)
    fit_info["sample_l2"] = pooled.info["sample_model"]["l2"]
    fit_info["auto_target"] = fit_auto_target(fit_info["auto_targets"])
    per_model = {
        rep.model: {m: ece(p) for m, p in held_out_pairs([rep]).items()} for rep in reports
    }
    if args.write_calibration:
        info = dict(pooled.info)
        info["ece_held_out"] = {m: round(v[0], 4) for m, v in eces.items()}
        info["ece_held_out_per_model"] = {
            model: {m: round(v[0], 4) for m, v in e.items()} for model, e in per_model.items()
        }
        data = {
            "info": info,
            "default": pooled.to_json(),
            "models": {m: c.to_json() for m, c in fitted.items() if c is not pooled},
        }
        CALIBRATION_PATH.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {CALIBRATION_PATH}", flush=True)
    calibration = pooled
    fit_info["result_models"] = {
        model: c.info.get("result_models", {}) for model, c in {**fitted, "pooled": pooled}.items()
    }
    out: Path = args.out
    png = out.with_suffix(".png")
    plot(reports, {"pairs": pairs, "ece": eces}, png)
    write_report(out, png, reports, args, calibration, fit_info, eces, per_model, started)
    print(f"wrote {out} and {png}", flush=True)
    return 0


def write_report(
    out: Path,
    png: Path,
    reports: Sequence[ModelReport],
    args: argparse.Namespace,
    calibration: Calibration,
    fit_info: dict[str, Any],
    eces: dict[str, tuple[float, int]],
    per_model: dict[str, dict[str, tuple[float, int]]],
    started: float,
) -> None:
    from importlib.metadata import version

    lines = [
        "# Quality benchmark: sample once, evaluate many",
        "",
        f"Command: `{command_line()}`; report written "
        f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')} in "
        f"{time.monotonic() - started:.0f} s. Machine: {machine()}; `uptime`: {load_avg()}.",
        "",
        f"Problems: reasoning-gym {version('reasoning-gym')} "
        + ", ".join(f"`{d}`" for d in args.datasets)
        + f", seed {args.seed} (+ 1000003 k for the k-th dataset), interleaved; "
        "`basic_arithmetic` and `chain_sum` at the easy setting of `quality_collect.EASY`.",
        "Every number below is an offline replay of ponder's own strategy code over samples "
        "recorded once through the service (`quality_collect.py`); a problem is correct when "
        "the dataset's `score_answer` gives 1.0.",
        "",
    ]
    for rep in reports:
        n = len(rep.records)
        held = rep.held_out()
        sessions = collection_sessions(rep.model)
        wall = sum(s.get("wall_s", 0) for s in sessions)
        first = rep.records[0]
        lines += [
            f"## {rep.model}: {n} problems",
            "",
            f"Collected with `--max-new-tokens {first['max_new_tokens']}`, standard "
            f"temperature {first['runs']['standard']['temperature']}, deep "
            f"{first['runs']['deep']['temperature']}, in {len(sessions)} session(s), "
            f"{wall / 3600:.2f} h of wall time in all: "
            + "; ".join(
                (f"(redo of the {s['redo']} runs) " if s.get("redo") else "")
                + f"{s['start']} → {s.get('end', 'still running or killed')}, "
                f"{s.get('problems', '?')} problems, load at start "
                f"`{s['load_start'].split('load average:')[-1].strip()}`"
                for s in sessions
            )
            + ".",
            "",
            revisions(rep),
            "",
            f"### Goals: the held-out half ({len(held.records)} problems)",
            "",
            "| goal | measured | verdict |",
            "|---|---|---|",
        ]
        peer = peer_outcomes(rep, rep.replayer.scorer)
        held_peer = [o for o in peer if half_of(o.key) == 1]
        lines += [f"| {g} | {m} | {v} |" for g, m, v in goals(held, held_peer)]
        lines += [
            "",
            f"### Cost and accuracy: the held-out half ({len(held.records)} problems)",
            "",
            "Completion tokens per problem of every sample that ran (auto and deep reuse the "
            "recorded deep run, whose sample 0 is standard's greedy sample).",
            "",
            *cost_table(held),
        ]
        lines += [
            "",
            "### Accuracy",
            "",
            f"Held-out half ({len(held.records)} problems: the verdicts) and all {n} problems "
            "(the fit half was used for the choices below: calibration, vote weights, stop "
            "target, extraction fixes). Mean samples and tokens per correct answer are the "
            "held-out half's.",
            "",
            "| config | held-out correct | % | 95 % Wilson | all correct | % | mean samples "
            "| tokens per correct |",
            "|---|---:|---:|---|---:|---:|---:|---:|",
        ]
        for name, label in rep.labels.items():
            rows, all_rows = held.configs[name], rep.configs[name]
            k, k_all = sum(o.correct for o in rows), sum(o.correct for o in all_rows)
            lo, hi = wilson(k, len(rows))
            lines.append(
                f"| {label} (`{name}`) | {k}/{len(rows)} | {pct(k / len(rows))} | "
                f"{pct(lo)}-{pct(hi)} | {k_all}/{len(all_rows)} | {pct(k_all / len(all_rows))} "
                f"| {held.mean_samples(name):.2f} | {held.tokens_per_correct(name):.0f} |"
            )
        if peer:
            k, k_all = sum(o.correct for o in held_peer), sum(o.correct for o in peer)
            lo, hi = wilson(k, len(held_peer))
            lines.append(
                f"| optillm self_consistency, 5 calls, live (`optillm`) | {k}/{len(held_peer)} "
                f"| {pct(k / max(1, len(held_peer)))} | {pct(lo)}-{pct(hi)} | {k_all}/{len(peer)} "
                f"| {pct(k_all / len(peer))} | 5.00 | - |"
            )
        for title, view in (("held-out half", held), (f"all {n} problems", rep)):
            lines += ["", f"Paired comparisons, {title} (McNemar, exact):", ""]
            for a, b in PAIRS:
                if a in view.configs and b in view.configs:
                    lines.append(f"- {compare(view, a, b)}")
        lines += [
            "",
            "Accuracy per dataset (all problems):",
            "",
            "| config | " + " | ".join(args.datasets) + " |",
            "|---|" + "---:|" * len(args.datasets),
        ]
        for name in (
            "greedy",
            "single",
            "majority@5",
            "ponder@5",
            "ponder@8",
            f"stop@8-{DEFAULT_TARGET}",
            "deep",
        ):
            cells = []
            for d in args.datasets:
                mine = [o for o in rep.configs[name] if o.dataset == d]
                cells.append(f"{sum(o.correct for o in mine)}/{len(mine)}")
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
        problems, matched, texts = live_check(rep)
        lines += [""]
        if problems:
            lines.append(
                f"Live check: {problems} problems run again through the worker runtime (standard "
                f"N=5, stop rule on at the live run's target, same task ids): {matched} "
                "decisions (answer and samples used) match the replay; "
                f"{texts} of their sample texts equal the recorded ones."
            )
        else:
            lines.append("Live check: not run for this model (`quality.py live`).")
        lines += ["", *path_table(rep, args.datasets)]
        lines += [
            "",
            sample_notes(rep),
            "",
            "Program-of-thought samples (deep mode's `pot` path) are judged on their "
            "programs run again by today's runner (`ponder.enhance.programs.run_program`: "
            "a last bare expression is printed, as in a notebook); "
            f"{rep.programs_rerun} outputs differ from the recorded ones.",
            "",
        ]
    lines += ["## Calibration", ""]
    lines.append(
        "One fit per model with at least "
        f"{MIN_FIT_PROBLEMS} problems in the fit half (the service picks it by `PONDER_MODEL`) "
        "and one over all models (for the others), each on the fit half (a hash of the "
        "problem key); "
        f"rows of the pooled fit: {calibration.info.get('rows')}. Expected calibration error "
        "(10 bins) on the held-out half — fast: the greedy and one sampled answer alone; "
        "standard: N=3, and N=5 and N=8 with the stop rule; deep: N=5 with the stop rule; "
        f"auto: its default target {AUTO_DEFAULT} (goal <= 0.08):"
    )
    models = list(per_model)
    lines += [
        "",
        "| mode | " + " | ".join(f"{m}: ECE (results)" for m in models) + " | all models "
        "(each its own fit) | verdict (<= 0.10 for every model; auto <= 0.08) |",
        "|---|" + "---:|" * (len(models) + 1) + "---|",
    ]
    for mode, (value, n) in eces.items():
        cells = [f"{per_model[m][mode][0]:.3f} ({per_model[m][mode][1]})" for m in models]
        line = 0.08 if mode == "auto" else 0.10  # the auto issue's goal
        ok = all(per_model[m][mode][0] <= line for m in models)
        lines.append(
            f"| {mode} | " + " | ".join(cells) + f" | {value:.3f} ({n}) | "
            f"{'met' if ok else '**not met**'} |"
        )
    lines += [
        "",
        "Result models: L2 strength and the Laplace cap per mode, chosen by 2-fold "
        "cross-validation inside the fit half (folds by problem; mean ECE of the folds): "
        + "; ".join(
            f"{model}: "
            + ", ".join(
                f"{mode} L2 {c['l2']}, cap {'on' if c['cap'] else 'off'} (CV ECE {c['cv_ece']})"
                for mode, c in choices.items()
            )
            for model, choices in fit_info["result_models"].items()
        )
        + ".",
        "",
        "The greedy sample's confidence on the held-out half, before (the sample model of "
        f"{', '.join(OLD_SAMPLE_FEATURES)}, refitted on the same fit half) and after (the "
        f"features of `SAMPLE_FEATURES`, L2 {fit_info['sample_l2']} by 2-fold "
        "cross-validation): the goal is AUROC >= 0.80 on qwen0.5b.",
        "",
        "| model | AUROC before | AUROC after | ECE before | ECE after |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {model} | {v['before'][0]:.3f} | {v['after'][0]:.3f} | {v['before'][1]:.3f} "
            f"| {v['after'][1]:.3f} |"
            for model, v in fit_info["greedy"].items()
        ),
        "",
        "Auto's targets and the variants (at the default target) on the fit half (accuracy "
        "%, tokens per problem as % of standard N=5's): "
        + "; ".join(
            f"{model}: "
            + ", ".join(f"{t}: {pct(a)} / {100 * c:.0f}" for t, (a, c) in table.items())
            for model, table in fit_info["auto_targets"].items()
        )
        + f". The rule (`fit_auto_target`: the smallest target that gains {100 * AUTO_GAIN:.0f} "
        f"points over standard N=5 on every model) picks {fit_info['auto_target']}; the "
        f"service ships {AUTO_DEFAULT} (`ponder.config.AUTO_TARGET`)"
        + (" — they differ: update AUTO_TARGET" if fit_info["auto_target"] != AUTO_DEFAULT else "")
        + ".",
        "",
        "Vote weights on the fit half (greedy weight / CISC power: correct at N=3,5,8):",
        "",
        ", ".join(f"{k}: {v}" for k, v in fit_info["grid"].items()),
        "",
        "Stop-rule targets on the fit half (N=8; correct with / without the stop rule, "
        "mean samples): "
        + ", ".join(f"{t}: {a}/{b}, {m:.2f}" for t, (a, b, m) in fit_info["targets"].items()),
        "",
        "The same for deep (N=5): "
        + ", ".join(f"{t}: {a}/{b}, {m:.2f}" for t, (a, b, m) in fit_info["deep_targets"].items())
        + f" (the mode's default target: {SETTINGS.mode('deep').target_confidence}).",
        "",
        f"![accuracy and reliability]({png.name})",
        "",
    ]
    out.write_text("\n".join(lines))


# --- main -------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("collect", "peer", "live", "report", "all"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--size", type=int, default=75, help="problems per dataset")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="per sample; default per model (MAX_NEW_TOKENS: what correct answers needed)",
    )
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--deep-temperature", type=float, default=0.4)
    parser.add_argument(
        "--batch-max-size", type=int, default=16, help="PONDER_ENGINE_MAX_ROWS: rows at once"
    )
    parser.add_argument("--engine-threads", type=int, default=1)
    parser.add_argument("--in-flight", type=int, default=3, help="problems run at once")
    parser.add_argument(
        "--redo",
        choices=("standard", "deep"),
        default=None,
        help="collect: run this mode again where a record's run is of an older method "
        "revision (quality_collect.REVISION)",
    )
    parser.add_argument("--peer-limit", type=int, default=100)
    parser.add_argument("--live-limit", type=int, default=20)
    parser.add_argument("--write-calibration", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "quality.md")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    return args


def main() -> None:
    from quality_peer import run_peer

    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    print(f"seed {args.seed}; datasets {args.datasets}; {args.size} problems each", flush=True)
    code = 0
    tokens = args.max_new_tokens
    for model in args.models:
        args.model = model
        args.checkpoint = default_checkpoint(model)
        args.max_new_tokens = tokens or MAX_NEW_TOKENS.get(model, 256)
        if args.step in ("collect", "all"):
            code |= asyncio.run(collect(args))
        if args.step in ("peer", "all"):
            # the verdict is the held-out half's, so the peer runs on held-out problems
            problems = [
                p
                for p in Scorer(args.datasets, args.size, args.seed).problems()
                if half_of(p.key) == 1
            ][: args.peer_limit]
            records = [
                {"key": p.key, "question": p.question, "task_type": p.task_type,
                 "max_new_tokens": args.max_new_tokens}
                for p in problems
            ]  # fmt: skip
            print(asyncio.run(run_peer(args, records, peer_path(model))), flush=True)
        if args.step in ("live", "all"):
            code |= asyncio.run(live(args))
    if args.step in ("report", "all"):
        code |= report(args)
    sys.exit(code)


if __name__ == "__main__":
    main()
