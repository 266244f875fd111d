"""``ponder submit --wait``'s live view shows each sample's text growing as it is written."""

from __future__ import annotations

import re

import pytest

from ponder.config import Settings
from tests.conftest import LiveServer
from tests.test_cli import run_cli, strip_ansi

pytestmark = pytest.mark.timeout(90)


async def test_each_sample_line_grows_then_shows_its_answer(sqlite_settings: Settings) -> None:
    slow = sqlite_settings.model_copy(update={"scripted_step_ms": [25.0, 0.0]})
    async with LiveServer(slow, workers=1) as live:
        tty = {"TTY_COMPATIBLE": "1", "COLUMNS": "100", "LINES": "30", "NO_COLOR": "1"}
        code, out, err = await run_cli(
            "submit", "What is 2+3? [[answers: 5, 5, 4]] [[tokens: 40]]", "--samples", "3",
            "--wait", "--url", live.url, env=tty,
        )  # fmt: skip
    assert code == 0, err
    screen_lines = re.split(r"[\r\n]", strip_ansi(err))
    # sample 0's line, frame after frame: being written (▸), then its answer (= 5)
    found = (re.match(r"#0 +(▸|= \S+) (.*?)\s*$", line) for line in screen_lines)
    lines = [(m[1], m[2]) for m in found if m]
    writing = [text for mark, text in lines if mark == "▸"]
    assert len(set(writing)) >= 2, lines  # it grew while the sample ran
    assert not any("The answer is" in text for text in writing[:1])
    assert any(mark == "= 5" and text.endswith("The answer is 5.") for mark, text in lines)
    assert all(len(mark) + len(text) + 12 <= 100 for mark, text in lines)  # one line each
    assert "answer: 5" in strip_ansi(out)
