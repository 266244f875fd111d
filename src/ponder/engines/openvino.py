"""The default local engine: OpenVINO GenAI's continuous-batching pipeline in an engine
process of its own, under ponder's scheduler.

``PONDER_ENGINE=openvino`` (the default). The model runs in a child process
(:mod:`ponder.engines.openvino_process`: OpenVINO GenAI's ``ContinuousBatchingPipeline``,
f32 inference, ``PONDER_ENGINE_THREADS`` threads); this side is a
:class:`~ponder.engines.continuous.ContinuousEngine`, so ponder keeps its own admission:
weighted fair share across priorities, ``PONDER_ENGINE_MAX_ROWS`` rows at once, preemption
of a less urgent row, per-row time limits and cancellation at the next step. Each
iteration of the loop is one round trip: the rows that join and the rows that leave go to
the process with one ``step`` request, and the tokens each row generated in that step
come back.

- **Per-row sampling in the pipeline**: temperature, top_p and the row's seed
  (``rng_seed``); greedy rows take the argmax. With the default f16 weights (f32 compute)
  a row's text is the same alone and in any batch (``batch_invariant``); quantized
  weights (``PONDER_ENGINE_WEIGHTS=gguf``) use dynamic int8 activations, whose kernels
  depend on the batch: their seeded rows may differ across batches.
- **Text on this side**: ponder's tokenizer and chat template (read from the GGUF file
  without transformers) make the token ids; generated tokens become text here, so stop
  strings, streaming (``on_text``) and token counts are the same as every local engine's
  (:class:`~ponder.engines.textrows.TokenRow`). The log-probability of each chosen token
  comes from the pipeline.
- **Shared prefill**: the pipeline's prefix cache (on unless
  ``PONDER_ENGINE_PREFIX_CACHE_MB=0``) keeps computed prompt blocks. Rows added in the
  same step would each compute their prompt, so the rows of one prompt (a task's samples)
  wait for the first one's first token and then read the prompt from the cache; a task's
  later waves and a re-added row reuse it too. A preempted row is
  re-added with its prompt and its tokens so far; a sampled row's seed then continues as
  ``seed + tokens so far`` (its text is not the one it would have had without
  preemption).
- **A fault stays in the process, and is noticed at once**: a watcher thread per process
  waits for its exit (``waitid``, without reaping it), so a death is seen when it
  happens, idle or busy, not at the next step; so is a step not answered within
  ``_STEP_TIMEOUT_S`` (the process is killed). The model thread then logs one line (the
  pid, the signal or exit code, the rows it held, the restart count), counts it in
  ``ponder_engine_restarts_total{engine,reason}``, reports the engine down
  (:meth:`OpenVINOEngine.health`: ``/readyz`` answers 503 with it) and starts a new
  process at once; after a process that lived under :data:`_STABLE_S` and answered no
  step, or a start that failed, the next start waits longer (:data:`_BACKOFF_S`), so a
  crash loop (a corrupt model file) is a line per try and a 503 with the last error,
  never a silent spin. The rows the dead process held resume in the next one from their
  tokens so far (as after a preemption). **Blame**: a death counts only against the rows
  that were in that process (sent to it, not merely waiting to be); a row fails with an
  :class:`~ponder.errors.EngineError` naming the cause only when it was in
  :data:`POISON_DEATHS` consecutive deaths (each process it ran in died under it), since
  it may be what crashes them. The event loop never waits on any of this: it happens in
  the engine's model thread.

**Structured rows** (``request.json_schema``): each row is constrained to its own schema
in the continuous batch (``StructuredOutputConfig``, xgrammar), strict or not. A schema the
pipeline cannot compile fails that step: its strict rows fail, its other rows run
unconstrained, the step's other rows resume. A resumed structured row starts again from its
prompt with its first seed (a grammar cannot start inside an object). docs/engines.md.

The KV cache is allocated at start: ``PONDER_ENGINE_KV_TOKENS`` positions over all rows
(0: 1,024 per row of ``PONDER_ENGINE_MAX_ROWS``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ponder import metrics
from ponder.config import Settings
from ponder.engines import openvino_process
from ponder.engines.base import SampleOutput
from ponder.engines.gguf_weights import model_architecture
from ponder.engines.models import engine_files
from ponder.engines.textrows import LocalModelEngine, TokenRow
from ponder.errors import ConfigError, EngineError

__all__ = ["POISON_DEATHS", "OpenVINOEngine"]

log = logging.getLogger("ponder.engine")

#: positions of the KV cache per row when PONDER_ENGINE_KV_TOKENS is 0
_KV_PER_ROW = 1024
#: the pipeline's KV block on the CPU, in positions
_BLOCK = 32
#: how long the process may take to load the model, and to answer one step
_LOAD_TIMEOUT_S = 600.0
_STEP_TIMEOUT_S = 300.0
#: how long a closing process has to exit before it is killed
_EXIT_TIMEOUT_S = 10.0
#: a row fails once it was in this many consecutive engine process deaths
POISON_DEATHS = 2
#: a process that lived this long, or answered a step, was a good start: the restart after
#: its death is immediate
_STABLE_S = 10.0
#: the wait before a restart after 1, 2, 3, … bad starts in a row (then the last, again)
_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_IGNORED = (
    "the engine could not schedule the row: its prompt and tokens exceed the KV cache "
    "(raise PONDER_ENGINE_KV_TOKENS)"
)


@dataclass(eq=False)
class _Row(TokenRow):
    """One request as the engine sees it."""

    #: the pipeline's request id, once the row was sent to the process (None: not yet)
    request_id: int | None = None
    #: the seed the pipeline samples with (None: greedy)
    seed: int | None = None
    #: the engine process deaths it was in, consecutively (see POISON_DEATHS)
    deaths: int = 0
    #: the life (OpenVINOEngine's count of processes started) of the last death it was in
    died_in: int = -1
    #: the JSON text of the schema its decoding is constrained to (None: free text)
    schema: str | None = None


class OpenVINOEngine(LocalModelEngine["_Row"]):
    """The default local engine; see the module docstring.

    ``start()`` writes the model's cache entry the first time and starts the engine
    process; ``close()`` fails the rows in flight (EngineDeadError) and ends the process.
    """

    name = "openvino"
    row_class = _Row
    constrains_json = True
    first_token_at_prefill = False

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.weights = settings.engine_weights
        self.restarts = 0
        self._eos_ids: frozenset[int] = frozenset()
        self._context_length = 0
        self._kv_capacity = 0
        self._config: dict[str, Any] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        #: processes that became ready (a process's "life" is its number here)
        self._lives = 0
        #: when the current process became ready (engine clock), and whether it answered
        #: a step
        self._born = 0.0
        self._stepped = False
        #: bad starts in a row (the backoff's index)
        self._bad_starts = 0
        #: when the next start is due (None: a process is live, or none is wanted)
        self._restart_at: float | None = None
        #: why no process is live (None: one is); read by health() from any thread
        self._down: str | None = None
        #: a process whose exit the watcher saw (the model thread handles it)
        self._exited: subprocess.Popen[bytes] | None = None
        self._next_id = 0
        #: rows sent to the process, by request id
        self._sent: dict[int, _Row] = {}
        self._adds: list[tuple[int, list[int], dict[str, Any]]] = []
        self._drops: list[int] = []
        #: a prompt whose first row has no token yet, by its ids: its other rows wait
        self._leaders: dict[tuple[int, ...], _Row] = {}
        self._share_prefix = settings.engine_prefix_cache_mb > 0
        #: schemas (their JSON text) the pipeline could not compile, and why
        self._refused: dict[str, str] = {}

    @property
    def batch_invariant(self) -> bool:
        """Whether a row's text is the same alone and in any batch (see the module doc)."""
        return self.weights == "f16"

    @property
    def process_pid(self) -> int | None:
        """The engine process's pid (None: none runs)."""
        return self._process.pid if self._process is not None else None

    def describe(self) -> dict[str, Any]:
        down = self._down
        return {
            **super().describe(),
            "weights": self.weights,
            "process_pid": self.process_pid,
            "process_restarts": self.restarts,
            "process_state": "live" if down is None else "restarting",
            "process_error": down,
        }

    def health(self) -> str | None:
        return super().health() or self._down

    # --- set-up (model thread) --------------------------------------------------------
    def _setup(self) -> None:
        from ponder.engines.tokenizer import ChatTokenizer

        settings = self._settings
        files = engine_files(settings.model, settings.model_cache_dir, self.weights)
        self._use_tokenizer(ChatTokenizer(files))
        self._context_length, self._eos_ids = _model_facts(files / "model.gguf")
        kv_tokens = settings.engine_kv_tokens or _KV_PER_ROW * settings.engine_max_rows
        self._kv_capacity = math.ceil(kv_tokens / _BLOCK) * _BLOCK
        if self._tokenizer.eos_token_id is not None:
            self._eos_ids |= {self._tokenizer.eos_token_id}
        self._config = {
            "path": str(files / "model.gguf"),
            "threads": settings.engine_threads,
            "max_rows": settings.engine_max_rows,
            "kv_blocks": self._kv_capacity // _BLOCK,
            "step_tokens": max(settings.engine_step_tokens, settings.engine_max_rows),
            "prefix_caching": settings.engine_prefix_cache_mb > 0,
        }
        self._spawn()

    def _spawn(self) -> None:
        """Start the engine process and wait until its pipeline is built."""
        ours, theirs = socket.socketpair()
        with ours, theirs:
            process = subprocess.Popen(
                # -P: the script's folder (which holds this module, openvino.py) is not put on
                # sys.path, where it would hide the openvino package
                [sys.executable, "-P", openvino_process.__file__, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
            conn = Connection(ours.detach())
        self._process, self._conn = process, conn
        threading.Thread(
            target=self._watch, args=(process,), name=f"ponder-{self.name}-watch", daemon=True
        ).start()
        try:
            conn.send(self._config)
            answer = self._receive(_LOAD_TIMEOUT_S, "load the model")
        except (_ProcessLost, OSError):
            self._end_process()
            raise
        if answer[0] != "ready":
            self._end_process()
            raise ConfigError(f"the openvino engine cannot load {self.model_name}: {answer[1]}")
        self._lives += 1
        self._born, self._stepped = self._clock(), False
        self._down = None
        metrics.ENGINE_UP.labels(engine=self.name).set(1)

    def _watch(self, process: subprocess.Popen[bytes]) -> None:
        """The watcher thread of ``process``: wait for its exit (without reaping it: the
        model thread does) and, unless the engine ended it, wake the model thread."""
        with contextlib.suppress(ChildProcessError):  # reaped already: ended on purpose
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        if process is self._process:
            self._exited = process
            self._wake()

    def _teardown(self) -> None:
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(("close",))
        self._end_process()
        self._restart_at, self._down = None, f"the {self.name} engine is closed"
        metrics.ENGINE_UP.labels(engine=self.name).set(0)

    def _end_process(self) -> None:
        process, conn = self._process, self._conn
        self._process, self._conn = None, None
        if conn is not None:
            conn.close()
        if process is not None:
            try:
                process.wait(_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(_EXIT_TIMEOUT_S)

    def _receive(self, timeout_s: float, doing: str) -> tuple[Any, ...]:
        """The process's next answer; _ProcessLost when it died or did not answer in time."""
        conn, process = self._conn, self._process
        assert conn is not None and process is not None
        try:
            if conn.poll(timeout_s):
                answer: tuple[Any, ...] = conn.recv()
                return answer
        except (EOFError, OSError):
            pass
        try:
            code = process.wait(_EXIT_TIMEOUT_S)
            cause = f"died ({_exit_cause(code)})"
            reason = "signal" if code < 0 else "exit"
        except subprocess.TimeoutExpired:
            process.kill()
            cause = f"did not {doing} within {timeout_s:g} s and was killed"
            reason = "timeout"
        raise _ProcessLost(f"the openvino engine process {cause}", reason)

    # --- rows -------------------------------------------------------------------------
    def _open(self, row: _Row) -> None:
        row.open_text(self._tokenizer, self._context_length)
        # a row never holds more positions than the whole KV cache: it ends at "length"
        room = self._kv_capacity - len(row.prompt_ids)
        if room < 1:
            raise EngineError(
                f"the prompt is {len(row.prompt_ids)} tokens; the KV cache holds "
                f"{self._kv_capacity} (raise PONDER_ENGINE_KV_TOKENS)"
            )
        row.max_new_tokens = min(row.max_new_tokens, room)
        request = row.request
        if request.temperature > 0:
            row.seed = secrets.randbits(63) if request.seed is None else request.seed % 2**63
        if request.json_schema is not None:
            schema = json.dumps(request.json_schema, separators=(",", ":"))
            refused = self._refused.get(schema)
            if refused is not None and request.strict:
                raise EngineError(_unconstrainable(refused))
            row.schema = schema if refused is None else None

    def _prefill(self, rows: list[_Row], now: float) -> list[_Row]:
        """Rows to send with the next step: a prompt's first row at once, the rows of the
        same prompt once it has its first token (the prompt is then in the pipeline's
        prefix cache: computed once, not once per row)."""
        ready = []
        for row in rows:
            key = tuple(row.prompt_ids)
            leader = self._leaders.get(key)
            if leader is not None and leader is not row and not row.tokens:
                continue
            if not row.tokens and self._share_prefix:
                self._leaders.setdefault(key, row)
            self._send(row)
            ready.append(row)
        return ready

    def _send(self, row: _Row) -> None:
        request_id, self._next_id = self._next_id, self._next_id + 1
        row.request_id = request_id
        self._sent[request_id] = row
        if row.schema is not None and row.tokens:
            row.restart(self._tokenizer)  # a grammar starts at the object's beginning
        done = len(row.tokens)  # a preempted row resumes after its tokens so far
        seed = None if row.seed is None else (row.seed + done) % 2**63
        params = {
            "max_new_tokens": row.max_new_tokens - done,
            "eos_ids": sorted(self._eos_ids),
            "temperature": row.request.temperature,
            "top_p": row.request.top_p,
            "seed": seed,
            "json_schema": row.schema,
        }
        self._adds.append((request_id, row.prompt_ids + row.tokens, params))

    # --- supervision (model thread) ---------------------------------------------------
    def _supervise(self, now: float) -> float:
        """Handle a death the watcher saw; start a new process when one is due."""
        exited, self._exited = self._exited, None
        if exited is not None and exited is self._process:
            code = exited.wait()  # it exited: the wait reaps it at once
            self._lost(f"the openvino engine process died ({_exit_cause(code)})", _reason(code))
        if self._process is not None or self._restart_at is None:
            return -math.inf
        if now < self._restart_at:
            return self._restart_at
        self.restarts += 1
        try:
            self._spawn()
        except (ConfigError, _ProcessLost, OSError) as e:
            self._bad_starts += 1
            delay = _backoff(self._bad_starts)
            self._restart_at = self._clock() + delay
            self._down = f"the {self.name} engine process failed to start: {e}"
            metrics.ENGINE_RESTARTS.labels(engine=self.name, reason="start_failed").inc()
            log.error(
                "engine %s: start %d of its engine process failed (%s); next try in %g s",
                self.name,
                self.restarts,
                " ".join(str(e).split()),
                delay,
            )
            return self._restart_at
        self._restart_at = None
        log.info(
            "engine %s: engine process %d is live (restart %d)",
            self.name,
            self.process_pid,
            self.restarts,
        )
        return -math.inf

    def _lost(self, cause: str, reason: str) -> None:
        """The live process died (or was killed, hung): log it, count it, report the engine
        down, put its rows back for the next process and schedule that one's start."""
        process = self._process
        assert process is not None
        pending = {request_id for request_id, _, _ in self._adds}
        held = [row for rid, row in self._sent.items() if rid not in pending]
        waiting = [row for rid, row in self._sent.items() if rid in pending]
        stable = self._stepped or self._clock() - self._born >= _STABLE_S
        self._bad_starts = 0 if stable else self._bad_starts + 1
        self._end_process()
        delay = _backoff(self._bad_starts)
        self._restart_at = self._blocked_until = self._clock() + delay
        self._down = f"{cause}; it restarts"
        metrics.ENGINE_UP.labels(engine=self.name).set(0)
        metrics.ENGINE_RESTARTS.labels(engine=self.name, reason=reason).inc()
        tasks = sorted({row.request.task_id for row in held if row.request.task_id})
        log.warning(
            "engine %s: %s; pid %d, %s; restart %d %s",
            self.name,
            cause,
            process.pid,
            "idle"
            if not held
            else f"holding {len(held)} row(s) of task(s) {', '.join(tasks) or '-'}",
            self.restarts + 1,
            "follows now" if delay == 0 else f"in {delay:g} s",
        )
        self._crashed(held, waiting, cause)

    def _step(self, rows: list[_Row]) -> int:
        process = self._process
        if process is None:
            return 0  # no process: _supervise blocks the loop until one starts
        code = process.poll()
        if code is not None:  # it died since the last step: the rows to add never ran
            self._lost(f"the openvino engine process died ({_exit_cause(code)})", _reason(code))
            return 0
        adds, drops = self._adds, self._drops
        self._adds, self._drops = [], []
        sent = dict(self._sent)
        try:
            assert self._conn is not None
            self._conn.send(("step", adds, drops))
            answer = self._receive(_STEP_TIMEOUT_S, "answer a step")
        except (_ProcessLost, OSError) as e:
            if isinstance(e, _ProcessLost):
                cause, reason = str(e), e.reason
            else:  # the socket failed: a dying process (or one to end)
                try:
                    code = process.wait(_EXIT_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    code = process.wait()
                cause = f"the openvino engine process died ({_exit_cause(code)})"
                reason = _reason(code)
            self._lost(cause, reason)
            return 0
        self._stepped = True
        if answer[0] == "failed":
            self._failed(sent, answer[1], answer[2])
            return 0
        _, produced, ended = answer
        tokens = 0
        for request_id, (ids, logprobs) in produced.items():
            row = self._sent.get(request_id)
            for token, logprob in zip(ids, logprobs, strict=True):
                if row is None or row.finish is not None:
                    break
                row.append(token, logprob, self._eos_ids)
                tokens += 1
            if row is not None:
                self._unlead(row)
        for request_id, why in ended.items():
            row = self._sent.pop(request_id, None)
            if row is None or row.finish is not None:
                continue
            if why == "ignored":
                self._fail([row], EngineError(_IGNORED))
            else:
                row.finish = "length" if len(row.tokens) >= row.max_new_tokens else "stop"
        return tokens

    def _failed(self, sent: dict[int, _Row], message: str, suspects: list[int]) -> None:
        """The step failed (the process dropped every request): the rows fail, unless it
        names suspects (new schemas): those are refused and every other row resumes."""
        self._sent.clear()
        self._leaders.clear()
        refused = [sent[rid] for rid in suspects if rid in sent]
        if not refused:
            self._fail(list(sent.values()), EngineError(f"generation failed: {message}"))
            return
        self._refuse(refused, message)
        for row in sent.values():
            if row.finish is None:
                self._send(row)

    def _refuse(self, rows: list[_Row], message: str) -> None:
        """The pipeline could not compile these rows' schemas: a strict row fails, the
        others go on unconstrained, and the schemas are not tried again."""
        for row in rows:
            if row.schema is not None and row.schema not in self._refused:
                self._refused[row.schema] = message
                log.warning(
                    "engine %s: the pipeline cannot constrain to a schema of task %s (%s)",
                    self.name,
                    row.request.task_id or "-",
                    message,
                )
        # and the admitted rows of these schemas not sent yet (a prompt's later rows)
        refused = [r for r in self._joining + self._running if r.schema in self._refused]
        strict = []
        for row in {id(r): r for r in rows + refused}.values():
            row.schema = None
            if row.request.strict:
                strict.append(row)
        self._fail(strict, EngineError(_unconstrainable(message)))

    def _unlead(self, row: _Row) -> None:
        """``row`` has its first token or left: its prompt's other rows may go."""
        key = tuple(row.prompt_ids)
        if self._leaders.get(key) is row:
            del self._leaders[key]

    def _crashed(self, held: list[_Row], waiting: list[_Row], cause: str) -> None:
        """The process died: the rows it ``held`` and those ``waiting`` to be sent to it
        resume in the next process from their tokens so far; a held row that was in
        :data:`POISON_DEATHS` consecutive deaths fails instead (it may be the cause)."""
        self._sent.clear()
        self._leaders.clear()
        self._adds, self._drops = [], []
        life = self._lives
        poison = []
        for row in held:
            row.deaths = row.deaths + 1 if row.died_in == life - 1 else 1
            row.died_in = life
            if row.finish is None and row.deaths >= POISON_DEATHS:
                poison.append(row)
        self._fail(
            poison,
            EngineError(
                f"{cause} under this row {POISON_DEATHS} times in a row; the process restarts"
            ),
        )
        for row in held + waiting:
            if row.finish is None:
                self._send(row)

    def _drop(self, keep: list[int]) -> None:
        kept = {id(self._running[i]) for i in keep}
        for row in self._running:
            if id(row) in kept or row.request_id is None:
                continue
            if self._sent.pop(row.request_id, None) is not None:
                pending = len(self._adds)
                self._adds = [add for add in self._adds if add[0] != row.request_id]
                if len(self._adds) == pending:  # the process has it: end it there
                    self._drops.append(row.request_id)
            self._unlead(row)
            row.request_id = None

    def _output(self, row: _Row) -> SampleOutput:
        return row.output(self._tokenizer)


class _ProcessLost(RuntimeError):
    """The engine process died or stopped answering (``reason``: the restart metric's)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _reason(code: int) -> str:
    return "signal" if code < 0 else "exit"


def _backoff(bad_starts: int) -> float:
    """The wait before the next start after ``bad_starts`` bad starts in a row."""
    return _BACKOFF_S[min(bad_starts, len(_BACKOFF_S) - 1)]


def _model_facts(path: Path) -> tuple[int, frozenset[int]]:
    """The model's context length and its end-of-sequence token ids, from its metadata."""
    import gguf

    fields = gguf.GGUFReader(path).fields
    arch = model_architecture(fields, path)
    context = fields.get(f"{arch}.context_length")
    if context is None:
        raise ConfigError(f"{path} does not say its context length ({arch}.context_length)")
    eos = {
        int(field.contents())
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
        if (field := fields.get(key)) is not None
    }
    return int(context.contents()), frozenset(eos)


def _unconstrainable(message: str) -> str:
    return f"the openvino engine cannot constrain decoding to this schema: {message}"


def _exit_cause(code: int) -> str:
    if code < 0:
        return f"signal {-code}"
    return f"exit code {code}"
