"""The peer: optillm's ``self_consistency`` in front of ponder's OpenAI-compatible route.

``ponder serve`` runs as a subprocess (openvino engine, the benchmark's model, an
SQLite store in a temporary directory); optillm (from ``.venv-optillm`` or
``.venv-peers``; never a dependency of ponder) runs as a proxy in front of its ``/v1``
with model ``ponder-fast``: each of optillm's upstream calls is one fast-mode ponder task
(one sample of the same model). optillm makes 5 calls per problem at its own temperature
(1.0), clusters the whole replies by difflib similarity >= 0.8 and answers with the
largest cluster; its reply goes through ponder's extraction for the dataset's type and
is scored like ponder's answers. One JSONL line per problem (resumable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ponder.enhance import answers
from quality_collect import append_record, read_records

ROOT = Path(__file__).resolve().parent.parent
#: optillm's own virtualenv (``.venv-optillm``), else the shared peers one
PEER_VENVS = (ROOT / ".venv-optillm", ROOT / ".venv-peers")
#: self_consistency's fixed number of calls (optillm/self_consistency.py)
OPTILLM_SAMPLES = 5
TIMEOUT_S = 6 * 3600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ponder_env(workdir: Path, port: int, model: str, batch: int, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PONDER_")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PONDER_ENGINE="openvino",
        PONDER_MODEL=model,
        PONDER_SQLITE_PATH=str(workdir / "q.db"),
        PONDER_PORT=str(port),
        PONDER_ENGINE_MAX_ROWS=str(batch),
        PONDER_ENGINE_THREADS=str(threads),
        PONDER_WORKER_MAX_TASKS="64",
        PONDER_MAX_PENDING="2000",
        PONDER_LOG_LEVEL="warning",
    )
    for mode in ("FAST", "STANDARD", "DEEP"):
        for name in ("SAMPLE_TIMEOUT_S", "TASK_TIMEOUT_S", "MAX_TIMEOUT_S"):
            env[f"PONDER_MODES__{mode}__{name}"] = str(TIMEOUT_S)
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


async def run_peer(args: Any, records: list[dict[str, Any]], out: Path) -> str:
    """optillm on the problems of ``records`` missing from ``out``; a note on how it went."""
    why = await asyncio.to_thread(Optillm.available)
    if why is not None:
        return why
    done = {r["key"] for r in read_records(out)}
    todo = [r for r in records if r["key"] not in done]
    if not todo:
        return "measured"
    workdir = Path(tempfile.mkdtemp(prefix="ponder-optillm-"))
    server = Server(workdir, args.model, args.batch_max_size, args.engine_threads)
    peer = Optillm(workdir, server.url)
    started = time.monotonic()
    try:
        server.start()
        await server.wait_ready()
        peer.start()
        await peer.wait_ready()
        timeout = httpx.Timeout(TIMEOUT_S, connect=30)
        gate = asyncio.Semaphore(args.in_flight)
        async with httpx.AsyncClient(base_url=peer.url, timeout=timeout) as http:

            async def one(record: dict[str, Any]) -> None:
                body = {
                    "model": "ponder-fast",
                    "messages": [{"role": "user", "content": record["question"]}],
                    "max_tokens": record["max_new_tokens"],
                }
                async with gate:
                    try:
                        r = await http.post("/v1/chat/completions", json=body)
                        r.raise_for_status()
                        text = r.json()["choices"][0]["message"]["content"] or ""
                        error = None
                    except (httpx.HTTPError, KeyError, ValueError) as e:
                        text, error = "", f"{type(e).__name__}: {e}"
                if error is not None:  # not recorded: a rerun asks again
                    print(f"optillm {record['key']}: {error}", flush=True)
                    return
                kind = answers.answer_type(record["task_type"])
                answer = kind.extract(text, kind.question(record["question"])) if text else None
                line = {"key": record["key"], "text": text, "answer": answer}
                append_record(out, line)
                print(f"optillm {record['key']}: {answer!r}", flush=True)

            await asyncio.gather(*(one(r) for r in todo))
    finally:
        peer.stop()
        server.stop()
    log = peer.log_tail(10**7)
    dropped = log.count("Self-consistency sample was empty, None, or truncated")
    return (
        f"measured ({len(todo)} problems in {time.monotonic() - started:.0f}s; optillm dropped "
        f"{dropped} replies as empty or truncated)"
    )


_OFFLINE = """
import json, sys
from optillm.self_consistency import AdvancedSelfConsistency
sc = AdvancedSelfConsistency(client=None, model="offline")
for line in sys.stdin:
    r = json.loads(line)
    clusters = sc.aggregate_results(r["texts"])["clusters"]
    print(json.dumps({"key": r["key"], "text": clusters[0]["answer"] if clusters else None}))
"""


def optillm_offline(records: list[dict[str, Any]], indices: list[int]) -> dict[str, str | None]:
    """optillm's own ``self_consistency`` aggregation (its code, in its virtualenv) over
    ponder's recorded samples ``indices`` of each problem, as its proxy sees replies:
    truncated ones (``finish_reason=length``) and empty ones are dropped first. Returns
    the representative reply per problem key (None: "No consistent answer found.");
    empty when optillm is not installed."""
    binary = Optillm.binary()
    if binary is None:
        return {}
    lines = []
    for r in records:
        samples = [r["runs"]["standard"]["samples"][i] for i in indices]
        texts = [s["text"] for s in samples if s["text"] and s["finish_reason"] != "length"]
        lines.append(json.dumps({"key": r["key"], "texts": texts}))
    python = binary.parent / "python"
    out = subprocess.run(
        [str(python), "-c", _OFFLINE], input="\n".join(lines), capture_output=True, text=True,
        timeout=600, check=True,
    )  # fmt: skip
    return {d["key"]: d["text"] for d in map(json.loads, out.stdout.splitlines())}
