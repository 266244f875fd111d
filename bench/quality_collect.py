"""Sample once: run every problem through ponder's worker runtime and record the samples
(``bench/quality.py collect`` runs it).

For each problem two tasks run through the real service code (``WorkerRuntime`` over the
embedded SQLite store: the strategy's prompts and plan, the batcher, the openvino
engine, the judging): a ``standard`` task of ``STANDARD_SAMPLES`` samples (sample 0 is
greedy, the rest at ``--temperature``) and a ``deep`` task of ``DEEP_SAMPLES`` samples
over its reasoning paths, both with early stopping off. Each problem's record (every
sample's text, extracted answer, mean token log-probability, tokens, finish reason, seed,
temperature, path and order) is appended to a JSONL checkpoint as soon as both tasks end;
a rerun skips the problems already there, so an interrupted collection resumes.

Task ids are chosen by this script (from ``--seed``), and each sample's seed derives
from its task id and index (``ponder.enhance.strategy.sample_seed``): a live task with
the same id draws the same samples, which is how ``quality.py live`` checks the replay.
"""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import RESULTS, bounded, load_avg

DATASETS = (
    "gsm_symbolic", "basic_arithmetic", "chain_sum", "family_relationships", "arithmetic_choice",
)  # fmt: skip
TASK_TYPES = {"family_relationships": "text", "arithmetic_choice": "choice"}
SEED = 20261202
SEED_STRIDE = 1_000_003
#: standard: greedy + 8 sampled; replays of N = 1..9 take prefixes of this list
STANDARD_SAMPLES = 9
DEEP_SAMPLES = 5
#: the method revision of each mode's run; ``collect --redo MODE`` runs that mode again
#: for every record whose run is older. deep 2 (2026-12-03): paths cot, pot, decompose
#: (was cot, decompose, pot) and the program-of-thought instruction repeated after the
#: question (``AnswerType.reminder_for``)
REVISION = {"standard": 1, "deep": 2}
TEMPERATURE = 0.5
DEEP_TEMPERATURE = 0.4
#: ``easy``: small arithmetic, fixed before any scored run, so that a 135M model is
#: neither at 0 % nor at 100 % (MODELS.md: 3/8 two-number sums right); the other
#: datasets use reasoning-gym's defaults
EASY: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {
        "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
        "operators": ("+", "-", "*"), "allow_parentheses": False, "allow_negation": False,
    },
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
}  # fmt: skip
#: a shared 2-core CPU: one batch may take minutes, so the limits only catch a hang
SAMPLE_TIMEOUT_S = 6 * 3600
TASK_TIMEOUT_S = 12 * 3600


@dataclass(frozen=True)
class Problem:
    dataset: str
    index: int
    question: str
    expected: str
    task_type: str

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.index}"


class ArithmeticChoice:
    """A multiple-choice set built offline: reasoning-gym ``basic_arithmetic`` problems
    (two or three terms, up to two digits), each with its answer and three distractors
    near it (off by one, by ten, the sign or digits swapped) as options A-D in a shuffled
    order; the expected answer is the letter. Scored by the letter alone."""

    def __init__(self, size: int, seed: int) -> None:
        import random

        import reasoning_gym

        source = reasoning_gym.create_dataset(
            "basic_arithmetic", size=size, seed=seed, min_terms=2, max_terms=3,
            min_digits=1, max_digits=2, operators=("+", "-", "*"), allow_parentheses=False,
            allow_negation=False,
        )  # fmt: skip
        self.entries: list[dict[str, Any]] = []
        for i, entry in enumerate(source):
            rng = random.Random(seed * 7919 + i)
            answer = int(entry["answer"])
            swapped = int(str(abs(answer))[::-1]) * (1 if answer >= 0 else -1)
            near = [answer + 1, answer - 1, answer + 10, answer - 10, -answer, swapped, 2 * answer]
            distractors = rng.sample(sorted({n for n in near if n != answer}), 3)
            options = [answer, *distractors]
            rng.shuffle(options)
            letter = "ABCD"[options.index(answer)]
            lines = "\n".join(f"{'ABCD'[k]}) {n}" for k, n in enumerate(options))
            question = entry["question"].split("\n")[0].rstrip()
            self.entries.append({
                "question": f"{question}\n{lines}\nAnswer with the letter of the correct option.",
                "answer": letter,
            })  # fmt: skip

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.entries[index]

    def score_answer(self, answer: str, entry: dict[str, Any]) -> float:
        return 1.0 if answer.strip().upper() == entry["answer"] else 0.0


class Scorer:
    """reasoning-gym's own ``score_answer`` for each dataset (the entries regenerated from
    the seed, so records need not carry them)."""

    def __init__(self, datasets: Sequence[str], size: int, seed: int) -> None:
        import reasoning_gym

        self.sets: dict[str, Any] = {
            name: ArithmeticChoice(size, seed + SEED_STRIDE * k)
            if name == "arithmetic_choice"
            else reasoning_gym.create_dataset(
                name, size=size, seed=seed + SEED_STRIDE * k, **EASY.get(name, {})
            )
            for k, name in enumerate(datasets)
        }

    def problems(self) -> list[Problem]:
        """Interleaved across datasets, so that a partial collection covers all evenly."""
        size = min(len(ds) for ds in self.sets.values())
        return [
            Problem(
                name,
                i,
                ds[i]["question"],
                str(ds[i]["answer"]),
                TASK_TYPES.get(name, "math"),
            )
            for i in range(size)
            for name, ds in self.sets.items()
        ]

    def score(self, dataset: str, index: int, answer: str | None) -> float:
        if answer is None:
            return 0.0
        ds = self.sets[dataset]
        try:
            return float(ds.score_answer(answer.strip(), ds[index]))
        except Exception:  # a scorer must never stop the benchmark
            return 0.0


def task_id(seed: int, seq: int) -> str:
    """A task id of this benchmark: the same seed and sequence give the same samples."""
    return f"{1_700_000_000_000 + seed % 10**9:013d}-qbench-{seq}"


def problem_ids(seed: int, position: int) -> tuple[str, str]:
    """The (standard, deep) task ids of the problem at ``position`` of the problem list."""
    return task_id(seed, 2 * position), task_id(seed, 2 * position + 1)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a file; of a checkpoint's records (they have a ``key``), the last
    one of each problem (a redo appends a new record). A torn line (a killed run) is
    ignored."""
    records: dict[Any, dict[str, Any]] = {}
    if not path.exists():
        return []
    for n, line in enumerate(path.read_text().splitlines()):
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            records[record.get("key", n)] = record
    return list(records.values())


def compact(path: Path) -> None:
    """Rewrite the checkpoint with one record per problem (after a redo), atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in read_records(path)))
    tmp.replace(path)


def revision(record: dict[str, Any], mode: str) -> int:
    """The method revision of a record's run of ``mode`` (records before revisions: 1)."""
    return int(record["runs"][mode].get("revision", 1))


def append_record(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")


def bench_settings(workdir: Path, model: str, batch: int, threads: int) -> Any:
    from ponder.config import load_settings

    limits = {
        "sample_timeout_s": SAMPLE_TIMEOUT_S,
        "task_timeout_s": TASK_TIMEOUT_S,
        "max_timeout_s": TASK_TIMEOUT_S,
    }
    return load_settings(
        engine="openvino",
        model=model,
        redis_url=None,
        sqlite_path=str(workdir / "collect.db"),
        node_id="qbench",
        engine_threads=threads,
        engine_max_rows=batch,
        worker_max_tasks=256,
        max_pending=100_000,
        modes={
            "fast": limits,
            "standard": {**limits, "max_samples": STANDARD_SAMPLES},
            "deep": {**limits, "max_samples": max(12, DEEP_SAMPLES)},
        },
    )


async def wait_for(store: Any, tid: str, timeout_s: float) -> Any:
    """Follow the task's event log until its terminal event; the stored task."""
    after: str | None = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in await store.read_events(tid, after, block_ms=5000):
            after = event.id
            if event.event == "result":
                return await store.get_task(tid)
    raise TimeoutError(f"task {tid} did not end within {timeout_s:.0f}s")


def sample_record(sample: Any) -> dict[str, Any]:
    keep = ("index", "path", "temperature", "seed", "status", "text", "answer", "confidence",
            "finish_reason", "mean_logprob", "latency_ms", "program_output")  # fmt: skip
    out = {k: getattr(sample, k) for k in keep}
    out["status"] = str(out["status"])
    out["completion_tokens"] = sample.tokens.completion
    out["prompt_tokens"] = sample.tokens.prompt
    token_logprobs = getattr(sample, "token_logprobs", None)
    if token_logprobs is not None:
        out["token_logprobs"] = token_logprobs
    return out


async def collect(args: Any) -> int:
    """Run the missing problems of the checkpoint; append one record per problem."""
    scorer = Scorer(args.datasets, args.size, args.seed)
    problems = scorer.problems()
    checkpoint: Path = args.checkpoint
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    done = {r["key"]: r for r in read_records(checkpoint)}
    redo = args.redo
    todo = [
        (pos, p, done.get(p.key))
        for pos, p in enumerate(problems)
        if p.key not in done or (redo and revision(done[p.key], redo) < REVISION[redo])
    ]
    print(
        f"{args.model}: {len(problems)} problems (seed {args.seed}), {len(done)} in "
        f"{checkpoint}, {len(todo)} to run{f' (redo: {redo})' if redo else ''}; {load_avg()}",
        flush=True,
    )
    if not todo:
        compact(checkpoint)
        return 0
    started = time.monotonic()
    async with running_service(args, "ponder-quality-") as (settings, store, _runtime):
        print(f"engine ready in {time.monotonic() - started:.0f}s", flush=True)
        await _collect(args, settings, store, todo, checkpoint, started)
    compact(checkpoint)
    return 0


@contextlib.asynccontextmanager
async def running_service(args: Any, prefix: str) -> AsyncIterator[tuple[Any, Any, Any]]:
    """The worker runtime over an embedded store in a fresh directory: (settings, store,
    runtime)."""
    from ponder.runtime import WorkerRuntime
    from ponder.store import create_store

    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    settings = bench_settings(workdir, args.model, args.batch_max_size, args.engine_threads)
    store = create_store(settings)
    await store.start()
    runtime = WorkerRuntime(settings, store, workers=1)
    try:
        await runtime.start()
        yield settings, store, runtime
    finally:
        await runtime.stop()
        await store.close()


async def _collect(
    args: Any,
    settings: Any,
    store: Any,
    todo: list[tuple[int, Problem, dict[str, Any] | None]],
    checkpoint: Path,
    started: float,
) -> None:
    from ponder.admission import build_task
    from ponder.schemas import TaskCreate
    from ponder.store.records import Admission

    log_path = checkpoint.with_suffix(".log")
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    append_record(
        log_path,
        {"start": start, "load_start": load_avg(), **({"redo": args.redo} if args.redo else {})},
    )
    problems_done = 0

    async def one(pos: int, problem: Problem, old: dict[str, Any] | None) -> dict[str, Any]:
        """The problem's record; with ``old`` (a redo), only the runs of an older revision
        run again."""
        t0 = time.monotonic()
        ids = problem_ids(args.seed, pos)
        runs: dict[str, Any] = dict(old["runs"]) if old else {}
        specs = tuple(
            spec
            for spec in (
                ("standard", ids[0], STANDARD_SAMPLES, args.temperature),
                ("deep", ids[1], DEEP_SAMPLES, args.deep_temperature),
            )
            if old is None or revision(old, spec[0]) < REVISION[spec[0]]
        )
        for mode, tid, n, temperature in specs:
            request = TaskCreate(
                prompt=problem.question,
                mode=mode,  # type: ignore[arg-type]
                task_type=problem.task_type,  # type: ignore[arg-type]
                samples=n,
                temperature=temperature,
                max_new_tokens=args.max_new_tokens,
                early_stop=False,
            )
            task = build_task(request, settings, task_id=tid, owner="qbench")
            await store.create_task(task, Admission(max_pending=settings.max_pending))
        for mode, tid, _n, temperature in specs:
            task = await wait_for(store, tid, TASK_TIMEOUT_S + 600)
            runs[mode] = {
                "task_id": tid,
                "status": str(task.status),
                "task_type": str(task.task_type),
                "temperature": temperature,
                "revision": REVISION[mode],
                "samples": [sample_record(s) for s in task.samples],
                "answer": task.result.answer if task.result else None,
            }
        return {
            "key": problem.key,
            "position": pos,
            "dataset": problem.dataset,
            "index": problem.index,
            "question": problem.question,
            "expected": problem.expected,
            "task_type": problem.task_type,
            "model": args.model,
            "seed": args.seed,
            "max_new_tokens": args.max_new_tokens,
            "wall_s": round(time.monotonic() - t0, 1),
            "runs": runs,
        }

    try:
        jobs = [functools.partial(one, *item) for item in todo]
        async for record in bounded(jobs, args.in_flight):
            append_record(checkpoint, record)
            problems_done += 1
            std = record["runs"]["standard"]["samples"]
            greedy = std[0]["answer"]
            print(
                f"[{time.monotonic() - started:6.0f}s] {record['key']}: expected "
                f"{record['expected']!r}, greedy {greedy!r}, {record['wall_s']:.0f}s",
                flush=True,
            )
    finally:
        end = {"start": start, "end": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "wall_s": round(time.monotonic() - started, 1), "problems": problems_done,
               "load_end": load_avg()}  # fmt: skip
        append_record(log_path, end)


def default_checkpoint(model: str) -> Path:
    return RESULTS / f"quality-samples-{model}.jsonl"
