"""Benchmark: auto against standard, live, through ``ponder serve`` on the default engine.

``make bench-auto`` (or ``python bench/auto_live.py``) starts ``ponder serve`` (OpenVINO
GenAI, Qwen2.5-Coder-0.5B, one engine thread, embedded store) and runs problems of a
reasoning-gym seed that no collection used (:data:`SEED`), auto and standard N=5
interleaved by windows: ``--window`` problems submitted at once in one mode, then the same
problems in the other, the order alternating window by window, with the same settings
(``max_new_tokens``, time limits) and each mode's defaults otherwise. A mode's wall time
is the sum of its windows (first submit → last task's end); each task is followed over
SSE, its time to first answer being submit → its first ``preliminary`` or ``result``
event.

The check against the replay: every live auto task's samples are judged again offline
(``Strategy.rejudge``: the recorded texts and program outputs) and its decisions replayed
(``Strategy.stop`` after stage 1, after stage 2, then the vote): the live stage and answer
must be the replay's. Results: ``bench/results/auto-live.jsonl`` (one line per task, with
its samples; an interrupted run resumes) and ``bench/results/auto-live.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import RESULTS, ROOT, free_port, load_avg, percentile, wait_ready
from ponder.client import AsyncClient
from ponder.enhance.strategy import create_strategy
from ponder.types import Sample, SampleStatus, Task
from quality_collect import DATASETS, Scorer
from quality_replay import SETTINGS, mcnemar, wilson

#: a reasoning-gym seed no collection used (the quality records are of 20261202)
SEED = 20261207
MODEL = "qwen0.5b"
MAX_NEW_TOKENS = 512
#: the engine's batch (rows at once), as the quality collection's
BATCH = 16
OUT = RESULTS / "auto-live.jsonl"
REPORT = RESULTS / "auto-live.md"
#: generous limits, the same for both modes: one engine thread on a shared 2-core machine
LIMITS = {"SAMPLE_TIMEOUT_S": 600, "TASK_TIMEOUT_S": 1800, "MAX_TIMEOUT_S": 1800}


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The task lines written so far (a torn last line, of a killed run, is skipped)."""
    lines = []
    for text in path.read_text().splitlines() if path.exists() else []:
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines


def serve(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PONDER_ENGINE": "openvino",
        "PONDER_MODEL": MODEL,
        "PONDER_ENGINE_THREADS": "1",
        "PONDER_ENGINE_MAX_ROWS": str(BATCH),
        "PONDER_REDIS_URL": "",
        "PONDER_SQLITE_PATH": str(workdir / "live.db"),
        "PONDER_PORT": str(port),
        "HF_HUB_OFFLINE": "1",
    }
    for mode in ("STANDARD", "AUTO"):
        env.update({f"PONDER_MODES__{mode}__{k}": str(v) for k, v in LIMITS.items()})
    log = (workdir / "serve.log").open("wb")
    ponder = Path(sys.executable).with_name("ponder")
    return subprocess.Popen(
        [str(ponder), "serve", "--port", str(port)], env=env, stdout=log, stderr=log
    )


async def run_task(client: AsyncClient, problem: Any, mode: str) -> dict[str, Any]:
    """One task, followed over SSE until it ends: its figures and samples."""
    started = time.monotonic()
    task = await client.submit(
        problem.question,
        mode=mode,
        task_type=problem.task_type,
        max_new_tokens=MAX_NEW_TOKENS,
        samples=5 if mode == "standard" else None,
    )
    first: float | None = None
    async for event in client.events(task.id, deltas=False, timeout=3600):
        if first is None and event.event in ("preliminary", "result"):
            first = time.monotonic() - started
    wall = time.monotonic() - started
    ended = await client.get(task.id)
    result = ended.result
    return {
        "key": problem.key,
        "dataset": problem.dataset,
        "index": problem.index,
        "mode": mode,
        "task": ended.to_public(),
        "answer": result.answer if result else None,
        "wall_s": round(wall, 2),
        "first_answer_s": round(first if first is not None else wall, 2),
        "completion_tokens": ended.usage.completion_tokens,
        "samples_used": ended.samples_used,
        "stage": result.stage if result else None,
    }


def replay_matches(line: dict[str, Any]) -> bool:
    """Whether the replay of a live auto task decides as it did: the same samples judged
    again give the same stage (stop after stage 1, after stage 2, else stage 3) and the
    same answer."""
    task = Task.model_validate(line["task"])
    strategy = create_strategy(task, SETTINGS.model_copy(update={"model": MODEL}))
    samples = [s.model_copy() for s in task.samples]
    ran = [s for s in samples if s.status != SampleStatus.skipped]
    for s in ran:
        if s.status == SampleStatus.done:
            strategy.rejudge(s)
    stage = 3
    for k in (1, 2):
        if len(ran) < k:
            break
        view: list[Sample] = [
            s if s.index < k else s.model_copy(update={"status": SampleStatus.queued})
            for s in samples
        ]
        if strategy.stop(view).stop:
            stage = k
            break
    fusion = strategy.fuse(ran)
    answer = fusion.result.answer if fusion else None
    return stage == (task.result.stage if task.result else None) and answer == line["answer"]


def write_report(lines: list[dict[str, Any]], scorer: Scorer, args: argparse.Namespace) -> str:
    by_mode: dict[str, dict[str, dict[str, Any]]] = {"auto": {}, "standard": {}}
    for line in lines:
        by_mode[line["mode"]][line["key"]] = line
    keys = [k for k in by_mode["auto"] if k in by_mode["standard"]]
    out = [
        "# Auto against standard, live",
        "",
        f"Command: `.venv/bin/python bench/auto_live.py --limit {args.limit} --window "
        f"{args.window}`; written "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; `uptime` at the end: "
        f"{load_avg()}. `ponder serve` on the default engine (OpenVINO GenAI) with {MODEL}, "
        f"one engine thread, embedded store; reasoning-gym seed {SEED} (not used by any "
        f"collection), {len(keys)} problems, auto and standard N=5 interleaved by windows of "
        f"{args.window} problems submitted at once (the order alternating window by window), "
        f"max_new_tokens {MAX_NEW_TOKENS}, engine batch {BATCH} rows.",
        "",
        "| mode | correct | % | 95 % Wilson | wall time (s), its windows | task wall time p50 "
        "| time to first answer p50 | p99 | completion tokens per problem | mean samples |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    outcomes: dict[str, list[Any]] = {}
    figures: dict[str, dict[str, float]] = {}
    for mode in ("auto", "standard"):
        rows = [by_mode[mode][k] for k in keys]
        correct = [scorer.score(r["dataset"], r["index"], r["answer"]) >= 1.0 for r in rows]
        outcomes[mode] = [_Outcome(r["key"], ok) for r, ok in zip(rows, correct, strict=True)]
        k = sum(correct)
        lo, hi = wilson(k, len(rows))
        walls = [r["wall_s"] for r in rows]
        firsts = [r["first_answer_s"] for r in rows]
        window_s = sum({r["window"]: r["window_s"] for r in rows}.values())
        figures[mode] = {"acc": k / len(rows), "wall": window_s, "first": percentile(firsts, 50)}
        out.append(
            f"| {mode} | {k}/{len(rows)} | {100 * k / len(rows):.1f} | {100 * lo:.1f}-"
            f"{100 * hi:.1f} | {window_s:.0f} | {statistics.median(walls):.1f} | "
            f"{percentile(firsts, 50):.1f} | {percentile(firsts, 99):.1f} | "
            f"{sum(r['completion_tokens'] for r in rows) / len(rows):.0f} | "
            f"{sum(r['samples_used'] for r in rows) / len(rows):.2f} |"
        )
    t = mcnemar(outcomes["auto"], outcomes["standard"])
    auto_rows = [by_mode["auto"][k] for k in keys]
    matches = sum(replay_matches(r) for r in auto_rows)
    stages = {s: sum(r["stage"] == s for r in auto_rows) for s in (1, 2, 3)}
    a, s = figures["auto"], figures["standard"]
    share = a["wall"] / s["wall"]
    met = a["acc"] >= s["acc"] and share <= 0.60 and a["first"] <= s["first"]
    out += [
        "",
        f"McNemar, auto vs standard: {t.a_only} vs {t.b_only} discordant, p = {t.p_value:.3g}. "
        f"Auto ended in stage 1 on {stages[1]}, stage 2 on {stages[2]}, stage 3 on "
        f"{stages[3]} problems.",
        "",
        f"Goal (auto at least as accurate as standard in <= 60 % of its wall time, time to "
        f"first answer p50 no worse): accuracy {100 * a['acc']:.1f} vs {100 * s['acc']:.1f} %, "
        f"wall time {100 * share:.0f} % of standard's, first answer p50 {a['first']:.1f} vs "
        f"{s['first']:.1f} s: **{'met' if met else 'not met'}**.",
        "",
        f"Replay check: {matches} of {len(auto_rows)} live auto tasks decide as the offline "
        "replay of the same samples does (stage and answer).",
        "",
    ]
    text = "\n".join(out)
    REPORT.write_text(text)
    return text


class _Outcome:
    def __init__(self, key: str, correct: bool) -> None:
        self.key, self.correct = key, correct


async def main_async(args: argparse.Namespace) -> int:
    scorer = Scorer(DATASETS, args.size, SEED)
    problems = scorer.problems()[: args.limit]
    done = {(r["key"], r["mode"]) for r in read_lines(OUT)}
    if not args.report_only:
        workdir = Path(tempfile.mkdtemp(prefix="ponder-auto-live-"))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = serve(port, workdir)
        try:
            await wait_ready(url, workers=1, timeout_s=900)  # the model loads first
            print(f"serving on {port}; load {load_avg()}", flush=True)
            async with AsyncClient(url, timeout=3600) as client:
                windows = [
                    problems[i : i + args.window] for i in range(0, len(problems), args.window)
                ]
                for w, window in enumerate(windows):
                    modes = ("auto", "standard") if w % 2 == 0 else ("standard", "auto")
                    for mode in modes:
                        todo = [p for p in window if (p.key, mode) not in done]
                        if not todo:
                            continue
                        started = time.monotonic()
                        lines = await asyncio.gather(*(run_task(client, p, mode) for p in todo))
                        window_s = round(time.monotonic() - started, 2)
                        with OUT.open("a") as f:
                            for line in lines:
                                f.write(json.dumps({**line, "window": w, "window_s": window_s}))
                                f.write("\n")
                        print(
                            f"window {w + 1}/{len(windows)} {mode:8s}: {len(todo)} tasks in "
                            f"{window_s} s; stages {[x['stage'] for x in lines]}",
                            flush=True,
                        )
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
    lines = [r for r in read_lines(OUT) if r["key"] in {p.key for p in problems}]
    print(write_report(lines, scorer, args), flush=True)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=100, help="problems")
    parser.add_argument("--size", type=int, default=20, help="problems per dataset")
    parser.add_argument("--window", type=int, default=10, help="problems submitted at once")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    os.chdir(ROOT)
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
