"""The shape of the store contract: split by concern, no part too large, every backend
whole.

The contract's behaviour is checked part by part, against both stores, by the
``test_contract_*.py`` files beside this one (tasks, queue, events, objects, outbox,
liveness). ``add`` and ``advance`` stay importable from here for other test modules.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import ponder.store
from ponder.store.base import (
    EventLog,
    Lifecycle,
    Liveness,
    ObjectStore,
    Outbox,
    RateLimits,
    TaskQueue,
    TaskRecords,
    TaskStore,
    WorkQueue,
)
from ponder.store.redis import RedisStore
from ponder.store.sqlite import SqliteStore

from .helpers import ALL, add, advance, let_time_pass, make_task

__all__ = ["ALL", "add", "advance", "let_time_pass", "make_task"]

#: the most abstract methods one abstract class of the store may declare
MAX_ABSTRACT = 20
PARTS = (Lifecycle, TaskRecords, WorkQueue, EventLog, ObjectStore, Outbox, Liveness, RateLimits)


def own_abstract_methods(cls: type) -> set[str]:
    """The abstract methods ``cls`` declares itself (not those it inherits)."""
    return {
        name for name, value in vars(cls).items() if getattr(value, "__isabstractmethod__", False)
    }


def store_classes() -> list[type]:
    """Every class defined in a module of the ``ponder.store`` package."""
    modules = [ponder.store]
    for info in pkgutil.walk_packages(ponder.store.__path__, "ponder.store."):
        modules.append(importlib.import_module(info.name))
    found: dict[str, type] = {}
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return list(found.values())


def test_no_abstract_class_of_the_store_declares_more_than_20_methods() -> None:
    abstract = [c for c in store_classes() if own_abstract_methods(c)]
    assert set(PARTS) <= set(abstract)  # the walk found the contract
    too_large = {c.__qualname__: len(own_abstract_methods(c)) for c in abstract}
    assert {name: n for name, n in too_large.items() if n > MAX_ABSTRACT} == {}


def test_task_store_is_the_parts_together_and_declares_nothing_itself() -> None:
    assert own_abstract_methods(TaskStore) == set()
    assert own_abstract_methods(TaskQueue) == set()
    # (the parts are protocols: issubclass() is for runtime-checkable ones, so the MRO)
    assert {TaskRecords, WorkQueue, EventLog} <= set(TaskQueue.__mro__)
    assert set(PARTS) <= set(TaskStore.__mro__)
    declared = [name for part in PARTS for name in own_abstract_methods(part)]
    assert len(declared) == len(set(declared))  # no method belongs to two parts
    assert set(declared) == TaskStore.__abstractmethods__
    assert len(declared) == 47


@pytest.mark.parametrize("store_class", [RedisStore, SqliteStore])
def test_each_backend_implements_every_part(store_class: type) -> None:
    assert not inspect.isabstract(store_class)
    assert TaskStore in store_class.__mro__
