"""The llama.cpp runner: the model's GGUF weights through llama.cpp's batched C API.

An optional extra (``make install-llama``: llama-cpp-python, compiled on this machine);
when it is installed, ``PONDER_MODEL_RUNNER=auto`` takes this runner for GGUF models (the
packaged ones, a ``.gguf`` file). It implements the :class:`~ponder.engines.runner.ModelRunner`
seam, so the engine's scheduler is unchanged: per-row sampling and seeds, stop strings,
logprobs, chunked and shared-prefix prefill, preemption and cancellation all stay in
``engines/transformers.py``; only the forward passes run in llama.cpp.

How it maps the seam onto llama.cpp (``llama_batch`` + ``llama_decode``, one llama
context with a **unified** KV cache):

- every row and every :class:`~ponder.engines.runner.Prefix` is a llama.cpp *sequence*
  (a sequence id, < ``n_seq_max``);
- :meth:`LlamaCppRunner.prefill` puts every item's tokens into one batch (each in a
  sequence of its own; an item that continues a prefix first copies the prefix's
  sequence with ``llama_memory_seq_cp``, which in a unified cache shares the cells, it
  copies nothing) and asks for the logits of each item's last token;
- :meth:`~LlamaCppRunner.join` copies a prefix's sequence into a new row's (shared cells
  again: five samples of one prompt hold its KV once); :meth:`~LlamaCppRunner.keep`
  removes the sequences of rows that leave;
- :meth:`~LlamaCppRunner.decode` is one batch of one token per running row;
- a prefix's sequence is removed when the last reference to the prefix goes (a
  finalizer queues its id; the model thread removes it at its next call, so llama.cpp
  is only ever called from the model thread).

The weights: the GGUF file requantized once to ``PONDER_LLAMA_WEIGHTS`` and cached
beside the converted checkpoint. ``f16``'s greedy answers are those of the float32
model (SmolLM2: 48 of 50 short problems, 296 of the quality benchmark's 300;
``bench/results/engine-agreement-*.md``); ``q8_0`` and ``q4_0`` are smaller and faster,
but llama.cpp multiplies them with activations quantized to 8 bits, which changes a
small model's answers (SmolLM2: 27 and 10 of 50) and not always a bigger one's (Qwen
0.5B on ``q8_0``: 48 of 50, 91 of 100 at float32's accuracy); ``gguf``: the file as
packaged; ``auto`` (the default): each packaged model's measured choice
(:func:`llama_weights`). The tokenizer and chat template are those of the checkpoint that
the other runners use, read without transformers
(:class:`~ponder.engines.tokenizer.ChatTokenizer`, ~100 MB less resident memory), so
every runner sees the same token ids.

The KV cache holds ``PONDER_LLAMA_KV_TOKENS`` positions over all sequences (0: 1,024 per
row of ``PONDER_ENGINE_MAX_ROWS``); llama.cpp allocates it whole at start. It is unified
so that one row may take most of it and a prompt's samples share its cells; llama.cpp's
per-sequence streams (``kv_unified = false``) decoded 1.14-1.2 x faster at 16-32 rows of
~100 positions on this 2-core CPU (no difference at 8), but would cap every row at an
equal share allocated up front. A prefill or
decode that finds no room raises :class:`KVCacheFull`; the engine fails those rows with
that message.
"""

from __future__ import annotations

import ctypes
import importlib.util
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy

from ponder.config import Settings
from ponder.engines.models import (
    PACKAGED_MODELS,
    Progress,
    _source,
    _to_stderr,
    assemble_gguf,
    checkpoint_dir,
    load_tokenizer,
)
from ponder.engines.runner import Logits, ModelRunner, Prefill, Prefix
from ponder.errors import ConfigError

__all__ = [
    "KVCacheFull",
    "LlamaCppRunner",
    "available",
    "gguf_weights",
    "llama_weights",
    "select_llama_runner",
]

LlamaWeights = Literal["f16", "q8_0", "q4_0", "gguf"]
#: llama.cpp's ``llama_ftype`` of each requantization
_FTYPES = {"q8_0": 7, "q4_0": 2, "f16": 1}
#: positions of the KV cache per row when PONDER_LLAMA_KV_TOKENS is 0
_KV_PER_ROW = 1024
#: tokens per llama_decode call (llama.cpp splits a bigger batch itself, but logits of
#: earlier calls must be read before the next one)
_BATCH = 512
#: llama.cpp's sequence ids are below LLAMA_MAX_SEQ (256); a context reserves logits for
#: as many outputs as it has sequences (n_vocab floats each), so it gets what it needs: its
#: rows, this many for the step's new prefixes and chunked prefills, and as many cached
#: prefixes as rows
_LLAMA_MAX_SEQ = 256
_STEP_SEQS = 32

_init_lock = threading.Lock()
_initialized = False


class KVCacheFull(RuntimeError):
    """No room left in the llama.cpp KV cache for a batch."""


def available() -> bool:
    """Whether the llama.cpp extra (llama-cpp-python) is installed."""
    return importlib.util.find_spec("llama_cpp") is not None


def _lib() -> Any:
    """The llama_cpp module, its backend initialised once per process."""
    global _initialized
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - checked by available() first
        raise ConfigError(
            "PONDER_MODEL_RUNNER=llama needs the llama.cpp extra: run `make install-llama`"
        ) from e
    with _init_lock:
        if not _initialized:
            # the callback must outlive every llama.cpp call: kept at module level
            _QUIET.append(llama_cpp.llama_log_callback(_quiet))
            llama_cpp.llama_log_set(_QUIET[0], None)
            llama_cpp.llama_backend_init()
            _initialized = True
    return llama_cpp


def _quiet(level: int, text: bytes, user_data: Any) -> None:
    """llama.cpp's log callback: silent (its load messages are many lines per start)."""


_QUIET: list[Any] = []


def gguf_weights(
    spec: str, cache_dir: str | Path, weights: LlamaWeights, progress: Progress | None = None
) -> Path:
    """The GGUF file of model ``spec`` with ``weights``, made once and cached.

    ConfigError when ``spec`` is a checkpoint directory (llama.cpp reads GGUF files).
    """
    report = progress or _to_stderr
    source = _source(spec)
    if isinstance(source, Path):
        raise ConfigError(
            f"the llama.cpp runner reads GGUF models, and PONDER_MODEL={spec!r} is a checkpoint "
            "directory: give a .gguf file or a packaged model name, or set "
            "PONDER_MODEL_RUNNER=auto"
        )
    packaged = source.packaged
    if weights == "gguf" and source.file is not None:
        return source.file
    if weights == "gguf" and packaged is not None and len(packaged.parts) == 1:
        return packaged.locate()[0]
    target = Path(cache_dir).expanduser() / f"{source.cache_name}.{weights}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
        work = Path(tmp)
        if packaged is not None:
            report(f"checking the packaged model {packaged.name} ...")
            original = assemble_gguf(packaged.locate(), packaged.sha256, work / "model.gguf")
        else:
            assert source.file is not None
            original = source.file
        if weights == "gguf":
            made = original
        else:
            report(f"requantizing {original.name} to {weights} for llama.cpp (first start only)")
            made = work / "requantized.gguf"
            lc = _lib()
            params = lc.llama_model_quantize_default_params()
            params.ftype = _FTYPES[weights]
            params.allow_requantize = True
            rc = lc.llama_model_quantize(
                str(original).encode(), str(made).encode(), ctypes.byref(params)
            )
            if rc != 0:
                raise ConfigError(f"llama.cpp could not requantize {original} to {weights}")
        made.replace(target)
    return target


def llama_weights(settings: Settings) -> LlamaWeights:
    """The weights ``settings`` ask for; ``auto``: the packaged model's measured choice
    (:attr:`~ponder.engines.models.PackagedModel.llama_weights`), else f16."""
    if settings.llama_weights != "auto":
        return settings.llama_weights
    packaged = PACKAGED_MODELS.get(settings.model)
    return packaged.llama_weights if packaged is not None else "f16"


def select_llama_runner(
    settings: Settings, progress: Progress | None = None
) -> LlamaCppRunner | None:
    """The llama.cpp runner where ``settings`` ask for it; None: another runner.

    ``llama`` insists (ConfigError when the extra is missing or the model is not GGUF);
    ``auto`` takes it when the extra is installed, the model is GGUF and the weights are
    not the native runner's int8.
    """
    choice = settings.model_runner
    if choice in ("native", "hf"):
        return None
    if choice == "auto":
        if not available() or settings.model_weights == "int8":
            return None
        if isinstance(_source(settings.model), Path):
            return None  # a checkpoint directory: the torch runners
    elif settings.model_weights == "int8":
        raise ConfigError(
            "PONDER_MODEL_WEIGHTS=int8 is the native runner's: with PONDER_MODEL_RUNNER=llama "
            "choose the weights with PONDER_LLAMA_WEIGHTS"
        )
    return LlamaCppRunner.load(settings, progress)


class _Seq:
    """A prefix's llama.cpp sequence; its id is released when this object is collected."""

    __slots__ = ("__weakref__", "seq")

    def __init__(self, seq: int, release: Any) -> None:
        self.seq = seq
        weakref.finalize(self, release, seq)


class LlamaCppRunner(ModelRunner):
    """The :class:`ModelRunner` over llama.cpp (see the module docstring).

    Build it with :meth:`load`; :meth:`close` frees llama.cpp's memory at once.
    """

    #: llama.cpp multiplies one row with another kernel than two or more, which rounds
    #: float16 differently (logits ~0.02 apart): greedy rows agree except at near ties,
    #: a seeded row's draw can differ alone and in a batch
    batch_invariant = False

    def __init__(
        self,
        path: Path,
        tokenizer: Any,
        eos_ids: frozenset[int],
        *,
        threads: int,
        kv_tokens: int,
        max_rows: int,
    ) -> None:
        if max_rows + _STEP_SEQS > _LLAMA_MAX_SEQ:
            raise ConfigError(
                f"the llama.cpp runner runs at most {_LLAMA_MAX_SEQ - _STEP_SEQS} rows at once: "
                "lower PONDER_ENGINE_MAX_ROWS"
            )
        lc = self._lc = _lib()
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        model_params = lc.llama_model_default_params()
        model = lc.llama_model_load_from_file(str(path).encode(), model_params)
        if not model:
            raise ConfigError(f"llama.cpp could not load {path}")
        params = lc.llama_context_default_params()
        params.n_ctx = kv_tokens
        params.n_batch = params.n_ubatch = _BATCH
        seqs = min(_LLAMA_MAX_SEQ, 2 * max_rows + _STEP_SEQS)
        params.n_seq_max = seqs
        params.kv_unified = True
        params.no_perf = True
        if threads > 0:
            params.n_threads = params.n_threads_batch = threads
        ctx = lc.llama_init_from_model(model, params)
        if not ctx:
            lc.llama_model_free(model)
            raise ConfigError(
                f"llama.cpp could not make a context of {kv_tokens} KV positions for {path}: "
                "lower PONDER_LLAMA_KV_TOKENS"
            )
        batch = lc.llama_batch_init(_BATCH, 0, 1)
        self._ctx, self._batch = ctx, batch
        self._memory = lc.llama_get_memory(ctx)
        self._vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
        self.context_length = min(int(lc.llama_model_n_ctx_train(model)), kv_tokens)
        self.kv_tokens = kv_tokens
        self.max_prefixes = max(0, seqs - max_rows - _STEP_SEQS)
        self._seqs = seqs
        self._free = list(range(seqs - 1, -1, -1))
        #: sequence ids whose prefix was collected: removed at the next call
        self._released: list[int] = []
        #: the running batch: (sequence id, next position) per row
        self._running: list[tuple[int, int]] = []
        #: bytes of KV cache per position (for the prefix cache's budget)
        self._position_bytes = _kv_bytes_per_position(lc, model)
        self._finalizer = weakref.finalize(self, _free_all, lc, model, ctx, batch)

    @classmethod
    def load(cls, settings: Settings, progress: Progress | None = None) -> LlamaCppRunner:
        """The runner for ``settings.model``, requantizing its GGUF file on first use."""
        weights = llama_weights(settings)
        path = gguf_weights(settings.model, settings.model_cache_dir, weights, progress)
        tokenizer, eos_ids = load_tokenizer(
            checkpoint_dir(settings.model, settings.model_cache_dir, progress), light=True
        )
        kv_tokens = settings.llama_kv_tokens or _KV_PER_ROW * settings.engine_max_rows
        return cls(
            path,
            tokenizer,
            eos_ids,
            threads=settings.torch_threads,
            kv_tokens=kv_tokens,
            max_rows=settings.engine_max_rows,
        )

    def close(self) -> None:
        """Free the model and its context now (else when the runner is collected)."""
        self._finalizer()

    @property
    def rows(self) -> int:
        return len(self._running)

    # --- sequences --------------------------------------------------------------------

    def _take(self) -> int:
        self._collect()
        if not self._free:
            raise KVCacheFull(f"all {self._seqs} llama.cpp sequences are in use")
        return self._free.pop()

    def _drop_seq(self, seq: int) -> None:
        self._lc.llama_memory_seq_rm(self._memory, seq, -1, -1)
        self._free.append(seq)

    def _collect(self) -> None:
        while self._released:
            self._drop_seq(self._released.pop())

    def _prefix(self, seq: int, length: int, logits: Logits) -> Prefix:
        return Prefix(
            length=length,
            logits=logits,
            nbytes=length * self._position_bytes,
            state=_Seq(seq, self._released.append),
        )

    # --- forward passes ---------------------------------------------------------------

    def _run(self, entries: list[tuple[int, int, int, bool]]) -> Logits:
        """Decode (token, position, sequence, wants logits) entries; the wanted logits
        (copied out of llama.cpp's buffer, which the next call overwrites)."""
        lc, batch = self._lc, self._batch
        wanted = sum(1 for entry in entries if entry[3])
        out = numpy.empty((wanted, self._vocab), numpy.float32)
        if not entries:
            return out
        row = 0
        for first in range(0, len(entries), _BATCH):
            chunk = entries[first : first + _BATCH]
            for i, (token, position, seq, wants) in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = position
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = wants
            batch.n_tokens = len(chunk)
            rc = lc.llama_decode(self._ctx, batch)
            if rc == 1:
                raise KVCacheFull(
                    f"the llama.cpp KV cache ({self.kv_tokens} positions) is full: raise "
                    "PONDER_LLAMA_KV_TOKENS or lower PONDER_ENGINE_MAX_ROWS"
                )
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            for i, entry in enumerate(chunk):
                if entry[3]:
                    pointer = lc.llama_get_logits_ith(self._ctx, i)
                    ctypes.memmove(out[row].ctypes.data, pointer, out[row].nbytes)
                    row += 1
        return out

    def prefill(self, items: Sequence[Prefill]) -> list[Prefix]:
        taken: list[int] = []
        ends: list[int] = []
        logits: list[Logits] = []
        try:
            for item in items:
                if not item.tokens:
                    raise ValueError("a prefill item needs at least one token")
                start = item.prefix.length if item.prefix is not None else 0
                ends.append(start + len(item.tokens))
                if ends[-1] > self.context_length:
                    raise ValueError(
                        f"{ends[-1]} tokens exceed the context of {self.context_length}"
                    )
                seq = self._take()
                taken.append(seq)
                if item.prefix is not None:
                    source: _Seq = item.prefix.state
                    self._lc.llama_memory_seq_cp(self._memory, source.seq, seq, -1, -1)
                # one pass per item: how llama.cpp splits and rounds a pass depends on its
                # token count, so a prompt's logits must not depend on what else is prefilled
                last = len(item.tokens) - 1
                entries = [
                    (token, start + i, seq, i == last) for i, token in enumerate(item.tokens)
                ]
                logits.append(self._run(entries)[0])
        except BaseException:
            for seq in taken:
                self._drop_seq(seq)
            raise
        return [
            self._prefix(seq, end, row) for seq, end, row in zip(taken, ends, logits, strict=True)
        ]

    def join(self, prefix: Prefix) -> None:
        seq = self._take()
        source: _Seq = prefix.state
        self._lc.llama_memory_seq_cp(self._memory, source.seq, seq, -1, -1)
        self._running.append((seq, prefix.length))

    def keep(self, rows: Sequence[int]) -> None:
        kept = set(rows)
        for index, (seq, _) in enumerate(self._running):
            if index not in kept:
                self._drop_seq(seq)
        self._running = [self._running[i] for i in rows]

    def decode(self, tokens: Sequence[int]) -> Logits:
        if len(tokens) != len(self._running):
            raise ValueError(f"{len(tokens)} tokens for {len(self._running)} running rows")
        self._collect()
        if any(position >= self.context_length for _, position in self._running):
            raise ValueError(f"a row reached the context of {self.context_length}")
        entries = [
            (token, position, seq, True)
            for token, (seq, position) in zip(tokens, self._running, strict=True)
        ]
        logits = self._run(entries)
        self._running = [(seq, position + 1) for seq, position in self._running]
        return logits


def _kv_bytes_per_position(lc: Any, model: Any) -> int:
    """Bytes of f16 keys and values one position takes over all layers."""
    layers = int(lc.llama_model_n_layer(model))
    heads = int(lc.llama_model_n_head(model))
    kv_heads = int(lc.llama_model_n_head_kv(model)) or heads
    head_dim = int(lc.llama_model_n_embd(model)) // max(1, heads)
    return layers * 2 * kv_heads * head_dim * 2


def _free_all(lc: Any, model: Any, ctx: Any, batch: Any) -> None:
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
