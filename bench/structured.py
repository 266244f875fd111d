"""Benchmark: structured answers, constrained and voted field by field (issue #46).

    python bench/structured.py collect --model smollm2-135m   # resumable; JSONL checkpoint
    python bench/structured.py speed --model smollm2-135m     # tokens/s at 16 rows
    python bench/structured.py report                         # bench/results/structured.md

``collect`` runs each problem (``structured_data``: template extraction texts with
distractors, and the quality benchmark's math asked as JSON) through ponder's worker
runtime over the embedded store, as ``bench/quality.py collect`` does: one ``standard``
task with the problem's ``response_format``, ``SAMPLES`` samples (sample 0 greedy, the
rest at ``TEMPERATURE``), early stopping off — the real strategy's prompt, the engine's
constrained decoding, the sample's parse. Beside it, the task's greedy prompt goes to the
engine once more without the schema (``free``): the schema-valid rate without constraint.
Every sample's text, tokens and finish reason go to the checkpoint; a rerun skips the
problems already there.

``report`` replays the recorded samples through ``ponder.enhance.structured`` (parse,
validate, vote) on the fit and held-out halves (``quality_replay.half_of``, as the quality
benchmark): for greedy, whole-object majority and the per-field vote, the field accuracy
and the whole-object accuracy; the schema-valid rates; tokens per object; McNemar of the
per-field vote against greedy over fields; math asked as JSON against the same problems
asked in prose (the quality benchmark's recorded greedy answers, same model).
``speed`` measures the engine's tokens/s at 16 rows, constrained against unconstrained,
interleaved rounds, one engine thread.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import RESULTS, bounded, load_avg
from quality_collect import (
    SEED as MATH_SEED,
)
from quality_collect import (
    Scorer,
    append_record,
    bench_settings,
    default_checkpoint,
    read_records,
    running_service,
    wait_for,
)
from quality_replay import half_of, mcnemar, wilson
from structured_data import Problem, extraction_set, math_set

SEED = 20261207
EXTRACTION, MATH = 300, 150
SAMPLES, TEMPERATURE = 5, 0.5
MAX_NEW_TOKENS = {"person": 160, "order": 224, "event": 160, "math": 384}
#: 32 tokens: shorter than every object the rows write, so no constrained row ends early
#: and both kinds keep 16 rows running to the end (a fair tokens/s)
SPEED_ROWS, SPEED_ROUNDS, SPEED_TOKENS = 16, 3, 32


def problems(extraction: int = EXTRACTION, maths: int = MATH) -> list[Problem]:
    """Extraction and math interleaved (a partial collection covers both)."""
    ext, mth = extraction_set(extraction, SEED), math_set(maths, MATH_SEED)
    out: list[Problem] = []
    for i in range(max(len(ext), len(mth))):
        out.extend(
            p for p in (ext[i] if i < len(ext) else None, mth[i] if i < len(mth) else None) if p
        )
    return out


def checkpoint(model: str) -> Path:
    return RESULTS / f"structured-samples-{model}.jsonl"


def response_format(problem: Problem) -> dict[str, Any]:
    name = problem.family
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": problem.schema, "strict": True},
    }


# --- collect ----------------------------------------------------------------------------
def problem_task(problem: Problem, seq: int, settings: Any) -> Any:
    """The task of the problem at ``seq`` in the problem list (its place names the task,
    and the task its samples' seeds)."""
    from ponder.admission import build_task
    from ponder.schemas import TaskCreate

    request = TaskCreate.model_validate(
        {
            "prompt": problem.prompt,
            "mode": "standard",
            "samples": SAMPLES,
            "temperature": TEMPERATURE,
            "early_stop": False,
            "max_new_tokens": MAX_NEW_TOKENS[problem.family],
            "response_format": response_format(problem),
        }
    )
    tid = f"{1_700_000_000_000 + SEED % 10**9:013d}-sbench-{seq}"
    return build_task(request, settings, task_id=tid, owner="sbench")


async def collect(args: argparse.Namespace) -> None:
    from ponder.engines.base import SampleRequest
    from ponder.enhance.strategy import create_strategy
    from ponder.store.records import Admission

    path = checkpoint(args.model)
    done = {r["key"] for r in read_records(path)}
    todo = [(n, p) for n, p in enumerate(problems(args.extraction, args.math)) if p.key not in done]
    print(f"{len(done)} recorded, {len(todo)} to run -> {path}", flush=True)
    append_record(
        path.with_suffix(".log"),
        {"start": time.strftime("%F %T UTC", time.gmtime()), "load_start": load_avg()},
    )
    args.batch_max_size, started = 16, time.monotonic()
    async with running_service(args, "sbench-") as (settings, store, runtime):

        async def one(seq: int, problem: Problem) -> dict[str, Any]:
            t0 = time.monotonic()
            task = problem_task(problem, seq, settings)
            await store.create_task(task, Admission(max_pending=settings.max_pending))
            greedy = create_strategy(task, settings).plan()[0]
            free = runtime.engine.submit(
                SampleRequest(
                    messages=create_strategy(task, settings).messages(greedy),
                    temperature=0.0,
                    max_new_tokens=task.max_new_tokens,
                    seed=greedy.seed,
                    task_id=task.id,
                )
            )
            finished, output = await asyncio.gather(wait_for(store, task.id, 6 * 3600), free)
            return {
                "key": problem.key,
                "family": problem.family,
                "model": args.model,
                "status": str(finished.status),
                "wall_s": round(time.monotonic() - t0, 1),
                "samples": [
                    {
                        "index": s.index,
                        "temperature": s.temperature,
                        "text": s.text,
                        "completion_tokens": s.tokens.completion,
                        "finish_reason": s.finish_reason,
                        "mean_logprob": s.mean_logprob,
                        "status": str(s.status),
                    }
                    for s in finished.samples
                ],
                "free": {
                    "text": output.text,
                    "completion_tokens": output.completion_tokens,
                    "finish_reason": output.finish_reason,
                },
            }

        async for record in bounded(
            [functools.partial(one, *item) for item in todo], args.in_flight
        ):
            append_record(path, record)
            print(f"[{time.monotonic() - started:6.0f}s] {record['key']}: "
                  f"{record['wall_s']:.0f}s", flush=True)  # fmt: skip
    append_record(
        path.with_suffix(".log"),
        {"end": time.strftime("%F %T UTC", time.gmtime()), "load_end": load_avg()},
    )


# --- speed ------------------------------------------------------------------------------
async def speed(args: argparse.Namespace) -> dict[str, Any]:
    """Tokens/s of the engine at ``SPEED_ROWS`` rows at once, with and without the
    schema, in interleaved rounds; every row generates exactly ``SPEED_TOKENS`` tokens
    where it can (the same prompts, greedy)."""
    import tempfile

    from ponder.engines import create_engine
    from ponder.engines.base import SampleRequest

    settings = bench_settings(Path(tempfile.mkdtemp()), args.model, SPEED_ROWS, 1)
    engine = create_engine(settings)
    rows = extraction_set(SPEED_ROWS, SEED + 1)
    figures: dict[str, list[float]] = {"constrained": [], "free": []}
    per_row: dict[str, list[float]] = {"constrained": [], "free": []}
    await engine.start()
    try:
        for rnd in range(-1, SPEED_ROUNDS):  # round -1 warms up (the grammars compile)
            order = ("constrained", "free") if rnd % 2 == 0 else ("free", "constrained")
            for kind in order:
                t0 = time.monotonic()
                outs = await asyncio.gather(
                    *(
                        engine.submit(
                            SampleRequest(
                                messages=[
                                    {"role": "user", "content": p.prompt + "\nAnswer in JSON."}
                                ],
                                max_new_tokens=SPEED_TOKENS,
                                task_id=f"speed-{rnd}-{kind}-{i}",
                                json_schema=p.schema if kind == "constrained" else None,
                                strict=kind == "constrained",
                            )
                        )
                        for i, p in enumerate(rows)
                    )
                )
                tokens = sum(o.completion_tokens for o in outs)
                rate = tokens / (time.monotonic() - t0)
                print(f"round {rnd + 1} {kind}: {rate:.1f} tokens/s, "
                      f"{tokens / len(outs):.1f} tokens a row", flush=True)  # fmt: skip
                if rnd >= 0:
                    figures[kind].append(rate)
                    per_row[kind].append(tokens / len(outs))
    finally:
        await engine.close()
    result = {"model": args.model, "rows": SPEED_ROWS, "rounds": SPEED_ROUNDS,
              "load": load_avg(), "at": time.strftime("%F %T UTC", time.gmtime()),
              "tokens_per_row": per_row, **figures}  # fmt: skip
    append_record(RESULTS / "structured-speed.jsonl", result)
    return result


# --- scoring ----------------------------------------------------------------------------
def _norm(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.casefold().strip().rstrip(".").split())
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return round(float(value), 2)
    if isinstance(value, list):
        return sorted(json.dumps(_norm(v), sort_keys=True) for v in value)
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    return value


def math_scorer() -> Scorer:
    """reasoning-gym's scorer of the math problems (the quality benchmark's seed)."""
    per_dataset = math.ceil(MATH / 3)
    return Scorer(("gsm_symbolic", "basic_arithmetic", "chain_sum"), per_dataset, MATH_SEED)


def field_scores(problem: Problem, obj: dict[str, Any] | None, scorer: Scorer | None) -> list[bool]:
    """Whether each scored field of ``obj`` is right (every field wrong without one): the
    extraction families' top-level properties (a list compared as a whole, its order
    aside), math's ``answer`` by reasoning-gym's own scorer."""
    if problem.family == "math":
        if scorer is None or obj is None or not isinstance(obj.get("answer"), int | float):
            return [False]
        dataset, index = problem.key.split("/")
        answer = obj["answer"]
        text = str(int(answer)) if float(answer).is_integer() else str(answer)
        return [scorer.score(dataset, int(index), text) >= 1.0]
    return [obj is not None and _norm(obj.get(k)) == _norm(v) for k, v in problem.gold.items()]


def replayed(record: dict[str, Any], problem: Problem, seq: int, settings: Any) -> Any:
    """The record's samples judged again by the service's strategy for the problem's task
    (parse, validate, the shipped calibration): (strategy, samples)."""
    from ponder.enhance.strategy import create_strategy
    from ponder.types import Sample, SampleStatus, Tokens

    strategy: Any = create_strategy(problem_task(problem, seq, settings), settings)
    samples = []
    for r in record["samples"]:
        sample = Sample(
            index=r["index"],
            temperature=r["temperature"],
            seed=0,
            status=SampleStatus.done,
            text=r["text"] or "",
            tokens=Tokens(completion=r["completion_tokens"]),
            finish_reason=r["finish_reason"],
            mean_logprob=r.get("mean_logprob"),
        )
        strategy.rejudge(sample)
        samples.append(sample)
    return strategy, samples


def methods(strategy: Any, samples: Sequence[Any]) -> dict[str, Any]:
    """The object each method answers with, from the recorded constrained samples: the
    greedy sample's, the plurality of whole objects (the earliest of a tie), and the
    service's per-field vote (its weights: the greedy weight, the samples' confidences)."""
    valid = [s for s in samples if s.object is not None]
    majority = None
    if valid:
        counts = Counter(s.answer for s in valid)
        best = max(counts.values())
        majority = next(s.object for s in valid if counts[s.answer] == best)
    voted = strategy.vote(valid, finished=len(samples)).object if valid else None
    return {"greedy": samples[0].object if samples else None, "majority": majority,
            "fields": voted}  # fmt: skip


# --- per-field confidence ---------------------------------------------------------------
KINDS = ("number", "string", "exact", "whole", "members", "presence")
#: a model's own fields' model needs this many fit-half fields, else it uses the pooled one
MIN_FIT_FIELDS = 300


def scored_fields(
    strategy: Any, samples: Sequence[Any], problem: Problem, scorer: Scorer
) -> list[dict[str, Any]]:
    """Each scored field of the problem's per-field vote: its features, its confidence as
    shipped, whether it is right, its half. Scored: the extraction families' top-level
    fields but lists, math's ``answer``."""
    voters = [s for s in samples if s.object is not None]
    if not voters:
        return []
    vote = strategy.vote(voters, finished=len(samples))
    out = []
    for path, leaf in vote.leaves.items():
        if path not in problem.gold or isinstance(problem.gold[path], list):
            continue
        if problem.family == "math":
            right = field_scores(problem, {path: leaf.value}, scorer)[0]
        else:
            right = _norm(leaf.value) == _norm(problem.gold[path])
        out.append({"key": problem.key, "half": half_of(problem.key), "kind": leaf.kind,
                    "features": strategy.field_features(leaf, voters, len(samples)),
                    "shipped": vote.fields[path].confidence, "right": right})  # fmt: skip
    return out


def fit_fields(rows: Sequence[dict[str, Any]]) -> Any:
    """The fields' model, fitted on the fit half's fields."""
    from ponder.enhance.calibration import RESULT_FEATURES
    from quality_replay import fit_logistic

    names = [*RESULT_FEATURES, *(f"kind_{k}" for k in KINDS)]
    fit = [(r["features"], r["right"]) for r in rows if r["half"] == 0]
    return dataclasses.replace(fit_logistic(fit, names), cap=False)


def calibration_lines(model: str, rows: Sequence[dict[str, Any]], fitted: Any) -> list[str]:
    from quality import auroc
    from quality_replay import ece

    held = [r for r in rows if r["half"] == 1]
    if not held:
        return []
    before = [(r["shipped"], r["right"]) for r in held]
    after = [(fitted.predict(r["features"]), r["right"]) for r in held]
    return [
        f"Per-field confidence, {model}, held-out fields ({len(held)}; "
        f"{sum(r['right'] for r in held)} right): the shipped prose calibration ECE "
        f"{ece(before)[0]:.3f}, AUROC {auroc(before):.3f}; the fields' model fitted on the fit "
        f"half ({sum(r['half'] == 0 for r in rows)} fields) ECE {ece(after)[0]:.3f}, AUROC "
        f"{auroc(after):.3f}.",
        "",
    ]


def write_fields_calibration(fitted: dict[str, Any], pooled: Any) -> None:
    from quality import CALIBRATION_PATH

    data = json.loads(CALIBRATION_PATH.read_text())
    data["default"]["fields"] = pooled.to_json()
    for model, (fields, fit_count) in fitted.items():
        # too few fields fit a model poorly: that model borrows the pooled one
        if model in data["models"] and fit_count >= MIN_FIT_FIELDS:
            data["models"][model]["fields"] = fields.to_json()
        elif model in data["models"]:
            data["models"][model].pop("fields", None)
    CALIBRATION_PATH.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote the fields' models into {CALIBRATION_PATH}", flush=True)


# --- report -----------------------------------------------------------------------------
METHODS = ("greedy", "majority", "fields")


def replay(model: str) -> dict[str, Any]:
    """Per record: validity, the tokens, each method's field scores; and every scored
    field of the per-field votes (:func:`scored_fields`)."""
    from ponder.config import load_settings
    from ponder.enhance.structured import parse_sample

    settings = load_settings(engine="scripted", model=model, redis_url=None)
    scorer = math_scorer()
    order = {p.key: (n, p) for n, p in enumerate(problems())}
    rows: list[dict[str, Any]] = []
    fields: list[dict[str, Any]] = []
    for record in read_records(checkpoint(model)):
        if record["key"] not in order:
            continue
        seq, problem = order[record["key"]]
        strategy, samples = replayed(record, problem, seq, settings)
        chosen = methods(strategy, samples)
        free = parse_sample(record["free"]["text"] or "", problem.schema)[0]
        rows.append({
            "key": problem.key, "family": problem.family, "half": half_of(problem.key),
            "valid": [s.object is not None for s in samples], "free_valid": free is not None,
            "tokens": [s.tokens.completion for s in samples],
            "free_tokens": record["free"]["completion_tokens"],
            "scores": {m: field_scores(problem, o, scorer) for m, o in chosen.items()},
            "free_scores": field_scores(problem, free, scorer),
        })  # fmt: skip
        fields += scored_fields(strategy, samples, problem, scorer)
    return {"model": model, "rows": rows, "fields": fields}


def _pct(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.1f} % [{100 * lo:.0f}-{100 * hi:.0f}] ({k}/{n})" if n else "—"


class _Pair:
    """One field under one method, as ``quality_replay.mcnemar`` pairs them."""

    def __init__(self, key: str, correct: bool) -> None:
        self.key, self.correct = key, correct


def _mcnemar(rows: Sequence[dict[str, Any]], a: str, b: str) -> Any:
    pairs = [
        (f"{r['key']}#{i}", x, y)
        for r in rows
        for i, (x, y) in enumerate(zip(r["scores"][a], r["scores"][b], strict=True))
    ]
    return mcnemar([_Pair(k, x) for k, x, _ in pairs], [_Pair(k, y) for k, _, y in pairs])


def model_section(data: dict[str, Any], prose: dict[str, bool]) -> list[str]:
    lines = [f"## {data['model']}", ""]
    for half, name in ((1, "held-out half"), (0, "fit half")):
        rows = [r for r in data["rows"] if r["half"] == half]
        if not rows:
            continue
        valid = [v for r in rows for v in r["valid"]]
        greedy_valid = [r["valid"][0] for r in rows if r["valid"]]
        lines += [
            f"### {name}: {len(rows)} problems "
            f"({sum(r['family'] != 'math' for r in rows)} extraction, "
            f"{sum(r['family'] == 'math' for r in rows)} math)",
            "",
            f"Schema-valid: constrained, every sample {_pct(sum(valid), len(valid))}; "
            f"constrained greedy {_pct(sum(greedy_valid), len(greedy_valid))}; "
            f"the same greedy prompt without constraint "
            f"{_pct(sum(r['free_valid'] for r in rows), len(rows))}.",
            "",
            "| family | method | field accuracy | whole-object accuracy |",
            "|---|---|---:|---:|",
        ]
        for family in ("extraction", "math"):
            part = [r for r in rows if (r["family"] == "math") == (family == "math")]
            for method in (*METHODS, "free"):
                key = (
                    (lambda r: r["free_scores"])
                    if method == "free"
                    else (lambda r, m=method: r["scores"][m])
                )
                fields = [f for r in part for f in key(r)]
                whole = [all(key(r)) for r in part]
                label = "greedy, unconstrained" if method == "free" else method
                lines.append(
                    f"| {family} | {label} | {_pct(sum(fields), len(fields))} | "
                    f"{_pct(sum(whole), len(whole))} |"
                )
        test, vs_maj = _mcnemar(rows, "fields", "greedy"), _mcnemar(rows, "fields", "majority")
        tokens = [t for r in rows for t in r["tokens"]]
        lines += [
            "",
            f"Per-field vote against greedy, over fields (McNemar): "
            f"{test.a_only} fields only the vote got right, {test.b_only} only greedy, "
            f"p = {test.p_value:.3g}. Against whole-object majority: {vs_maj.a_only} "
            f"vs {vs_maj.b_only}, p = {vs_maj.p_value:.3g}. Tokens per object "
            f"(constrained samples): {sum(tokens) / max(1, len(tokens)):.0f}; "
            f"unconstrained greedy: "
            f"{sum(r['free_tokens'] for r in rows) / len(rows):.0f}.",
            "",
        ]
        math_rows = [r for r in rows if r["family"] == "math" and r["key"] in prose]
        if math_rows:
            as_json = sum(r["scores"]["greedy"][0] for r in math_rows)
            in_prose = sum(prose[r["key"]] for r in math_rows)
            lines += [
                f"Math, greedy: asked as JSON {_pct(as_json, len(math_rows))}, the same "
                f"problems asked in prose (the quality benchmark's records) "
                f"{_pct(in_prose, len(math_rows))}.",
                "",
            ]
    return lines


def prose_greedy(model: str) -> dict[str, bool]:
    """The quality benchmark's greedy prose answer of each math problem: right or not."""
    scorer = math_scorer()
    out = {}
    for record in read_records(default_checkpoint(model)):
        if record.get("dataset") in scorer.sets and record["index"] < math.ceil(MATH / 3):
            answer = record["runs"]["standard"]["samples"][0]["answer"]
            out[record["key"]] = scorer.score(record["dataset"], record["index"], answer) >= 1.0
    return out


def report(args: argparse.Namespace) -> None:
    lines = [
        "# Structured answers: constrained decoding and the per-field vote (issue #46)",
        "",
        f"Command: `python bench/structured.py report`; {time.strftime('%F %T UTC')}; "
        f"load: {load_avg()}.",
        "",
    ]
    fitted, all_rows = {}, []
    for model in args.models:
        data = replay(model)
        if data["rows"]:
            lines += model_section(data, prose_greedy(model))
            model_fit = fit_fields(data["fields"])
            fitted[model] = (model_fit, sum(r["half"] == 0 for r in data["fields"]))
            lines += calibration_lines(model, data["fields"], model_fit)
            all_rows += data["fields"]
    if args.write_calibration and fitted:
        write_fields_calibration(fitted, fit_fields(all_rows))
    speeds = read_records(RESULTS / "structured-speed.jsonl")
    for s in speeds:
        c, f = s["constrained"], s["free"]
        rows = {k: sum(v) / len(v) for k, v in s.get("tokens_per_row", {}).items()}
        lines.append(
            f"Speed, {s['model']}, {s['rows']} rows, one engine thread ({s['at']}, {s['load']}): "
            f"constrained {sum(c) / len(c):.1f} tokens/s, unconstrained {sum(f) / len(f):.1f} "
            f"(rounds {', '.join(f'{x:.1f}' for x in c)} vs {', '.join(f'{x:.1f}' for x in f)}; "
            f"tokens a row {rows.get('constrained', 0):.1f} vs {rows.get('free', 0):.1f}: "
            "comparable only where both are the cap, every row running to the end); ratio "
            f"{sum(c) / sum(f):.2f}."
        )
    out = RESULTS / "structured.md"
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--model", default="smollm2-135m")
    c.add_argument("--extraction", type=int, default=EXTRACTION)
    c.add_argument("--math", type=int, default=MATH)
    c.add_argument("--engine-threads", type=int, default=2)
    c.add_argument("--in-flight", type=int, default=4, help="problems at once")
    s = sub.add_parser("speed")
    s.add_argument("--model", default="smollm2-135m")
    r = sub.add_parser("report")
    r.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen0.5b"])
    r.add_argument(
        "--write-calibration",
        action="store_true",
        help="write the fields' models fitted on the fit half into calibration.json",
    )
    args = p.parse_args(argv)
    run = {
        "collect": lambda: asyncio.run(collect(args)),
        "speed": lambda: asyncio.run(speed(args)),
        "report": lambda: report(args),
    }
    run[args.command]()


if __name__ == "__main__":
    sys.exit(main())
