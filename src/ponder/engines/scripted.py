"""A deterministic engine for tests and scheduler benchmarks — never a model substitute.

It schedules like the local model engine (the same :class:`ContinuousEngine` loop: rows
join and leave per step, admission by priority), with a modelled step latency in place
of a forward pass. Directives in the prompt steer it, so black-box tests can script
outcomes:

- ``[[answers: 42, 42, 17]]`` — sample *i* answers the *i*-th value (cycling); the values
  ``fail`` and ``hang`` make that one sample fail or never end (until cancelled or timed
  out).
- ``[[tokens: N]]`` — each sample is N words long (default 12); its text is emitted word
  by word, one word per step, and ends "The answer is X." ``[[tokens: 20, 20, 400]]``:
  sample *i* is the *i*-th length (cycling).
- ``[[sleep_ms: N]]`` — each sample makes no progress for its first N ms (it holds its
  slot; other rows go on).
- ``[[fail]]`` — every sample fails (EngineError).
- ``[[hang]]`` — every sample never ends until cancelled or timed out.

Without ``answers`` the answer is a number derived from the prompt, so it is stable.

**Structured rows** (``request.json_schema``): the text is a JSON object valid for the
schema (:mod:`ponder.engines.scripted_json`: every property, strings a word or an enum
value, numbers inside their bounds, arrays of 1 to 3 items), emitted a space-separated
piece per step; ``tokens`` does not apply (``max_new_tokens`` still cuts the text, which is
then not JSON). Each value is derived from the prompt and the schema, so by default every
sample gives the same object; directives steer it per sample (*i*-th value, cycling):

- ``[[answers: 42, 17]]`` — the root property ``answer``, where the schema has one, is
  the sample's answer (as its type: ``42`` a number for a number, a string for a string);
- ``[[fields: name = Ann | Ann | Bob; age = 30 | 31]]`` — the fields at these paths
  (dotted for nested ones: ``person.name``, ``tags.0``) take the sample's value, as the
  field's type where the text is one (``30``), else as JSON, else as text; a value the
  schema refuses is kept: a test can make a sample invalid on purpose;
- ``[[vary: name, tags]]`` — these fields (and what is under them; ``*``: all) are drawn
  per sample (from its index and seed), so samples differ there;
- ``[[json: ok, cut]]`` — ``cut``: that sample's text stops in the middle of the object
  (not JSON).
``PONDER_SCRIPTED_STEP_MS="base,per_row"`` makes each step take ``base + per_row * rows``
ms (rows: the rows advanced by the step): a latency model of a batched accelerator.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ponder.config import Settings
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.engines.continuous import ContinuousEngine, Row
from ponder.engines.scripted_json import build, coerce
from ponder.errors import EngineError

__all__ = ["ScriptedEngine", "parse_directives"]

_DIRECTIVE_RE = re.compile(r"\[\[\s*([a-z_]+)\s*(?::\s*([^\]]*))?\]\]")
_LEAD = ["Let", "me", "work", "through", "this", "step", "by", "step."]
#: words per sample without a ``tokens`` directive
DEFAULT_TOKENS = len(_LEAD) + 4


def parse_directives(text: str) -> dict[str, str]:
    """``{"answers": "42, 17", "fail": ""}`` from the ``[[...]]`` directives in ``text``."""
    return {m[1]: (m[2] or "").strip() for m in _DIRECTIVE_RE.finditer(text)}


@dataclass(eq=False)
class _ScriptedRow(Row):
    words: list[str] = field(default_factory=list)
    emitted: int = 0
    prompt_tokens: int = 0


class ScriptedEngine(ContinuousEngine[_ScriptedRow]):
    """Answers from directives at a modelled step latency. See the module docstring."""

    name = "scripted"
    model_name = "scripted"
    row_class = _ScriptedRow
    constrains_json = True

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        step_ms: Sequence[float] = (0.0, 0.0),
        max_rows: int = 16,
        max_queue: int = 1000,
        max_wait_ms: float = 0.0,
        quotas: Sequence[int] = (4, 3, 2, 2, 1, 1),
        preempt_after_ms: float = 0.0,
    ) -> None:
        if settings is not None:
            step_ms = settings.scripted_step_ms
            max_rows, max_queue = settings.engine_max_rows, settings.engine_max_queue
            max_wait_ms, quotas = settings.engine_max_wait_ms, settings.priority_quotas
            preempt_after_ms = settings.engine_preempt_after_ms
        super().__init__(
            max_rows=max_rows,
            max_queue=max_queue,
            max_wait_ms=max_wait_ms,
            quotas=quotas,
            preempt_after_ms=preempt_after_ms,
        )
        self.base_ms, self.per_row_ms = (float(v) for v in step_ms)

    def step_latency_s(self, rows: int) -> float:
        return (self.base_ms + self.per_row_ms * rows) / 1000

    def _setup(self) -> None:
        pass

    def _open(self, row: _ScriptedRow) -> None:
        text = _prompt_text(row.request)
        directives = parse_directives(text)
        answer = _answer_for(row.request, directives)
        if answer == "fail":
            raise EngineError(f"scripted failure of sample {row.request.sample_index}")
        row.prompt_tokens = len(text.split())
        if answer == "hang":
            row.ready_at = math.inf
            return
        try:
            sleep_ms = float(directives.get("sleep_ms") or 0)
            count = max(1, int(_nth(directives.get("tokens"), row.request) or DEFAULT_TOKENS))
        except ValueError as e:
            raise EngineError(f"scripted: a directive needs a number: {e}") from e
        row.ready_at = row.started + sleep_ms / 1000
        if row.request.json_schema is not None:
            row.words = _structured_text(row.request, directives).split(" ")
            return
        tail = ["The", "answer", "is", f"{answer}."]
        lead = list(itertools.islice(itertools.cycle(_LEAD), max(0, count - len(tail))))
        row.words = (lead + tail)[-count:]

    def _prefill(self, rows: list[_ScriptedRow], now: float) -> list[_ScriptedRow]:
        return list(rows)

    def _step(self, rows: list[_ScriptedRow]) -> None:
        latency = self.step_latency_s(len(rows))
        if latency > 0:
            time.sleep(latency)
        for row in rows:
            word = row.words[row.emitted]
            row.emit(word if row.emitted == 0 else " " + word)
            row.emitted += 1
            if row.emitted >= len(row.words):
                row.finish = "stop"
            elif row.emitted >= row.request.max_new_tokens:
                row.finish = "length"

    def _drop(self, keep: list[int]) -> None:
        pass

    def _output(self, row: _ScriptedRow) -> SampleOutput:
        assert row.finish is not None
        return SampleOutput(
            text=" ".join(row.words[: row.emitted]),
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.emitted,
            finish_reason=row.finish,
            mean_logprob=-0.25 if row.emitted else None,
            token_logprobs=[-0.25] * row.emitted,
        )


def _prompt_text(request: SampleRequest) -> str:
    if request.messages is not None:
        return "\n".join(str(m.get("content", "")) for m in request.messages)
    return request.prompt or ""


def _nth(values: str | None, request: SampleRequest) -> str | None:
    """The request's sample's value of a comma-separated directive (cycling)."""
    parts = [v.strip() for v in (values or "").split(",") if v.strip()]
    return parts[request.sample_index % len(parts)] if parts else None


def _structured_text(request: SampleRequest, directives: dict[str, str]) -> str:
    """The JSON text of a structured row (see the module docstring)."""
    schema = request.json_schema or {}
    base = hashlib.sha256(f"{_prompt_text(request)}\n{json.dumps(schema)}".encode()).hexdigest()
    vary = [v.strip() for v in directives.get("vary", "").split(",") if v.strip()]

    def pick(path: str) -> random.Random:
        varies = any(v == "*" or path == v or path.startswith(v + ".") for v in vary)
        if varies:
            return random.Random(f"{request.seed}:{request.sample_index}:{path}")
        return random.Random(f"{base}:{path}")

    overrides: dict[str, Any] = {}
    answer = _nth(directives.get("answers"), request)
    properties = schema.get("properties", {})
    if answer is not None and "answer" in properties:
        overrides["answer"] = coerce(answer, properties["answer"])
    for part in directives.get("fields", "").split(";"):
        path, _, values = (p.strip() for p in part.partition("="))
        if path:
            choices = values.split("|")
            value = choices[request.sample_index % len(choices)]
            overrides[path] = coerce(value, _at(schema, path))
    text = json.dumps(build(schema, pick, overrides), ensure_ascii=False)
    if _nth(directives.get("json"), request) == "cut":
        text = text[: len(text) // 2]
    return text


def _at(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The subschema at a dotted path (None: the schema has none there)."""
    node: Any = schema
    for part in path.split("."):
        # an array's item (``part`` is its index), else an object's property
        node = node["items"] if "items" in node else node.get("properties", {}).get(part)
        if not isinstance(node, dict):
            return None
    found: dict[str, Any] = node
    return found


def _answer_for(request: SampleRequest, directives: dict[str, str]) -> str:
    if "fail" in directives:
        return "fail"
    if "hang" in directives:
        return "hang"
    value = _nth(directives.get("answers"), request)
    if value:
        return value
    digest = hashlib.sha256(_prompt_text(request).encode()).digest()
    return str(int.from_bytes(digest[:4], "big") % 1000)
