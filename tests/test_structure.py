"""The package's layers (issue #22): the HTTP API sits on top.

- Only the HTTP side imports :mod:`ponder.api`: the API itself, the CLI (which serves it
  and reads its key digest) and the SDK (``client.py``, ``aio.py``). Admission, the
  OpenAI add-on (:mod:`ponder.openai`), the runtime and the worker are below it.
- FastAPI and Starlette are imported by :mod:`ponder.api` alone.
- ``ponder worker`` runs without loading FastAPI or any module of :mod:`ponder.api`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ponder

PACKAGE = Path(ponder.__file__).parent
#: where ``ponder.api`` may be imported (paths relative to the package)
MAY_IMPORT_API = ("api/", "cli/", "compose.py", "client.py", "aio.py")
_API = "ponder.api"
_WEB = ("fastapi", "starlette")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, text: str | None = None) -> Iterator[tuple[int, str]]:
    """Every module an import statement of ``path`` (or ``text`` as if it stood there)
    names, absolute (line, name): ``from a import b`` names both ``a`` and ``a.b`` (``b``
    may be a module). Imports inside functions count too."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    source = path.read_text(encoding="utf-8") if text is None else text
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def _sources() -> list[tuple[str, Path]]:
    return sorted((path.relative_to(PACKAGE).as_posix(), path) for path in PACKAGE.rglob("*.py"))


def _is(name: str, module: str) -> bool:
    return name == module or name.startswith(f"{module}.")


def test_the_import_walk_sees_every_form_of_import() -> None:
    # the checks below would pass vacuously if an import form were missed
    probe = PACKAGE / "openai" / "probe.py"  # read as if it stood there; never written
    text = (
        "from ..api import deps\n"
        "from .. import api\n"
        "from . import common\n"
        "def f():\n"
        "    import ponder.api.app\n"
        "    from ponder import api as web\n"
    )
    names = {name for _, name in _imported(probe, text)}
    assert {"ponder.api.deps", "ponder.api", "ponder.openai.common", "ponder.api.app"} <= names
    assert "ponder.api.deps" in {name for _, name in _imported(PACKAGE / "api" / "tasks.py")}


def test_only_the_http_side_imports_the_api() -> None:
    found = [
        f"{rel}:{line}: {name}"
        for rel, path in _sources()
        if not rel.startswith(MAY_IMPORT_API)
        for line, name in _imported(path)
        if _is(name, _API)
    ]
    assert not found, "modules below the API import it:\n" + "\n".join(found)


def test_only_the_api_imports_the_web_framework() -> None:
    found = [
        f"{rel}:{line}: {name}"
        for rel, path in _sources()
        if not rel.startswith(("api/", "compose.py"))
        for line, name in _imported(path)
        if any(_is(name, web) for web in _WEB)
    ]
    assert not found, "FastAPI/Starlette imported outside ponder.api:\n" + "\n".join(found)


_RUN_WORKER = """
import asyncio, os, signal, sys

from ponder.cli.run import run_worker
from ponder.config import load_settings
from ponder.runtime import WorkerRuntime

start = WorkerRuntime.start

async def start_then_stop(self):
    await start(self)  # engine, worker loops, webhook delivery, batch feeder: all running
    os.kill(os.getpid(), signal.SIGTERM)  # as `kill` stops `ponder worker`

WorkerRuntime.start = start_then_stop
settings = load_settings(engine="scripted", node_id="structure", redis_url=None,
                         sqlite_path=sys.argv[1], claim_block_ms=100)
asyncio.run(run_worker(settings, 1))
loaded = sorted(m for m in sys.modules
                if m.split(".")[0] in ("fastapi", "starlette") or m.startswith("ponder.api"))
print("started and stopped; loaded:", loaded)
assert not loaded, loaded
"""


@pytest.mark.timeout(60)
def test_ponder_worker_runs_without_fastapi(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PONDER_")}
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_WORKER, str(tmp_path / "ponder.db")],
        capture_output=True,
        text=True,
        env=env,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "started and stopped; loaded: []" in proc.stdout, proc.stdout + proc.stderr
    assert "running (1 loop(s))" in proc.stderr, proc.stderr
