"""A checkpoint's tokenizer and chat template without transformers (the llama.cpp runner's).

transformers' ``AutoTokenizer`` costs about 100 MB of resident memory in imports; the
llama.cpp runner needs only what ``tokenizer.json`` (the ``tokenizers`` library) and the
chat template (Jinja, rendered the way transformers renders it) give. The tests check
its token ids, chat texts and decoded texts against transformers' on the packaged models.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from ponder.errors import ConfigError

__all__ = ["ChatTokenizer"]

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class ChatTokenizer:
    """The subset of a transformers fast tokenizer that the engine uses.

    ``chat_template`` (None: a base model), ``eos_token_id``,
    ``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)``,
    ``tokenizer(text, add_special_tokens=False)["input_ids"]`` and
    ``decode(ids, skip_special_tokens=True)``.
    """

    def __init__(self, checkpoint: Path) -> None:
        try:
            self._tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
            config_path = checkpoint / "tokenizer_config.json"
            config: dict[str, Any] = (
                json.loads(config_path.read_text()) if config_path.is_file() else {}
            )
        except Exception as e:  # the tokenizers library raises plain Exception
            raise ConfigError(f"cannot read the tokenizer of {checkpoint}: {e}") from e
        template = config.get("chat_template")
        template_file = checkpoint / "chat_template.jinja"
        if template is None and template_file.is_file():
            template = template_file.read_text()
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template
        self._special = {
            key: value["content"] if isinstance(value, dict) else value
            for key in _SPECIAL
            if (value := config.get(key)) is not None
        }
        eos = self._special.get("eos_token")
        self.eos_token_id: int | None = (
            self._tokenizer.token_to_id(eos) if eos is not None else None
        )
        self._template: jinja2.Template | None = None

    def _compiled(self) -> jinja2.Template:
        if self._template is None:
            assert self.chat_template is not None
            # as transformers compiles chat templates
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
            )
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = _strftime_now
            self._template = env.from_string(self.chat_template)
        return self._template

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = False,
        tokenize: bool = True,
    ) -> Any:
        """The chat text of ``messages`` (its token ids with ``tokenize=True``)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        text = self._compiled().render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self._special
        )
        return self(text, add_special_tokens=False)["input_ids"] if tokenize else text

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return {"input_ids": ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text: str = self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    def __deepcopy__(self, memo: dict[int, Any]) -> ChatTokenizer:
        """A copy with a tokenizer of its own (one may not be used by two threads at once)."""
        copy = object.__new__(ChatTokenizer)
        copy.__dict__.update(self.__dict__)
        copy._tokenizer = Tokenizer.from_str(self._tokenizer.to_str())
        copy._template = None
        return copy
