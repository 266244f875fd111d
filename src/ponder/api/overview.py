"""``GET /v1/overview``: what the service is doing now, for the web console.

Two sources:

- **the store** (every deployment): pending tasks by priority (the queue depth) and the
  live workers; per configured model (``models``): its pending tasks, the live workers
  that serve it and its load state and resident memory as they registered them;
- **this process's engine status** (:class:`ponder.status.EngineStatus`, given by the
  all-in-one ``ponder serve``): tasks running in its workers, the engine's live state
  (rows running, prefilling and queued, counters), tokens/s, and tasks finished per
  status — since the process started, and per minute over the last minutes.

An API-only process (``ponder api``, the split deployment) has no engine: its overview
has the store's figures and ``engine``, ``tasks_running``, ``tokens_per_s`` and
``finished`` are null, with a ``note`` that says so (those figures live in the worker
processes).

The per-minute figures and tokens/s come from snapshots of this process's counters taken
when the overview is read (at most one a second, the last 15 minutes kept): they cover the
time the overview has been watched (``finished.since``), and nothing runs in the background
for them.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request

from ponder import metrics
from ponder.api.deps import Owner, State, engine_status, rate_limit
from ponder.states import is_terminal
from ponder.status import EngineStatus
from ponder.store.base import ModelState
from ponder.types import TaskStatus

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["operations"], dependencies=[Depends(rate_limit)])

_FINISHED = [s.value for s in TaskStatus if is_terminal(s)]
#: snapshots closer together than this replace each other
_MIN_GAP_S = 1.0
_KEEP_S = 15 * 60.0
_BUCKET_S = 60
_BUCKETS = 10
#: tokens/s is measured over this much of the latest history
_RATE_WINDOW_S = 10.0
SPLIT_NOTE = (
    "this process serves the API only (`ponder api`): engine rows, tokens/s and the tasks "
    "running and finished are known to the worker processes"
)


@dataclass(frozen=True)
class _Snapshot:
    at: float  # wall clock, s
    tokens: float
    finished: dict[str, float]


@dataclass
class _History:
    snapshots: deque[_Snapshot] = field(default_factory=deque)

    def add(self, snapshot: _Snapshot) -> None:
        """Keep one snapshot a second (the latest always fresh) for the last 15 minutes."""
        recent = self.snapshots
        if len(recent) >= 2 and recent[-1].at - recent[-2].at < _MIN_GAP_S:
            recent[-1] = snapshot
        else:
            recent.append(snapshot)
        while snapshot.at - recent[0].at > _KEEP_S:
            recent.popleft()

    def tokens_per_s(self) -> float | None:
        """Over the last ~10 s of snapshots (None before there are two)."""
        if len(self.snapshots) < 2:
            return None
        last = self.snapshots[-1]
        window = [s for s in self.snapshots if last.at - s.at <= _RATE_WINDOW_S]
        first = window[0] if len(window) >= 2 else self.snapshots[-2]
        if last.at <= first.at:
            return None
        return max(0.0, (last.tokens - first.tokens) / (last.at - first.at))

    def per_minute(self) -> list[dict[str, Any]]:
        """Tasks finished per status in each of the last minutes (oldest first), from the
        difference of successive snapshots, counted in the minute of the later one."""
        now = self.snapshots[-1].at
        start = (int(now) // _BUCKET_S - _BUCKETS + 1) * _BUCKET_S
        counts = [dict.fromkeys(_FINISHED, 0) for _ in range(_BUCKETS)]
        for before, after in itertools.pairwise(self.snapshots):
            slot = (int(after.at) - start) // _BUCKET_S
            if 0 <= slot < _BUCKETS:
                for status in _FINISHED:
                    counts[slot][status] += round(after.finished[status] - before.finished[status])
        return [{"start": _iso(start + i * _BUCKET_S), **bucket} for i, bucket in enumerate(counts)]


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def _counter(name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or {}) or 0.0


def _history(request: Request) -> _History:
    history: _History | None = getattr(request.app.state, "overview_history", None)
    if history is None:
        history = request.app.state.overview_history = _History()
    return history


def _engine_figures(status: EngineStatus, history: _History) -> dict[str, Any]:
    engine = status.engine_figures()
    # continuous engines count tokens per step; others when each sample ends
    tokens = engine.get("tokens", _counter("ponder_completion_tokens_total"))
    finished = {s: _counter("ponder_tasks_finished_total", {"status": s}) for s in _FINISHED}
    history.add(_Snapshot(time.time(), float(tokens), finished))
    return {
        "tasks_running": status.tasks_running(),
        "engine": engine,
        "tokens_per_s": history.tokens_per_s(),
        "finished": {
            "total": {s: round(n) for s, n in finished.items()},
            "since": _iso(history.snapshots[0].at),
            "bucket_s": _BUCKET_S,
            "recent": history.per_minute(),
        },
    }


def _models(
    configured: list[str], states: list[ModelState], depths: dict[str, dict[int, int]]
) -> list[dict[str, Any]]:
    """Each model (the configured ones, then any other a worker serves or a task waits
    for): pending tasks, live workers serving it, its load state (``loaded`` where one
    process has it loaded, else ``loading``, else ``unloaded``; None: no live worker) and
    resident memory (the sum over the processes that have it loaded, each once: a
    process's worker loops share one engine)."""
    names = list(dict.fromkeys([*configured, *(s.model for s in states), *depths]))
    out = []
    for name in names:
        mine = [s for s in states if s.model == name]
        found = {s.state for s in mine}
        state = next((st for st in ("loaded", "loading", "unloaded") if st in found), None)
        per_process: dict[str, float] = {}
        for s in mine:
            if s.resident_mb is not None:
                process = s.worker.rpartition("-w")[0] or s.worker
                per_process[process] = max(per_process.get(process, 0.0), s.resident_mb)
        levels = depths.get(name, {})
        out.append(
            {
                "model": name,
                "state": state,
                "resident_mb": round(sum(per_process.values()), 1) if per_process else None,
                "workers": len(mine),
                "queue": {"pending": sum(levels.values()), "by_priority": levels},
                "by_worker": [s.to_json() for s in mine],
            }
        )
    return out


@router.get("/overview")
async def overview(
    request: Request,
    state: State,
    _owner: Owner,
) -> dict[str, Any]:
    """Queue depth per priority, live workers, the models (queue, state, memory) and —
    where this process runs workers — the tasks running, the engine's rows, tokens/s and
    tasks finished per status."""
    depths = await state.store.queue_depths()
    by_model = await state.store.queue_depths_by_model()
    status = engine_status(request)
    body: dict[str, Any] = {
        "time": _iso(time.time()),
        "role": "all-in-one" if status is not None else "api",
        "queue": {
            "pending": sum(depths.values()),
            "by_priority": depths,
            "by_model": {model: sum(levels.values()) for model, levels in by_model.items()},
        },
        "workers": await state.store.live_workers(),
        "models": _models(list(state.settings.models), await state.store.served_models(), by_model),
        "tasks_running": None,
        "engine": None,
        "tokens_per_s": None,
        "finished": None,
        "note": None,
    }
    if status is None:
        body["note"] = SPLIT_NOTE
    else:
        body.update(_engine_figures(status, _history(request)))
    return body
