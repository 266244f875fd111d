"""The package's layers, declared once (docs/ARCHITECTURE.md lists the same): each unit (a
module or a package of ``src/ponder``) imports only from itself or from a lower layer, so
the units of one layer know nothing of each other; no module imports another in a cycle.

Every import counts: at the top of a module, inside a function and under
``TYPE_CHECKING``. A module of ``src/ponder`` that no unit covers fails the test: a new
module takes its place in the building here (and in the document). And no module is over
600 lines, no function over 60.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import ponder

PACKAGE = Path(ponder.__file__).parent

#: bottom to top: (what the floor is, its units); a unit names a module or a package and
#: holds every module under it that no longer-named unit holds (``ponder``, the package's
#: ``__init__``, holds only itself)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaves", ("ponder.version", "ponder.errors", "ponder.ids", "ponder.aio", "ponder.metrics",
                "ponder.schema_subset",
                "ponder.status", "ponder.enhance.fences")),
    ("the vocabulary", ("ponder.types", "ponder.scheduling")),
    ("rules of the vocabulary", ("ponder.states", "ponder.schemas",
                                 "ponder.enhance.calibration", "ponder.enhance.sandbox",
                                 "ponder.store.deliveries")),
    ("configuration", ("ponder.config",)),
    ("the store's records", ("ponder.store.records", "ponder.enhance.mathverify",
                             "ponder.enhance.programs")),
    ("the store's contract", ("ponder.store.contract",)),
    ("the store, the engines, the answer types", ("ponder.store", "ponder.engines",
                                                  "ponder.enhance.answers")),
    ("what runs on them", ("ponder.ratelimit", "ponder.deltas", "ponder.batcher",
                           "ponder.webhooks", "ponder.enhance", "ponder.client_core")),
    ("tasks in and out", ("ponder.admission", "ponder.worker", "ponder.client")),
    ("the OpenAI-compatible APIs", ("ponder.openai",)),
    ("a process's halves", ("ponder.api", "ponder.runtime")),
    ("ponder serve's composition", ("ponder.compose",)),
    ("entry points", ("ponder.cli", "ponder")),
]  # fmt: skip

_FLOOR = {unit: floor for floor, (_, units) in enumerate(LAYERS) for unit in units}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def unit_of(module: str) -> str | None:
    """The longest-named unit that holds ``module``."""
    while module:
        if module in _FLOOR:
            return module
        module = module.rpartition(".")[0]
        if module == "ponder":
            return None


def imports(module: str, text: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, module of ``src/ponder``) for each import of ``module`` (or of ``text`` as if
    it were that module's): ``from a import b`` is an import of ``a.b`` where that is a
    module, else of ``a``. An import from outside the package names its top package."""
    path = MODULES.get(module, PACKAGE / "probe.py")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    source = path.read_text(encoding="utf-8") if text is None else text
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target.split(".")[0] != "ponder":
                yield node.lineno, target.split(".")[0]
                continue
            while target and target not in MODULES:  # ponder.x.name -> ponder.x
                target = target.rpartition(".")[0]
            if target and target != module:
                yield node.lineno, target


def test_the_import_walk_sees_every_form_of_import() -> None:
    # the checks below would pass vacuously if an import form were missed
    text = (
        "from ..api import deps\n"
        "from .. import metrics\n"
        "from . import common\n"
        "from ponder.types import Task\n"
        "if TYPE_CHECKING:\n"
        "    from ponder.runtime import WorkerRuntime\n"
        "def f():\n"
        "    import ponder.api.app\n"
        "    from fastapi.responses import Response\n"
    )
    found = {target for _, target in imports("ponder.openai.probe", text)}
    assert found == {
        "ponder.api.deps",
        "ponder.metrics",
        "ponder.openai.common",
        "ponder.types",
        "ponder.runtime",
        "ponder.api.app",
        "fastapi",
    }


def test_every_module_has_a_floor() -> None:
    homeless = [module for module in MODULES if unit_of(module) is None]
    assert not homeless, f"add these to a layer in LAYERS (and docs/ARCHITECTURE.md): {homeless}"
    unused = [unit for unit in _FLOOR if unit not in MODULES]
    assert not unused, f"LAYERS names units that do not exist: {unused}"


def test_each_unit_imports_only_itself_or_below() -> None:
    wrong = []
    for module in MODULES:
        unit = unit_of(module)
        assert unit is not None
        for line, target in imports(module):
            if target not in MODULES:
                continue
            other = unit_of(target)
            assert other is not None
            if other != unit and _FLOOR[other] >= _FLOOR[unit]:
                side = "beside" if _FLOOR[other] == _FLOOR[unit] else "above"
                wrong.append(f"{MODULES[module].relative_to(PACKAGE)}:{line}: {target} ({side})")
    assert not wrong, "imports that are not of a lower layer:\n" + "\n".join(wrong)


def test_no_module_imports_in_a_cycle() -> None:
    graph = {
        module: {target for _, target in imports(module) if target in MODULES} for module in MODULES
    }
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as e:
        pytest.fail(f"modules that import each other in a cycle: {' -> '.join(e.args[1])}")


#: what the HTTP API must not know: ``ponder serve`` gives it the services to start and the
#: engine status to report (ponder.status)
_WORKER_SIDE = ("ponder.runtime", "ponder.worker", "ponder.engines", "ponder.batcher")


def test_the_api_knows_nothing_of_workers_or_engines() -> None:
    found = [
        f"{MODULES[module].relative_to(PACKAGE)}:{line}: {target}"
        for module in MODULES
        if unit_of(module) == "ponder.api"
        for line, target in imports(module)
        if unit_of(target) in _WORKER_SIDE
    ]
    assert not found, "the API imports the worker side:\n" + "\n".join(found)


#: what a newcomer can read in one sitting (issue #44)
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 60


def test_no_module_or_function_is_too_long_to_read() -> None:
    long = []
    for path in MODULES.values():
        text = path.read_text(encoding="utf-8")
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(PACKAGE)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.name}, {size}")
    assert not long, "split these (at most 600 lines a module, 60 a function):\n" + "\n".join(long)


def test_only_the_api_and_what_composes_it_import_the_web_framework() -> None:
    below = [m for m in MODULES if _FLOOR[unit_of(m) or "ponder"] < _FLOOR["ponder.api"]]
    found = [
        f"{MODULES[module].relative_to(PACKAGE)}:{line}: {target}"
        for module in below
        for line, target in imports(module)
        if target in ("fastapi", "starlette")
    ]
    assert not found, "FastAPI/Starlette imported below ponder.api:\n" + "\n".join(found)


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
settings = load_settings(engine="scripted", node_id="layers", redis_url=None,
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
