"""``ponder serve``'s composition: one store, a worker runtime over it (every configured
model, each on its engine loaded on demand), and the HTTP API that starts and stops the
runtime with itself and reports its engines. The API knows
neither workers nor engines; this module is where the two meet."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ponder.api import create_app
from ponder.config import Settings
from ponder.runtime import WorkerRuntime
from ponder.store import create_store

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["AllInOne", "all_in_one"]


@dataclass(frozen=True)
class AllInOne:
    """The API application and the worker runtime it starts and stops."""

    app: FastAPI
    runtime: WorkerRuntime


def all_in_one(settings: Settings, *, workers: int = 1) -> AllInOne:
    """The API and ``workers`` worker loops per configured model, sharing one store."""
    store = create_store(settings)
    runtime = WorkerRuntime(settings, store, workers=workers)
    return AllInOne(create_app(settings, store=store, services=[runtime], status=runtime), runtime)
