"""The live view of a task in the terminal (``ponder submit --wait``, ``ponder wait``):
samples finished, the vote so far, the preliminary answer and each sample's text as the
model writes it."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rich.columns import Columns
from rich.console import RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ponder.cli.base import err_console
from ponder.config.models import DEFAULT_MODEL
from ponder.types import Result, Sample, SampleStatus, Task

if TYPE_CHECKING:
    from ponder.client import Client, TaskEvent

__all__ = ["TaskProgress", "follow"]


class TaskProgress:
    """The live view of a running task, built from its events: samples finished out of
    planned, the vote so far, the preliminary answer, and one line per sample whose text
    grows as the model writes it (``delta`` events), then shows its answer."""

    def __init__(self, task: Task, width: int = 100) -> None:
        self.task_id = task.id
        self.model = task.model
        self.status = task.status.value
        self.planned = task.samples_planned
        self.finished = 0
        self.votes: Counter[str] = Counter()
        self.preliminary: Result | None = None
        #: each sample's text so far, and the mark of its state
        self.texts: dict[int, str] = {}
        self.marks: dict[int, str] = {}
        self.width = width

    def apply(self, event: TaskEvent) -> None:
        if event.status is not None:
            self.status = event.status.value
        if (delta := event.delta) is not None:
            self.texts[delta.index] = delta.apply(self.texts.get(delta.index, ""))
            self.marks.setdefault(delta.index, _WRITING)
        if (sample := event.sample) is not None:
            self.finished += 1
            self.texts[sample.index] = sample.text or self.texts.get(sample.index, "")
            self.marks[sample.index] = _sample_mark(sample)
            if sample.status == SampleStatus.done and sample.answer is not None:
                self.votes[sample.answer] += 1
        if (preliminary := event.result) is not None:
            self.preliminary = preliminary
        if (task := event.task) is not None:
            self.planned = task.samples_planned
            self.model = task.model  # an escalated task ends on its stronger model

    def render(self) -> RenderableType:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column()
        model = "" if self.model == DEFAULT_MODEL else f" · {self.model}"  # ponder: the one
        grid.add_row("task", f"[bold]{self.task_id}[/bold] {self.status}{model}")
        if self.status == "expired":
            grid.add_row("", "not started within its queue_timeout_s: it never ran")
        bar = ProgressBar(total=max(self.planned, 1), completed=self.finished, width=30)
        grid.add_row("samples", Columns([bar, f"{self.finished}/{self.planned}"]))
        tally = " · ".join(f"{a}: {n}" for a, n in self.votes.most_common(5)) or "none yet"
        grid.add_row("votes", tally)
        if self.preliminary is not None:
            grid.add_row(
                "preliminary",
                f"[bold]{self.preliminary.answer}[/bold] "
                f"(confidence {self.preliminary.confidence:.2f})",
            )
        room = max(20, self.width - 16)  # the label column and the padding
        for index in sorted(self.texts):
            mark = self.marks.get(index, _WRITING)
            line = Text(f"{mark} ", style="dim" if mark == _WRITING else "bold", no_wrap=True)
            line.append(_tail(self.texts[index], room - len(mark) - 1), style="default")
            grid.add_row(f"#{index}", line)
        return grid


_WRITING = "▸"


def _sample_mark(sample: Sample) -> str:
    """A finished sample's state in the live view: its answer, or why it has none."""
    if sample.status == SampleStatus.done:
        return f"= {sample.answer}" if sample.answer is not None else "= (no answer)"
    return sample.status.value


def _tail(text: str, width: int) -> str:
    """The end of ``text`` on one line of ``width`` characters (the end is what grows)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else "…" + flat[-(width - 1) :]


def follow(client: Client, task: Task, timeout_s: float, *, live: bool) -> Task:
    """Wait for the task's end on its event stream, showing progress where it can."""
    if not (live and err_console.is_terminal):
        return client.wait(task.id, timeout=timeout_s)
    from rich.live import Live

    progress = TaskProgress(task, width=err_console.width)
    with Live(progress.render(), console=err_console, transient=True) as view:
        for event in client.events(task.id, timeout=timeout_s):
            progress.apply(event)
            view.update(progress.render(), refresh=True)
    return client.get(task.id)
