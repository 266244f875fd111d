"""Benchmark: auto mode escalating from SmolLM2 to Qwen, replayed on the landed records.

The replay (``bench/quality_replay.py``) runs the service's own strategy code on the
samples ``bench/quality_collect.py`` recorded for each model
(``bench/results/quality-samples-<model>.jsonl``); the 300 problems both models share are
replayed here, the verdicts on their held-out half (``half_of``: a hash of the problem
key; the shipped calibrations and auto's default target were chosen on the other half,
nothing here is tuned on the held-out half).

Configurations, per problem:

- ``qwen standard``: the service's standard mode on Qwen (greedy + 2, the stop rule at the
  mode's target), and ``qwen standard N=5`` (greedy + 4, no stop: quality.md's reference);
- ``qwen auto`` and ``smollm2 auto``: each model alone in auto mode (its cascade over its
  recorded deep run);
- ``smollm2 -> qwen``: SmolLM2 in auto mode; where its last stage ends below the target
  (:func:`ponder.enhance.escalation.ends_unsure`, the worker's rule) the task continues on
  Qwen, whose own auto cascade answers (SmolLM2's samples do not vote); its cost is both
  models' completion tokens.

Cost: completion tokens per problem of each model, and Qwen-equivalent tokens (SmolLM2's
tokens weighed by the two models' measured engine throughput at 16 rows,
``bench/results/engine.md``: a SmolLM2 token takes ``QWEN_TPS / SMOL_TPS`` of a Qwen
token's engine time on the same CPU).

Run: ``.venv/bin/python bench/escalation.py`` (writes ``bench/results/escalation.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import RESULTS, load_avg
from ponder.enhance.calibration import default_calibration
from ponder.enhance.escalation import ends_unsure
from quality_collect import DATASETS, SEED, Scorer, default_checkpoint, read_records
from quality_replay import SETTINGS, Outcome, Replayer, half_of, mcnemar, rerun_programs, wilson

WEAK, STRONG = "smollm2-135m", "qwen0.5b"
#: completion tokens/s of ponder's engine at 16 rows (bench/results/engine.md, 2026-12-03)
SMOL_TPS, QWEN_TPS = 80.7, 32.1
#: auto's default target (the service's: ponder.config.AUTO_TARGET, chosen on the fit half)
TARGET = SETTINGS.mode("auto").target_confidence
#: targets shown beside the default (information: the verdict is the default's)
TARGETS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass
class Row:
    """One problem under one configuration: right or not, each model's tokens."""

    key: str
    correct: bool
    weak_tokens: int = 0
    strong_tokens: int = 0
    escalated: bool = False

    @property
    def cost(self) -> float:
        """Qwen-equivalent completion tokens."""
        return self.strong_tokens + self.weak_tokens * QWEN_TPS / SMOL_TPS


def as_row(o: Outcome, weak: bool) -> Row:
    return Row(o.key, o.correct, o.tokens if weak else 0, 0 if weak else o.tokens)


def cascade(weak: Outcome, strong: Callable[[], Outcome], target: float) -> Row:
    """SmolLM2's auto outcome, escalated to Qwen's where it ends unsure (the replay has no
    budget and no deadline: its stop reason never blocks the escalation)."""
    unsure = ends_unsure(weak.stage, weak.confidence or 0.0, target, None)
    if not unsure:
        return Row(weak.key, weak.correct, weak.tokens, 0)
    qwen = strong()
    return Row(weak.key, qwen.correct, weak.tokens, qwen.tokens, escalated=True)


def load(model: str, keys: set[str] | None, rerun: bool) -> list[dict[str, Any]]:
    records = read_records(default_checkpoint(model))
    if keys is not None:
        records = [r for r in records if r["key"] in keys]
    if rerun:
        changed = asyncio.run(rerun_programs(records))
        print(f"{model}: {changed} program outputs changed on the rerun", flush=True)
    return records


def replay(args: argparse.Namespace) -> tuple[dict[str, list[Row]], dict[str, Any]]:
    weak_records = load(WEAK, None, args.rerun_programs)
    shared = {r["key"] for r in weak_records}
    strong_records = load(STRONG, shared, args.rerun_programs)
    by_key = {r["key"]: r for r in strong_records}
    weak_records = [r for r in weak_records if r["key"] in by_key]
    differ = sum(r["question"] != by_key[r["key"]]["question"] for r in weak_records)
    if differ:
        raise SystemExit(f"{differ} shared keys have different questions: not one problem set")
    scorer = Scorer(args.datasets.split(","), args.size, args.seed)
    weak = Replayer(weak_records, scorer, default_calibration(WEAK))
    strong = Replayer(strong_records, scorer, default_calibration(STRONG))
    configs: dict[str, list[Row]] = {}
    qwen_auto: dict[float, dict[str, Outcome]] = {}
    for target in TARGETS:
        qwen_auto[target] = {r["key"]: strong.auto(r, target) for r in strong_records}
        smol = [weak.auto(r, target) for r in weak_records]
        qwen = qwen_auto[target]
        configs[f"smollm2 -> qwen @{target}"] = [
            cascade(o, functools.partial(qwen.__getitem__, o.key), target) for o in smol
        ]
        configs[f"qwen auto @{target}"] = [as_row(o, False) for o in qwen_auto[target].values()]
        configs[f"smollm2 auto @{target}"] = [as_row(o, True) for o in smol]
    configs["qwen standard"] = [
        as_row(strong.run(r, "standard", list(range(3)), early_stop=True), False)
        for r in strong_records
    ]
    configs["qwen standard N=5"] = [
        as_row(strong.run(r, "standard", list(range(5))), False) for r in strong_records
    ]
    info = {"problems": len(weak_records), "held_out": sum(half_of(k) for k in shared)}
    return configs, info


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def table(configs: dict[str, list[Row]], names: Sequence[str], half: int | None) -> list[str]:
    lines = [
        "| configuration | accuracy % [95 % CI] | SmolLM2 tokens / problem | Qwen tokens / "
        "problem | Qwen-equivalent tokens / problem | escalated |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        rows = [r for r in configs[name] if half is None or half_of(r.key) == half]
        n, k = len(rows), sum(r.correct for r in rows)
        lo, hi = wilson(k, n)
        esc = sum(r.escalated for r in rows)
        lines.append(
            f"| `{name}` | {pct(k / n)} [{pct(lo)}, {pct(hi)}] "
            f"| {sum(r.weak_tokens for r in rows) / n:.0f} "
            f"| {sum(r.strong_tokens for r in rows) / n:.0f} "
            f"| {sum(r.cost for r in rows) / n:.0f} "
            f"| {f'{esc} ({pct(esc / n)} %)' if 'smollm2 ->' in name else '-'} |"
        )
    return lines


def paired(configs: dict[str, list[Row]], a: str, b: str, half: int) -> str:
    def outcomes(name: str) -> list[Outcome]:
        return [
            Outcome(r.key, "", r.correct, None, 0, 0)
            for r in configs[name]
            if half_of(r.key) == half
        ]

    p = mcnemar(outcomes(a), outcomes(b))
    return f"`{a}` vs `{b}`: {p.a_only} vs {p.b_only} discordant, McNemar p = {p.p_value:.3g}"


def write(out: Path, configs: dict[str, list[Row]], info: dict[str, Any], args: Any) -> None:
    t = TARGET
    main = [
        f"smollm2 -> qwen @{t}",
        f"qwen auto @{t}",
        "qwen standard",
        "qwen standard N=5",
        f"smollm2 auto @{t}",
    ]
    esc = [r for r in configs[f"smollm2 -> qwen @{t}"] if half_of(r.key) == 1]
    alone = [r for r in configs[f"qwen auto @{t}"] if half_of(r.key) == 1]
    acc = [sum(r.correct for r in rows) / len(rows) for rows in (esc, alone)]
    cost = [sum(r.cost for r in rows) / len(rows) for rows in (esc, alone)]
    saved = sum(r.strong_tokens for r in alone) - sum(r.strong_tokens for r in esc)
    kept = [r for r in esc if not r.escalated]
    raised = [r for r in esc if r.escalated]
    weak_held = {r.key: r for r in configs[f"smollm2 auto @{t}"]}
    lines = [
        "# Escalation: SmolLM2 → Qwen in auto mode, replayed",
        "",
        f"Command: `{args.command}`; written {args.date} in {args.seconds:.0f} s. "
        f"`uptime`: {load_avg()}.",
        "",
        f"The {info['problems']} problems both models' quality records share "
        "(`bench/results/quality-samples-{smollm2-135m,qwen0.5b}.jsonl`; the questions "
        "checked equal), replayed by the service's strategy code (`bench/quality_replay.py`) "
        "with each model's shipped calibration (fitted on the fit half). "
        f"Verdicts on the held-out half ({info['held_out']} problems); auto's target is the "
        f"service default {t} (chosen on the fit half by bench/quality.py), and the "
        "escalation rule is the worker's (`ponder.enhance.escalation.ends_unsure`: stage 3 "
        "ended with the calibrated confidence below the target). Nothing was tuned on the "
        "held-out half. Recorded program-of-thought programs were "
        f"{'run again with today' + chr(39) + 's runner' if args.rerun_programs else 'not rerun'}.",
        "",
        "Cost: completion tokens. Qwen-equivalent tokens weigh a SmolLM2 token by the "
        f"engine's measured throughput at 16 rows (SmolLM2 {SMOL_TPS} vs Qwen {QWEN_TPS} "
        "tokens/s, `bench/results/engine.md`, 2026-12-03): one SmolLM2 token "
        f"= {QWEN_TPS / SMOL_TPS:.2f} Qwen token of engine time.",
        "",
        f"## Held-out half ({info['held_out']} problems), target {t}",
        "",
        *table(configs, main, 1),
        "",
        "- " + paired(configs, f"smollm2 -> qwen @{t}", f"qwen auto @{t}", 1),
        "- " + paired(configs, f"smollm2 -> qwen @{t}", "qwen standard", 1),
        f"- SmolLM2 kept its own answer on {len(kept)} of {len(esc)} problems: "
        f"{sum(r.correct for r in kept)} right; the {len(esc) - len(kept)} escalated ones "
        f"were right under SmolLM2 alone on {sum(weak_held[r.key].correct for r in raised)} "
        f"and under the escalation on {sum(r.correct for r in raised)}.",
        "",
        "Reading: on the held-out half the escalation answers "
        f"{pct(acc[0])} % against Qwen alone's {pct(acc[1])} % in auto mode, at "
        f"{cost[0]:.0f} against {cost[1]:.0f} Qwen-equivalent tokens per problem "
        f"({cost[0] / cost[1]:.2f}x). SmolLM2's calibrated confidence stays below the "
        f"target on {pct(1 - len(kept) / len(esc))} % of the problems, so nearly every task "
        f"pays for SmolLM2's cascade and then Qwen's: the Qwen tokens the kept problems save "
        f"({saved / len(esc):.0f} per problem) are fewer than the SmolLM2 tokens spent "
        f"({sum(r.weak_tokens for r in esc) / len(esc) * QWEN_TPS / SMOL_TPS:.0f} "
        "Qwen-equivalent per problem). With these two models escalation does not pay; it "
        "pays where the small model is confident on a large share of the problems (Yue et "
        "al.'s cascade assumes so). The escalated runs here replay Qwen's recorded samples "
        "(the same as Qwen alone's); live, an escalated task's samples draw other seeds "
        "(their indices follow SmolLM2's), so live answers may differ per problem, not in "
        "expectation. Latency is not modelled: an escalated task waits for both cascades.",
        "",
        "## All problems, target " + str(t),
        "",
        *table(configs, main, None),
        "",
        "## By target (held-out half; information only: the service's target is "
        f"{t}, chosen on the fit half)",
        "",
        *table(
            configs,
            [f"{kind} @{x}" for x in TARGETS for kind in ("smollm2 -> qwen", "qwen auto")],
            1,
        ),
        "",
    ]
    out.write_text("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--size", type=int, default=120, help="problems per dataset (Qwen's)")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--no-rerun-programs",
        dest="rerun_programs",
        action="store_false",
        help="judge program-of-thought samples by their recorded output",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "escalation.md")
    args = parser.parse_args(argv)
    started = time.monotonic()
    configs, info = replay(args)
    args.seconds = time.monotonic() - started
    args.date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    args.command = " ".join([".venv/bin/python", "bench/escalation.py", *(argv or sys.argv[1:])])
    write(args.out, configs, info, args)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
