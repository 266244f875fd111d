"""Benchmark: answer quality of ponder's modes on a real local model, through the service.

Run with ``make bench-quality`` (``.venv/bin/python bench/quality.py``). Writes
``bench/results/quality.md`` and ``bench/results/quality.png`` (``--out`` moves both).

Problems come from ``reasoning-gym`` (offline generators with verified answers):
``basic_arithmetic``, ``chain_sum`` and ``gsm_symbolic``, ``--size`` problems each from
``--seed``. The script starts ``ponder serve`` as a subprocess with the transformers
engine (``--model``, SmolLM2-135M by default), an SQLite store in a temporary
directory, batches of up to 16 and generous time limits (a slow shared CPU must not time
samples out), waits for ``/readyz`` and one warm-up task, then runs each configuration in
turn: every problem submitted at once (the service batches their samples), each task
followed through its event stream with the SDK until it ends. The final answer
(``result.answer``, extracted by ponder with ``task_type=math``) is scored with the
dataset's own ``score_answer``; a problem counts as correct only at score 1.0.

Configurations:

- ``greedy``: ``mode=fast, temperature=0``; ``fast``: ``mode=fast`` at its temperature;
- ``standard-N`` / ``standard-N-es``: ``mode=standard, samples=N`` for N = 3, 5, 8, with
  ``early_stop`` false / true (the request field overrides the mode's setting);
- ``deep``: ``mode=deep`` with its defaults (5 samples over cot / decompose / pot);
- ``optillm-sc`` (when ``.venv-optillm`` or ``.venv-peers`` has ``bin/optillm``):
  optillm's ``self_consistency`` approach as a proxy in front of ponder's
  OpenAI-compatible endpoint, model ``ponder-fast`` (each upstream call is one fast-mode
  task: one sample of the same model with the same prompt). It makes 5 calls per
  problem; its reply is passed through ``ponder.enhance.extract_answer(text, "math")``
  and scored the same way. optillm runs in its own virtualenv and is never a
  dependency of ponder.

Every configuration asks for the same ``--max-new-tokens`` per sample.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ponder.client import AsyncClient
from ponder.enhance import extract_answer
from ponder.types import Task

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
#: optillm's own virtualenv (``.venv-optillm``), else the shared peers one
PEER_VENVS = (ROOT / ".venv-optillm", ROOT / ".venv-peers")

DATASETS = ("basic_arithmetic", "chain_sum", "gsm_symbolic")
SEED = 20261130
SIZE = 5
MAX_NEW_TOKENS = 128
#: generous limits: on a shared 2-core CPU a task may wait minutes for its batches
SAMPLE_TIMEOUT_S = 3000
TASK_TIMEOUT_S = 3600
OPTILLM_SAMPLES = 5
SEED_STRIDE = 1_000_003
MAX_RESTARTS = 2
#: ``--difficulty easy``: smaller arithmetic problems, chosen before any run so that a
#: 135M model is neither at 0 % nor at 100 % (MODELS.md: 3/8 two-number sums right);
#: ``gsm_symbolic`` has one difficulty only. ``--difficulty default``: reasoning-gym's own
#: defaults (2-6 terms of up to 4 digits).
EASY: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {
        "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
        "operators": ("+", "-", "*"), "allow_parentheses": False, "allow_negation": False,
    },
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
}  # fmt: skip  # self_consistency's fixed number of calls (optillm/self_consistency.py)


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    body: dict[str, Any] = field(default_factory=dict)
    peer: bool = False


CONFIGS: tuple[Config, ...] = (
    Config("greedy", "greedy (fast, T=0)", {"mode": "fast", "temperature": 0.0}),
    Config("fast", "fast (1 sample)", {"mode": "fast"}),
    *(
        Config(
            f"standard-{n}{'-es' if es else ''}",
            f"standard N={n}, early stop {'on' if es else 'off'}",
            {"mode": "standard", "samples": n, "early_stop": es},
        )
        for n in (3, 5, 8)
        for es in (False, True)
    ),
    Config("deep", "deep (N=5, cot/decompose/pot)", {"mode": "deep"}),
    Config("optillm-sc", "optillm self_consistency (5 calls)", peer=True),
)
BY_NAME = {c.name: c for c in CONFIGS}


@dataclass
class Problem:
    dataset: str
    index: int
    question: str
    expected: str
    entry: dict[str, Any]


@dataclass
class Outcome:
    dataset: str
    index: int
    expected: str
    answer: str | None
    score: float
    status: str
    samples_used: int
    completion_tokens: int
    error: str | None = None

    @property
    def correct(self) -> bool:
        return self.score >= 1.0


@dataclass
class ConfigResult:
    name: str
    label: str
    outcomes: list[Outcome]
    wall_s: float
    note: str = ""

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def peer_like(self) -> bool:
        return self.name.startswith("optillm")

    @property
    def correct(self) -> int:
        return sum(o.correct for o in self.outcomes)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else float("nan")

    @property
    def mean_samples(self) -> float:
        return sum(o.samples_used for o in self.outcomes) / self.n if self.n else float("nan")

    @property
    def completion_tokens(self) -> int:
        return sum(o.completion_tokens for o in self.outcomes)

    def count(self, predicate: Any) -> int:
        return sum(1 for o in self.outcomes if predicate(o))


# --- problems and scoring -------------------------------------------------------------
def dataset_config(name: str, difficulty: str) -> dict[str, Any]:
    return EASY.get(name, {}) if difficulty == "easy" else {}


def make_problems(
    datasets: Sequence[str], size: int, seed: int, difficulty: str
) -> tuple[list[Problem], Any]:
    import reasoning_gym

    problems: list[Problem] = []
    scorers: dict[str, Any] = {}
    for k, name in enumerate(datasets):
        # reasoning-gym seeds item i with seed + i, and basic_arithmetic and chain_sum
        # draw the same numbers from one seed: each dataset gets its own, far apart
        extra = dataset_config(name, difficulty)
        ds = reasoning_gym.create_dataset(name, size=size, seed=seed + SEED_STRIDE * k, **extra)
        scorers[name] = ds
        for i in range(size):
            entry = ds[i]
            problems.append(Problem(name, i, entry["question"], str(entry["answer"]), entry))
    return problems, scorers


def score(scorers: dict[str, Any], problem: Problem, answer: str | None) -> float:
    if answer is None:
        return 0.0
    try:
        return float(scorers[problem.dataset].score_answer(answer.strip(), problem.entry))
    except Exception:  # a scorer must never stop the benchmark
        return 0.0


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


# --- processes ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ponder_env(workdir: Path, port: int, model: str, batch: int, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PONDER_")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PONDER_ENGINE="transformers",
        PONDER_MODEL=model,
        PONDER_SQLITE_PATH=str(workdir / "q.db"),
        PONDER_PORT=str(port),
        PONDER_BATCH_MAX_SIZE=str(batch),
        PONDER_TORCH_THREADS=str(threads),
        PONDER_WORKER_MAX_TASKS="64",
        PONDER_MAX_PENDING="2000",
        PONDER_LOG_LEVEL="warning",
    )
    for mode in ("FAST", "STANDARD", "DEEP"):
        env[f"PONDER_MODES__{mode}__SAMPLE_TIMEOUT_S"] = str(SAMPLE_TIMEOUT_S)
        env[f"PONDER_MODES__{mode}__TASK_TIMEOUT_S"] = str(TASK_TIMEOUT_S)
        env[f"PONDER_MODES__{mode}__MAX_TIMEOUT_S"] = str(TASK_TIMEOUT_S)
    return env


class Server:
    """``ponder serve`` in a subprocess, its output in a log file."""

    def __init__(self, workdir: Path, model: str, batch: int, threads: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.log_path = workdir / "ponder.log"
        self.env = ponder_env(workdir, self.port, model, batch, threads)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def died_note(self, when: str) -> str:
        code = self.proc.returncode if self.proc is not None else None
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        first = next(
            (line for line in self.log_tail(20_000).splitlines() if line.startswith("ERROR")), ""
        )
        return (
            f"ponder serve (pid {self.proc.pid if self.proc else '?'}) stopped "
            f"{when} ({how}; first error line of its log: {first!r}); a new one was started "
            "on the same store."
        )

    def start(self) -> None:
        ponder = Path(sys.executable).parent / "ponder"
        argv = [str(ponder), "serve", "--port", str(self.port)]
        self.starts += 1
        if self.starts > 1:
            self.log_path = self.workdir / f"ponder-{self.starts}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
            )

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    async def wait_ready(self, timeout_s: float = 600) -> float:
        start = time.monotonic()
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
            while time.monotonic() - start < timeout_s:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(
                        f"ponder serve exited with {self.proc.returncode}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/readyz")).status_code == 200:
                        return time.monotonic() - start
                await asyncio.sleep(0.5)
        raise RuntimeError(f"ponder serve not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Optillm:
    """optillm's proxy (``--approach self_consistency``) in front of ponder's /v1."""

    def __init__(self, workdir: Path, upstream: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.upstream = upstream
        self.log_path = workdir / "optillm.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> Path | None:
        return next(
            (v / "bin" / "optillm" for v in PEER_VENVS if (v / "bin" / "optillm").exists()), None
        )

    @staticmethod
    def available() -> str | None:
        """None when optillm can run, else why not."""
        binary = Optillm.binary()
        if binary is None:
            venvs = " or ".join(str(v.relative_to(ROOT)) for v in PEER_VENVS)
            return f"optillm is not installed in {venvs}"
        probe = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, timeout=300, check=False
        )
        if probe.returncode != 0 or "--approach" not in probe.stdout:
            return f"`optillm --help` failed: {(probe.stderr or probe.stdout)[-300:]}"
        return None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PONDER_")}
        # optillm wants a key for its OpenAI client; ponder runs without auth
        env.update(OPENAI_API_KEY="sk-none", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        argv = [
            str(Optillm.binary()),
            "--base-url", f"{self.upstream}/v1",
            "--approach", "self_consistency",
            "--port", str(self.port),
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.log_path.parent
            )

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    async def wait_ready(self, timeout_s: float = 300) -> None:
        start = time.monotonic()
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
            while time.monotonic() - start < timeout_s:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"optillm exited with {self.proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    r = await http.get("/health")
                    if r.status_code < 500:
                        return
                await asyncio.sleep(1)
        raise RuntimeError(f"optillm not ready after {timeout_s:.0f}s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- running a configuration ----------------------------------------------------------
async def submit_all(
    url: str, problems: Sequence[Problem], body: dict[str, Any], max_new_tokens: int
) -> list[Task]:
    """Submit every problem at once. ``POST /v1/tasks`` directly: the SDK's ``submit``
    has no ``early_stop`` argument."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def one(p: Problem) -> Task:
            request = {
                "prompt": p.question,
                "task_type": "math",
                "max_new_tokens": max_new_tokens,
                "timeout_s": TASK_TIMEOUT_S,
                **body,
            }
            r = await http.post("/v1/tasks", json=request)
            r.raise_for_status()
            return Task.model_validate(r.json())

        return list(await asyncio.gather(*(one(p) for p in problems)))


async def run_ponder(
    url: str,
    config: Config,
    problems: Sequence[Problem],
    scorers: dict[str, Any],
    max_new_tokens: int,
) -> ConfigResult:
    start = time.monotonic()
    submitted = await submit_all(url, problems, config.body, max_new_tokens)
    async with AsyncClient(url, timeout=120) as sdk:
        finished = await asyncio.gather(
            *(sdk.wait(t.id, timeout=TASK_TIMEOUT_S + 300) for t in submitted),
            return_exceptions=True,
        )
    wall = time.monotonic() - start
    outcomes = []
    for p, task in zip(problems, finished, strict=True):
        if isinstance(task, BaseException):
            outcomes.append(
                Outcome(p.dataset, p.index, p.expected, None, 0.0, "client_error", 0, 0,
                        error=f"{type(task).__name__}: {task}")
            )  # fmt: skip
            continue
        answer = task.result.answer if task.result is not None else None
        outcomes.append(
            Outcome(
                p.dataset, p.index, p.expected, answer, score(scorers, p, answer),
                task.status.value, task.samples_used, task.usage.completion_tokens,
                error=task.error.message if task.error else None,
            )
        )  # fmt: skip
    return ConfigResult(config.name, config.label, outcomes, wall)


async def run_optillm(
    peer: Optillm,
    config: Config,
    problems: Sequence[Problem],
    scorers: dict[str, Any],
    max_new_tokens: int,
) -> ConfigResult:
    start = time.monotonic()
    timeout = httpx.Timeout(TASK_TIMEOUT_S, connect=30)
    async with httpx.AsyncClient(base_url=peer.url, timeout=timeout) as http:

        async def one(p: Problem) -> Outcome:
            body = {
                "model": "ponder-fast",
                "messages": [{"role": "user", "content": p.question}],
                "max_tokens": max_new_tokens,
            }
            try:
                r = await http.post("/v1/chat/completions", json=body)
                r.raise_for_status()
                reply = r.json()
                text = reply["choices"][0]["message"]["content"] or ""
                usage = reply.get("usage") or {}
            except (httpx.HTTPError, KeyError, ValueError) as e:
                detail = ""
                if isinstance(e, httpx.HTTPStatusError):
                    detail = f": {e.response.text[:300]}"
                return Outcome(p.dataset, p.index, p.expected, None, 0.0, "client_error", 0, 0,
                               error=f"{type(e).__name__}: {e}{detail}")  # fmt: skip
            answer = extract_answer(text, "math")  # type: ignore[arg-type]
            return Outcome(
                p.dataset, p.index, p.expected, answer, score(scorers, p, answer), "done",
                OPTILLM_SAMPLES, int(usage.get("completion_tokens") or 0),
            )  # fmt: skip

        outcomes = list(await asyncio.gather(*(one(p) for p in problems)))
    return ConfigResult(config.name, config.label, outcomes, time.monotonic() - start)


async def warm_up(url: str, max_new_tokens: int) -> float:
    """One fast task, so that the model load is not counted in the first configuration."""
    start = time.monotonic()
    async with AsyncClient(url, timeout=120) as sdk:
        task = await sdk.submit("What is 2 + 3?", mode="fast", max_new_tokens=max_new_tokens,
                                timeout_s=TASK_TIMEOUT_S)  # fmt: skip
        await sdk.wait(task.id, timeout=TASK_TIMEOUT_S)
    return time.monotonic() - start


# --- report ---------------------------------------------------------------------------
def fmt_pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}"


def goals(by: dict[str, ConfigResult]) -> list[tuple[str, str, str]]:
    """(goal, what was measured, verdict) rows, computed from this run."""
    rows: list[tuple[str, str, str]] = []
    base = [by[n] for n in ("fast", "greedy") if n in by]
    standards = [by[c.name] for c in CONFIGS if c.name.startswith("standard") and c.name in by]
    if base and standards:
        best_base = max(r.accuracy for r in base)
        beat = [r for r in standards if r.accuracy > best_base]
        measured = (
            f"best of fast/greedy {fmt_pct(best_base)} %; standard: "
            + ", ".join(f"{r.name} {fmt_pct(r.accuracy)} %" for r in standards)
            + f" ({len(beat)} of {len(standards)} above)"
        )
        verdict = "met" if len(beat) == len(standards) else "**not met**"
        if beat and len(beat) < len(standards):
            verdict += " (partly)"
        rows.append(("standard beats fast and greedy on accuracy", measured, verdict))
    for n in (3, 5, 8):
        off, on = by.get(f"standard-{n}"), by.get(f"standard-{n}-es")
        if off is None or on is None:
            continue
        drop = 100 * (off.accuracy - on.accuracy)
        saved = 1 - on.mean_samples / off.mean_samples if off.mean_samples else float("nan")
        ok_acc, ok_saved = drop <= 1.0 + 1e-9, saved >= 0.30
        measured = (
            f"N={n}: accuracy {fmt_pct(on.accuracy)} % vs {fmt_pct(off.accuracy)} % "
            f"(drop {drop:+.1f} points); samples {on.mean_samples:.2f} vs "
            f"{off.mean_samples:.2f} ({100 * saved:.0f} % fewer)"
        )
        verdict = "met" if ok_acc and ok_saved else "**not met**"
        if not (ok_acc and ok_saved):
            verdict += " (" + ", ".join(
                what for what, ok in (("accuracy", ok_acc), ("savings", ok_saved)) if not ok
            ) + ")"  # fmt: skip
        rows.append(
            (f"early stopping (N={n}): within 1 point, >= 30 % fewer samples", measured, verdict)
        )
    peer, mine = by.get("optillm-sc"), by.get("standard-5")
    if peer is not None and mine is not None:
        ratio = mine.accuracy / peer.accuracy if peer.accuracy else float("inf")
        measured = (
            f"ponder standard N=5 (no early stop) {fmt_pct(mine.accuracy)} % at "
            f"{mine.mean_samples:.2f} samples vs optillm {fmt_pct(peer.accuracy)} % at "
            f"{OPTILLM_SAMPLES} (ratio {ratio:.2f})"
        )
        verdict = "met" if mine.accuracy >= peer.accuracy else "**not met**"
        rows.append(("ponder >= optillm at equal samples", measured, verdict))
    return rows


def write_report(
    out: Path,
    png: Path | None,
    results: list[ConfigResult],
    args: argparse.Namespace,
    meta: dict[str, Any],
) -> None:
    by = {r.name: r for r in results}
    n_problems = results[0].n if results else 0
    lines = [
        "# Quality benchmark",
        "",
        f"Command: `{meta['command']}` — one run, {meta['date']}, "
        f"{meta['total_s'] / 60:.1f} min in all.",
        "",
        f"Model: `{args.model}` through the transformers engine (float32, CPU), served by "
        f"`ponder serve` (SQLite store, batches of up to {args.batch_max_size}). "
        f"Machine: {meta['machine']}. Datasets (reasoning-gym {meta['rg_version']}): "
        f"{', '.join(f'`{d}`' for d in args.datasets)}, {args.size} problems each "
        f"({n_problems} in all), seed {args.seed} (+ {SEED_STRIDE} k for the k-th dataset), "
        f"difficulty `{args.difficulty}` ("
        + "; ".join(
            f"`{d}`: {dataset_config(d, args.difficulty) or 'reasoning-gym defaults'}"
            for d in args.datasets
        )
        + f"). {args.max_new_tokens} new tokens at "
        "most per sample in every configuration; `task_type=math`. A problem is correct "
        "when the dataset's `score_answer` gives 1.0 for ponder's extracted answer.",
        "",
        f"Server start {meta['ready_s']:.1f} s, warm-up task {meta['warm_s']:.1f} s "
        "(model load; not counted below).",
        "",
        "## Goals (computed from this run)",
        "",
        "| goal | measured | verdict |",
        "|---|---|---|",
    ]
    for goal, measured, verdict in goals(by):
        lines.append(f"| {goal} | {measured} | {verdict} |")
    if "optillm-sc" not in by:
        lines.append(f"| ponder >= optillm at equal samples | {meta['optillm']} | not measured |")
    lines += [
        "",
        "## Results",
        "",
        "| config | correct | accuracy % | 95 % Wilson | mean samples used | "
        "completion tokens | wall s | not done / no answer |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lo, hi = wilson(r.correct, r.n)
        not_done = r.count(lambda o: o.status != "done")
        no_answer = r.count(lambda o: o.answer is None)
        lines.append(
            f"| {r.label} (`{r.name}`) | {r.correct}/{r.n} | {fmt_pct(r.accuracy)} | "
            f"{fmt_pct(lo)}-{fmt_pct(hi)} | {r.mean_samples:.2f} | {r.completion_tokens} | "
            f"{r.wall_s:.0f} | {not_done} / {no_answer} |"
        )
    lines += ["", "Accuracy per dataset (correct / problems):", ""]
    lines.append("| config | " + " | ".join(args.datasets) + " |")
    lines.append("|---|" + "---:|" * len(args.datasets))
    for r in results:
        cells = []
        for d in args.datasets:
            mine = [o for o in r.outcomes if o.dataset == d]
            cells.append(f"{sum(o.correct for o in mine)}/{len(mine)}")
        lines.append(f"| `{r.name}` | " + " | ".join(cells) + " |")
    if png is not None:
        lines += ["", f"![accuracy vs samples]({png.name})"]
    lines += ["", "## Notes", ""]
    lines += [f"- {note}" for note in meta["notes"]]
    problems_seen = []
    for r in results:
        for o in r.outcomes:
            if o.status not in ("done",) or o.error:
                problems_seen.append(
                    f"`{r.name}` {o.dataset}#{o.index}: {o.status} {o.error or ''}"
                )
    if problems_seen:
        lines += ["", "Tasks that did not end `done`:", ""]
        lines += [f"- {p}" for p in problems_seen[:40]]
        if len(problems_seen) > 40:
            lines.append(f"- … {len(problems_seen) - 40} more")
    lines += ["", "## Discussion", "", *meta["discussion"], ""]
    out.write_text("\n".join(lines))


def plot(results: list[ConfigResult], png: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(10, 6))
    palette = plt.get_cmap("tab10")
    seen: dict[float, int] = {}  # points at the same x are drawn side by side
    xs: dict[str, float] = {}
    for r in results:
        key = round(r.mean_samples, 1)
        xs[r.name] = r.mean_samples + 0.12 * seen.get(key, 0)
        seen[key] = seen.get(key, 0) + 1
    for i, r in enumerate(results):
        lo, hi = wilson(r.correct, r.n)
        marker = "s" if r.peer_like else ("^" if r.name.endswith("-es") else "o")
        ax.errorbar(
            xs[r.name], 100 * r.accuracy,
            yerr=[[100 * (r.accuracy - lo)], [100 * (hi - r.accuracy)]],
            fmt=marker, color=palette(i % 10), capsize=3, alpha=0.85, markersize=8,
            label=f"{r.name}: {100 * r.accuracy:.0f} % at {r.mean_samples:.2f}",
        )  # fmt: skip
    for n in (3, 5, 8):
        pair = [r for r in results if r.name in (f"standard-{n}", f"standard-{n}-es")]
        if len(pair) == 2:
            ax.plot([xs[p.name] for p in pair], [100 * p.accuracy for p in pair],
                    color="tab:gray", alpha=0.4, lw=1, ls="--")  # fmt: skip
    n = results[0].n if results else 0
    ax.set_xlabel("mean samples used per problem (coincident points shifted apart)")
    ax.set_ylabel(f"accuracy % ({n} problems; bars: 95 % Wilson)")
    ax.set_title(
        "ponder answer quality: accuracy vs samples\n"
        "(triangles: early stop on; square: optillm; dashed: same N with / without early stop)",
        fontsize=10,
    )
    ax.set_ylim(0, 100)
    ax.set_xlim(0, max([9.0, *(r.mean_samples + 0.5 for r in results)]))
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def discussion(by: dict[str, ConfigResult], n: int, args: argparse.Namespace) -> list[str]:
    text = []
    one = 100 / n if n else float("nan")
    text.append(
        f"- **Sample size.** {n} problems: one problem is {one:.1f} accuracy points, and the "
        "95 % Wilson intervals above are roughly ±15-20 points wide. Differences of a few "
        'problems between configurations are within noise; the goal "within 1 point" can '
        "only be met here by solving at least as many problems. Read the verdicts as what "
        "this run showed, not as established effects."
    )
    if args.model.startswith("smollm2"):
        text.append(
            "- **Model.** SmolLM2-135M is weak at arithmetic (MODELS.md: 3/8 two-number sums "
            "right). When most samples are wrong and wrong answers scatter, voting can only "
            "help where the right answer is the most frequent one; where the model is "
            "systematically wrong, more samples do not help."
        )
    return text


def optillm_notes(peer: Optillm, result: ConfigResult) -> list[str]:
    log = ""
    with contextlib.suppress(OSError):
        log = peer.log_path.read_text(errors="replace")
    calls = log.count('/v1/chat/completions "HTTP/1.1 200')
    skipped = log.count("Self-consistency sample was empty, None, or truncated")
    venv = peer.binary()
    where = venv.parent.parent.name if venv else "?"
    notes = [
        f"optillm 0.4.0 from `{where}` (`optillm --base-url <ponder>/v1 --approach "
        "self_consistency`), model `ponder-fast`: each of its calls is one fast-mode ponder "
        "task (one sample, same model, same system instruction that ponder adds to every "
        "sample). Differences it brings itself: it sends the question as `User: <question>` "
        "under an empty system message, samples at temperature 1, clusters whole replies "
        "by `difflib` similarity >= 0.8 and drops replies that hit the token limit "
        "(`finish_reason=length`).",
        f"optillm made {calls} upstream calls for {result.n} problems; it dropped {skipped} "
        "replies as empty or truncated (a problem whose 5 replies are all dropped gets "
        '"No consistent answer found."). Its samples are counted as 5 per problem.',
    ]
    errors = [o for o in result.outcomes if o.status == "client_error"]
    if errors:
        notes.append(f"optillm: {len(errors)} requests failed, e.g. {errors[0].error}")
    return notes


# --- main -----------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help="comma-separated reasoning-gym datasets")  # fmt: skip
    parser.add_argument("--size", type=int, default=SIZE, help="problems per dataset")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--difficulty",
        choices=("easy", "default"),
        default="easy",
        help="easy: small arithmetic (see EASY); default: reasoning-gym's defaults",
    )
    parser.add_argument("--model", default="smollm2-135m", help="PONDER_MODEL (or qwen0.5b)")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--configs", default=",".join(c.name for c in CONFIGS),
                        help="comma-separated subset of: " + ", ".join(BY_NAME))  # fmt: skip
    parser.add_argument("--batch-max-size", type=int, default=16)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="PONDER_TORCH_THREADS; 1 is far faster than 2 on a shared 2-core CPU",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "quality.md",
                        help="report path; the PNG is written beside it (.png)")  # fmt: skip
    parser.add_argument("--raw", type=Path, default=None, help="also dump per-problem JSON here")
    args = parser.parse_args(argv)
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in BY_NAME]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {', '.join(BY_NAME)}")
    args.configs = names
    return args


def command_line() -> str:
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(ROOT)
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(ROOT)
    return shlex.join([str(python), str(script), *sys.argv[1:]])


def machine() -> str:
    import torch

    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other work), Python "
        f"{platform.python_version()}, torch {torch.__version__}"
    )


async def amain(args: argparse.Namespace) -> int:
    from importlib.metadata import version

    started = time.monotonic()
    problems, scorers = make_problems(args.datasets, args.size, args.seed, args.difficulty)
    configs = [BY_NAME[n] for n in args.configs]
    notes: list[str] = [
        f"`--max-new-tokens {args.max_new_tokens}`: SmolLM2's answers to these problems are "
        "short; a sample cut at the limit still gets its answer extracted from what it wrote.",
        "Samples used = samples that ran (`samples_used`: done, failed or timed out); "
        "early stopping's skipped samples are not counted. Deep mode may also run one "
        "64-token clarification request, counted in neither samples nor tokens.",
        "All problems of a configuration are submitted at once, so wall time is the time "
        "to finish the whole set on this shared CPU (it varies with other load).",
        "Scoring is strict: the extracted answer must score 1.0 with the dataset's "
        "`score_answer` (e.g. `basic_arithmetic` gives `-4.0` for `-4` only 0.5).",
    ]
    optillm_note = "not in --configs"
    results: list[ConfigResult] = []
    workdir = Path(tempfile.mkdtemp(prefix="ponder-quality-"))
    server = Server(workdir, args.model, args.batch_max_size, args.torch_threads)
    peer: Optillm | None = None
    print(f"workdir {workdir}; {len(problems)} problems; configs {args.configs}", flush=True)
    try:
        server.start()
        ready_s = await server.wait_ready()
        warm_s = await warm_up(server.url, args.max_new_tokens)
        print(f"ready in {ready_s:.1f}s, warm-up {warm_s:.1f}s", flush=True)
        restarts = 0
        for config in configs:
            for attempt in (1, 2):
                if not server.alive():  # someone stopped it: say so, start a fresh one
                    if restarts >= MAX_RESTARTS:
                        raise RuntimeError(f"ponder serve died {restarts + 1} times")
                    restarts += 1
                    died = server.died_note(f"while or before `{config.name}` ran")
                    notes.append(died)
                    print(died, flush=True)
                    server.start()
                    await server.wait_ready()
                    await warm_up(server.url, args.max_new_tokens)
                if config.peer:
                    why = await asyncio.to_thread(Optillm.available)
                    if why is not None:
                        optillm_note = why
                        print(f"skip {config.name}: {why}", flush=True)
                        result = None
                        break
                    if peer is not None:
                        peer.stop()
                    peer = Optillm(workdir, server.url)
                    peer.start()
                    try:
                        await peer.wait_ready()
                    except RuntimeError as e:
                        optillm_note = f"optillm did not start: {e}; log: {peer.log_tail(500)!r}"
                        print(optillm_note, flush=True)
                        result = None
                        break
                    result = await run_optillm(peer, config, problems, scorers, args.max_new_tokens)
                    optillm_note = "measured"
                else:
                    try:
                        result = await run_ponder(
                            server.url, config, problems, scorers, args.max_new_tokens
                        )
                    except httpx.HTTPError as e:  # e.g. a 422: report it, go on
                        result = None
                        if not server.alive() and attempt == 1:
                            continue
                        detail = (
                            e.response.text[:300] if isinstance(e, httpx.HTTPStatusError) else ""
                        )
                        notes.append(f"`{config.name}` could not run: {e} {detail}")
                        print(f"{config.name} failed: {e} {detail}", flush=True)
                        break
                if server.alive() or attempt == 2:
                    break
                # the server died while this configuration ran: run it again
                print(f"ponder serve died during {config.name}; running it again", flush=True)
                notes.append(
                    f"`{config.name}` was run a second time: the server died during the first "
                    "attempt (its results are discarded)."
                )
            if result is None:
                continue
            results.append(result)
            print(
                f"{config.name:>15}: {result.correct}/{result.n} correct, "
                f"{result.mean_samples:.2f} samples, {result.completion_tokens} tokens, "
                f"{result.wall_s:.0f}s (elapsed {time.monotonic() - started:.0f}s)",
                flush=True,
            )
    finally:
        if peer is not None:
            peer.stop()
        server.stop()
    if peer is not None and "optillm-sc" in (by := {r.name: r for r in results}):
        notes += optillm_notes(peer, by["optillm-sc"])
    elif "optillm-sc" in args.configs:
        notes.append(f"optillm was not measured: {optillm_note}.")
    if not results:
        print("no results", file=sys.stderr)
        return 1
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    png = plot(results, out.with_suffix(".png"))
    if args.raw is not None:
        args.raw.write_text(json.dumps([asdict(r) for r in results], indent=1))
    by = {r.name: r for r in results}
    meta: dict[str, Any] = {
        "command": command_line(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "total_s": time.monotonic() - started,
        "machine": machine(),
        "rg_version": version("reasoning-gym"),
        "ready_s": ready_s,
        "warm_s": warm_s,
        "optillm": optillm_note,
        "notes": notes,
        "discussion": discussion(by, len(problems), args),
    }
    write_report(out, png, results, args, meta)
    print(f"wrote {out}" + (f" and {png}" if png else ""), flush=True)
    return 0


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(asyncio.run(amain(args)))


if __name__ == "__main__":
    main()
