"""README.md's tour runs as written (issue #47): every block of the page, unchanged.

Unlike ``test_examples.py`` (every page, base URLs rewritten, ``ponder`` put on the PATH),
this runs the README's blocks as a user of a fresh clone would: from a folder holding the
clone's ``.venv`` (a link to this environment), with this environment's ``bin`` taken off
the PATH (``ponder`` must be called the way the README shows it), the Python blocks saved
as ``example.py`` and run with ``.venv/bin/python`` as the README says, and the service on
a port other than 8000, found only through ``PONDER_URL`` (so a block that ignores it
fails). A real ``ponder serve`` (scripted engine, embedded store) answers; each block must
exit 0, and where the README shows output the real output must have its shape.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.markdown import ROOT, Block, blocks
from tests.docs.service import BLOCK_TIMEOUT_S, run_block, scripted_service
from tests.docs.test_examples import shape

pytestmark = pytest.mark.timeout(300)

README = ROOT / "README.md"
#: the one command the README gives for what ``make serve`` does not install
INSTALL_OPENAI = ".venv/bin/python -m pip install openai"
#: a base URL written out: allowed only as the default of PONDER_URL
_BASE_URL = re.compile(r"(?:localhost|127\.0\.0\.1):8000")
_DEFAULTS = (
    re.compile(r"\$\{PONDER_URL:-http://127\.0\.0\.1:8000\}"),
    re.compile(r"os\.environ\.get\(\"PONDER_URL\", \"http://127\.0\.0\.1:8000\"\)"),
    re.compile(r"# PONDER_URL, else http://127\.0\.0\.1:8000"),
)


def tour() -> list[Block]:
    return [b for b in blocks(README) if b.runs]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``ponder serve`` on a free loopback port (never 8000), the scripted engine."""
    with scripted_service(tmp_path_factory.mktemp("service"), "tour", {}) as url:
        yield url


def clone_folder(tmp_path: Path) -> Path:
    """A folder laid out as a fresh clone's, as far as the tour can tell: its ``.venv``."""
    folder = tmp_path / "clone"
    folder.mkdir()
    (folder / ".venv").symlink_to(Path(sys.prefix))
    return folder


def user_env(url: str) -> dict[str, str]:
    """The user's shell: PONDER_URL set, the environment's bin not on the PATH."""
    venv_bin = {str(Path(sys.executable).parent), str(Path(sys.prefix) / "bin")}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in venv_bin]
    env = {
        **os.environ,
        "PATH": os.pathsep.join(path),
        "PONDER_URL": url,
        "NO_COLOR": "1",
        "COLUMNS": "120",
    }
    for name in ("VIRTUAL_ENV", "PONDER_API_KEY", "PYTHONPATH"):
        env.pop(name, None)
    return env


def run(block: Block, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if block.lang == "python":
        (folder / "example.py").write_text(block.code)
        argv = [".venv/bin/python", "example.py"]  # as the README says to run them
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    return run_block(argv, folder, env)


def test_the_tour_names_no_port_and_says_what_to_install() -> None:
    text = README.read_text()
    assert INSTALL_OPENAI in text
    found = tour()
    assert len(found) >= 4, [b.where for b in found]  # curl, SDK, OpenAI SDK, CLI
    for block in found:
        code = block.code
        for default in _DEFAULTS:
            code = default.sub("", code)
        assert not _BASE_URL.search(code), f"{block.where} names the port instead of PONDER_URL"
        for line in code.splitlines():
            assert not re.match(r"\s*ponder\s", line), f"{block.where}: bare `ponder` ({line})"
    imported = {
        m for b in found if b.lang == "python" for m in re.findall(r"^from (\w+)", b.code, re.M)
    }
    assert "openai" in imported  # the SDK INSTALL_OPENAI installs is what the tour imports


def test_the_readme_tour_runs_as_written(service: str, tmp_path: Path) -> None:
    folder = clone_folder(tmp_path)
    env = user_env(service)
    assert subprocess.run(["bash", "-c", "command -v ponder"], env=env).returncode != 0
    failures = []
    ran = 0
    for block in tour():
        try:
            done = run(block, folder, env)
        except subprocess.TimeoutExpired as e:
            failures.append(f"{block.where} timed out after {BLOCK_TIMEOUT_S} s: {e.stdout!r}")
            continue
        ran += 1
        out = done.stdout + done.stderr
        if done.returncode != 0:
            failures.append(f"{block.where} exited {done.returncode}:\n{out[-3000:]}")
        elif block.output is not None and (missing := shape(block.output) - shape(out)):
            failures.append(f"{block.where}: the README shows {sorted(missing)}, not in:\n{out}")
    assert not failures, "\n\n".join(failures)
    assert ran == len(tour()) >= 4
