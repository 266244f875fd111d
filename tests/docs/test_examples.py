"""The shell and Python examples of README.md and docs/*.md run against a live service.

A real ``ponder serve`` (scripted engine, embedded store, a free loopback port) answers
them; every ```sh / ```bash / ```python block runs (the base URL rewritten to that port,
``PONDER_URL`` set, ``ponder`` on the PATH) unless the line before it says
``<!-- no-run: reason -->``, and must exit 0 within its time limit. Where the page shows
what a block printed (a ```text block right after it), the real output must have the same
shape: the JSON keys, SSE event names and OpenAI event types shown. The test counts the
blocks that ran, so it cannot pass by running none.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from ponder.webhooks import generate_secret
from tests.docs.markdown import ROOT, Block, blocks, example_pages
from tests.docs.service import BLOCK_TIMEOUT_S, run_block, scripted_service

pytestmark = pytest.mark.timeout(300)

#: at least this many blocks must run (the pages hold more; a parser that finds none fails)
MIN_RUN = 25
PARALLEL = 3
#: what the service and the examples share: the webhook secret (the receivers of the
#: webhook examples listen on loopback, hence private callbacks allowed)
_SHARED = {
    "PONDER_WEBHOOK_SECRET": generate_secret(),
    "PONDER_CALLBACK_ALLOW_PRIVATE": "true",
}
_BASE_URL = re.compile(r"(?:localhost|127\.0\.0\.1):8000")


@dataclass
class Ran:
    block: Block
    code: int
    out: str


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``ponder serve`` on a free loopback port, the scripted engine writing a word every
    10 ms (so that running samples send ``delta`` events, as a model does)."""
    with scripted_service(tmp_path_factory.mktemp("service"), "docs", _SHARED) as url:
        yield url


def _run(block: Block, url: str, workdir: Path) -> Ran:
    code = _BASE_URL.sub(url.removeprefix("http://"), block.code)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PONDER_URL": url,
        **_SHARED,
        "PYTHONWARNINGS": "error",
        "NO_COLOR": "1",
        "COLUMNS": "120",
    }
    env.pop("PONDER_API_KEY", None)
    if block.lang == "python":
        argv = [sys.executable, "-c", code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", code]
    try:
        done = run_block(argv, workdir, env)
    except subprocess.TimeoutExpired as e:
        return Ran(block, -1, f"timed out after {BLOCK_TIMEOUT_S} s\n{e.stdout!r}\n{e.stderr!r}")
    return Ran(block, done.returncode, done.stdout + done.stderr)


def shape(text: str) -> set[str]:
    """What an output's shape is made of: JSON keys (lower-case names: the answers of a
    vote are data, not shape), SSE event names, OpenAI and ponder event types."""
    keys = {f"key {k}" for k in re.findall(r"[\"']([a-z_][a-z0-9_]*)[\"']\s*:", text)}
    events = {f"event {e}" for e in re.findall(r"^event: (\w+)", text, re.M)}
    kinds = {
        f"type {t}"
        for t in re.findall(r"\b((?:response|ponder|batch)\.[a-z_]+(?:\.[a-z_]+)*)\b", text)
    }
    return keys | events | kinds


def test_shape_reads_keys_events_and_types() -> None:
    shown = 'id: 3\nevent: sample\ndata: {"index":0,"text":"x"}\n7 ponder.sample.delta \'a\''
    assert shape(shown) == {
        "key index", "key text", "event sample", "type ponder.sample.delta",
    }  # fmt: skip
    assert shape("{'392': 1, 'Paris': 2}") == set()


def test_the_examples_run_against_a_live_service(service: str, tmp_path: Path) -> None:
    pages = example_pages()
    assert ROOT / "README.md" in pages and len(pages) >= 5, pages
    found = [b for page in pages for b in blocks(page)]
    runnable = [b for b in found if b.runs]
    skipped = [b for b in found if b.lang in ("sh", "bash", "python") and b.no_run]
    assert all(b.no_run and len(b.no_run) > 3 for b in skipped)  # each says why
    assert len(runnable) >= MIN_RUN, [b.where for b in runnable]

    def run(item: tuple[int, Block]) -> Ran:
        index, block = item
        workdir = tmp_path / f"block{index}"
        workdir.mkdir()
        (workdir / ".venv").symlink_to(Path(sys.prefix))  # as in a clone: `.venv/bin/ponder`
        return _run(block, service, workdir)

    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(run, enumerate(runnable)))

    failures = []
    for ran in results:
        if ran.code != 0:
            failures.append(f"{ran.block.where} exited {ran.code}:\n{ran.out[-3000:]}")
        elif ran.block.output is not None:
            missing = shape(ran.block.output) - shape(ran.out)
            if missing:
                failures.append(
                    f"{ran.block.where}: the page shows {sorted(missing)}, the real output has "
                    f"not:\n{ran.out[-3000:]}"
                )
    assert not failures, "\n\n".join(failures)
    assert len(results) == len(runnable) >= MIN_RUN
    print(f"{len(results)} examples ran, {len(skipped)} marked no-run")
