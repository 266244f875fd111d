"""The worker runtime's composition: the static batcher in front of an engine must fit it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ponder.config import load_settings
from ponder.errors import ConfigError
from ponder.runtime import WorkerRuntime
from ponder.store import create_store


def test_static_batches_must_fit_the_engine(tmp_path: Path) -> None:
    def runtime(**overrides: object) -> WorkerRuntime:
        settings = load_settings(
            engine="scripted", batching="static", batch_max_size=8, batch_max_concurrent=3,
            redis_url=None, sqlite_path=str(tmp_path / "ponder.db"), **overrides,
        )  # fmt: skip
        return WorkerRuntime(settings, create_store(settings))

    # 8 x 3 rows at once, an engine that runs 16: one line naming what to change
    with pytest.raises(
        ConfigError, match=r"more than the engine takes \(PONDER_ENGINE_MAX_ROWS 16"
    ):
        runtime(engine_max_rows=16)
    fits = runtime(engine_max_rows=24)
    assert fits.batcher is not None and fits.batcher.max_concurrent_batches == 3
