"""What the local engines share about a row's text: prompt ids, stop strings, streaming.

Both local engines (OpenVINO GenAI's, in an engine process of its own, and the
transformers one) tokenize with ponder's tokenizer and chat template, and turn the tokens
a row generates into text the same way: a :class:`TokenRow` takes each new token
(:meth:`TokenRow.append`), decides whether the row ended (end of sequence, a stop string,
its token budget), releases streamed text without the start of a possible stop string,
and builds the row's :class:`~ponder.engines.base.SampleOutput`.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ponder.engines.base import SampleOutput, SampleRequest
from ponder.engines.continuous import ContinuousEngine, Row
from ponder.errors import EngineError

if TYPE_CHECKING:
    from ponder.config import Settings

__all__ = [
    "Detokenizer",
    "LocalModelEngine",
    "TokenRow",
    "complete_text",
    "encode_prompt",
    "stop_position",
]


@dataclass(eq=False)
class TokenRow(Row):
    """A row whose model generates token ids (see the module docstring)."""

    prompt_ids: list[int] = field(default_factory=list)
    max_new_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: the request's non-empty stop strings
    stop: list[str] = field(default_factory=list)
    #: the completion cut before a stop string, once one appeared
    stopped_text: str | None = None
    #: incremental text, when the row streams or has stop strings
    detok: Detokenizer | None = None
    #: characters of ``detok.text`` already emitted
    emitted: int = 0

    def open_text(self, tokenizer: Any, context_length: int) -> None:
        """Tokenize the request and check it (EngineError fails the row alone)."""
        request = self.request
        ids = encode_prompt(tokenizer, request)
        if len(ids) >= context_length:
            raise EngineError(
                f"the prompt is {len(ids)} tokens; the model's context is {context_length}"
            )
        if request.max_new_tokens < 1:
            raise EngineError(f"max_new_tokens must be at least 1, not {request.max_new_tokens}")
        if not 0 < request.top_p <= 1 or request.temperature < 0:
            raise EngineError("need temperature >= 0 and 0 < top_p <= 1")
        self.prompt_ids = ids
        self.max_new_tokens = min(request.max_new_tokens, context_length - len(ids))
        self.stop = [s for s in request.stop if s]
        if self.stop or request.on_text is not None:
            self.detok = Detokenizer(tokenizer)

    def append(self, token: int, logprob: float, eos_ids: Collection[int]) -> None:
        """Add a generated token and decide whether the row is finished."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        if token in eos_ids:
            self.finish = "stop"
        elif self.detok is not None:
            self.detok.add(self.tokens)
            text = self.detok.text
            cut = stop_position(text, self.stop)
            if cut is not None:
                self.stopped_text = text[:cut]
                self.finish = "stop"
            # hold back what could still become the start of a stop string
            safe = len(text) if cut is None else cut
            if self.stop and cut is None:
                safe -= max(len(s) for s in self.stop) - 1
            if safe > self.emitted:
                self.emit(text[self.emitted : safe])
                self.emitted = safe
        if self.finish is None and len(self.tokens) >= self.max_new_tokens:
            self.finish = "length"

    def restart(self, tokenizer: Any) -> None:
        """Forget the tokens generated so far: the row generates again from its prompt.

        The streamed text stays as emitted: text is emitted again only past it (a row that
        draws the same tokens again, as a greedy or seeded row does on batch-invariant
        weights, streams on seamlessly; the final ``SampleOutput.text`` is authoritative).
        """
        self.tokens, self.logprobs, self.stopped_text = [], [], None
        if self.detok is not None:
            self.detok = Detokenizer(tokenizer)

    def output(self, tokenizer: Any) -> SampleOutput:
        """The ended row's output (its text decoded, or cut before a stop string)."""
        text = self.stopped_text
        if text is None:
            text = complete_text(tokenizer.decode(self.tokens, skip_special_tokens=True))
        if self.emitted < len(text) and self.finish is not None:
            self.emit(text[self.emitted :])  # the held-back tail, for the stream's last piece
            self.emitted = len(text)
        n = len(self.tokens)
        return SampleOutput(
            text=text,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=n,
            finish_reason=self.finish or "stop",
            mean_logprob=sum(self.logprobs) / n if n else None,
            token_logprobs=list(self.logprobs),
        )


R = TypeVar("R", bound=TokenRow)


class LocalModelEngine(ContinuousEngine[R]):
    """A continuous engine over a local model and its tokenizer, configured by settings."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(
            max_rows=settings.engine_max_rows,
            max_queue=settings.engine_max_queue,
            max_wait_ms=settings.engine_max_wait_ms,
            quotas=settings.priority_quotas,
            preempt_after_ms=settings.engine_preempt_after_ms,
        )
        self.model_name = settings.model
        self._settings = settings
        self._tokenizer: Any = None
        #: a second tokenizer for prompt_length(), which runs on the event loop's thread:
        #: a fast tokenizer must not be used by two threads at once
        self._length_tokenizer: Any = None

    def _use_tokenizer(self, tokenizer: Any) -> None:
        """The model's tokenizer (in the model thread), and a copy for prompt_length()."""
        self._length_tokenizer = copy.deepcopy(tokenizer)
        self._tokenizer = tokenizer

    def prompt_length(self, request: SampleRequest) -> int:
        """The templated prompt's length in tokens (characters before the model is loaded)."""
        if self._length_tokenizer is not None:
            try:
                return len(encode_prompt(self._length_tokenizer, request))
            except EngineError:
                pass
        return super().prompt_length(request)


def encode_prompt(tokenizer: Any, request: SampleRequest) -> list[int]:
    """The token ids of ``request``'s prompt with the model's chat template applied.

    A plain ``prompt`` is sent as one user message. Without a chat template (a base model),
    a plain prompt is used as raw text and chat messages are refused. EngineError when the
    request cannot be rendered.
    """
    if request.messages is not None:
        messages = request.messages
    elif request.prompt is not None:
        messages = [{"role": "user", "content": request.prompt}]
    else:
        raise EngineError("the request has neither a prompt nor messages")
    if tokenizer.chat_template is None:
        if request.messages is not None:
            raise EngineError("this model has no chat template; send a plain prompt")
        text = request.prompt
    else:
        try:
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as e:  # jinja raises many kinds on malformed messages
            raise EngineError(f"cannot apply the chat template: {e}") from e
    # the template already holds the special tokens the model expects
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


class Detokenizer:
    """Incremental detokenization: each step decodes a short window, not the whole text.

    A token may complete a character begun by the previous one, so text is released only
    when the window's decoding does not end in an incomplete character (U+FFFD).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def add(self, tokens: list[int]) -> None:
        decode = self._tokenizer.decode
        prefix = decode(tokens[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        window = decode(tokens[self._prefix_offset :], skip_special_tokens=True)
        if len(window) > len(prefix) and not window.endswith("\ufffd"):
            self.text += window[len(prefix) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(tokens)


def complete_text(text: str) -> str:
    """``text`` without the incomplete character it may end in.

    A row can end (its token budget, a timeout, a cancel) inside a character whose UTF-8
    bytes span several byte-level tokens; its decoding then ends in U+FFFD, which the
    model did not write. Text is released on character boundaries only, as the
    :class:`Detokenizer` streams it.
    """
    return text.rstrip("\ufffd")


def stop_position(text: str, stops: list[str]) -> int | None:
    """Where the first stop string found in ``text`` begins (None: none is there)."""
    found = [p for p in (text.find(s) for s in stops) if p >= 0]
    return min(found) if found else None
