"""A GGUF model's tokenizer and chat template, written as the files ChatTokenizer reads.

A GGUF file has no ``tokenizer.json``: it stores the vocabulary, the merges, each token's
type and the special token ids as metadata under llama.cpp's key names.
:func:`write_tokenizer` rebuilds from them the tokenizer that transformers builds
(``AutoTokenizer.from_pretrained(dir, gguf_file=...)``, ``transformers/integrations/gguf/
gguf_tokenizer_mapping.py``), with only the ``tokenizers`` library, so that
:class:`~ponder.engines.tokenizer.ChatTokenizer` needs no transformers. The tests check
its token ids, chat texts and decoded texts against transformers' on the packaged models.

Supported: byte-level BPE (``tokenizer.ggml.model`` "gpt2") with the pre-tokenizers of
the packaged models, SmolLM2's ("smollm") and Qwen2.5's ("qwen2").

The metadata is parsed here rather than with ``gguf.GGUFReader``, which builds a numpy
view per array element: 4 s for SmolLM2's 49k tokens and 10 s for Qwen's 152k, against
well under a second for this reader.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from ponder.errors import ConfigError

__all__ = ["eos_ids", "read_tokenizer_metadata", "write_tokenizer"]

#: the split of ``tokenizer.ggml.pre`` as transformers applies it: None keeps GPT-2's regex
#: (the ByteLevel pre-tokenizer's own), as transformers does for "smollm"
_SPLITS: dict[str, str | None] = {
    "smollm": None,
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}

#: GGUF metadata value types (``gguf.GGUFValueType``) of a fixed size, as struct codes;
#: 8 is a string, 9 an array
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
#: the string arrays worth decoding (the others are walked over)
_STRING_ARRAYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.merges"})
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values
_SPECIAL = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def read_tokenizer_metadata(gguf_path: Path) -> dict[str, Any]:
    """The ``general.architecture`` and ``tokenizer.*`` metadata of a GGUF file (v2 or v3).

    String and integer arrays become lists; other arrays are left out.
    """
    try:
        with (
            gguf_path.open("rb") as file,
            mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as blob,
        ):
            return _read_metadata(blob)
    except (OSError, ValueError, struct.error) as e:  # UnicodeDecodeError is a ValueError
        raise ConfigError(f"cannot read the GGUF metadata of {gguf_path}: {e}") from e


def _read_metadata(blob: mmap.mmap) -> dict[str, Any]:
    if blob[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    order = "<" if struct.unpack_from("<I", blob, 4)[0] in (2, 3) else ">"
    version, _, count = struct.unpack_from(order + "IQQ", blob, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (2 and 3 are read)")
    pos = 24

    def string() -> str:
        nonlocal pos
        (length,) = struct.unpack_from(order + "Q", blob, pos)
        pos += 8 + length
        return blob[pos - length : pos].decode("utf-8")

    def skip_string() -> None:
        nonlocal pos
        pos += 8 + struct.unpack_from(order + "Q", blob, pos)[0]

    metadata: dict[str, Any] = {}
    for _ in range(count):
        key = string()
        (kind,) = struct.unpack_from(order + "I", blob, pos)
        pos += 4
        wanted = key == "general.architecture" or key.startswith("tokenizer.")
        if kind in _SCALARS:
            if wanted:
                (metadata[key],) = struct.unpack_from(order + _SCALARS[kind], blob, pos)
            pos += struct.calcsize(_SCALARS[kind])
        elif kind == _STRING and wanted:
            metadata[key] = string()
        elif kind == _STRING:
            skip_string()
        elif kind == _ARRAY:
            item, length = struct.unpack_from(order + "IQ", blob, pos)
            pos += 12
            if item in _SCALARS:
                size = struct.calcsize(_SCALARS[item]) * length
                if wanted:
                    metadata[key] = list(
                        struct.unpack_from(f"{order}{length}{_SCALARS[item]}", blob, pos)
                    )
                pos += size
            elif item == _STRING and key in _STRING_ARRAYS:
                metadata[key] = [string() for _ in range(length)]
            elif item == _STRING:
                for _ in range(length):
                    skip_string()
            else:
                raise ValueError(f"{key} is an array of value type {item}")
        else:
            raise ValueError(f"{key} has value type {kind}")
    return metadata


def write_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` of ``gguf_path`` into ``out_dir``.

    ``ChatTokenizer(out_dir)`` then tokenizes, decodes and renders chats as transformers'
    tokenizer of the GGUF file does. ConfigError if the file cannot be read or its tokenizer
    is not one of the supported kinds.
    """
    meta = read_tokenizer_metadata(gguf_path)
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if kind != "gpt2" or pre not in _SPLITS:
        raise ConfigError(
            f"{gguf_path.name}: tokenizer {kind!r} with pre-tokenizer {pre!r} is not supported"
            f" (supported: 'gpt2' with {', '.join(map(repr, _SPLITS))})"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    tokenizer = _byte_level_bpe(meta, tokens, _SPLITS[pre])
    config: dict[str, Any] = {
        name: tokens[meta[key]] for name, key in _SPECIAL.items() if key in meta
    }
    # as transformers' post-processor: what add_special_tokens=True adds around the text
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token")) and "bos_token" in config
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token")) and "eos_token" in config
    tokenizer.post_processor = _post_processor(meta, config, add_bos=add_bos, add_eos=add_eos)
    config.update(
        tokenizer_class="PreTrainedTokenizerFast",
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        chat_template=meta.get("tokenizer.chat_template"),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], split: str | None) -> Tokenizer:
    """The byte-level BPE tokenizer of the metadata's vocabulary (``tokens``) and merges:
    ``split`` (a regex; None: GPT-2's) before the byte-level pre-tokenizer, its control
    tokens special and its user-defined ones matched whole; no post-processor yet."""
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [0] * len(tokens)
    # tokens are spelled in the byte-level alphabet; as transformers, any other (a control
    # token mislabelled by llama.cpp) is respelled from its UTF-8 bytes and not made special
    alphabet = frozenset(pre_tokenizers.ByteLevel.alphabet())
    respell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    spelled = [
        t if alphabet.issuperset(t) else "".join(p for p, _ in respell.pre_tokenize_str(t))
        for t in tokens
    ]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", ())]
    tokenizer = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(spelled)},
            merges=merges,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    tokenizer.pre_tokenizer = (
        pre_tokenizers.ByteLevel(add_prefix_space=False)
        if split is None
        else pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    )
    tokenizer.decoder = decoders.ByteLevel()
    # control tokens are special; user-defined ones (like <tool_call>) are matched whole too
    tokenizer.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, type_ in zip(tokens, types, strict=True)
            if type_ == _CONTROL and alphabet.issuperset(t)
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, type_ in zip(tokens, types, strict=True)
            if type_ == _USER_DEFINED
        ]
    )
    return tokenizer


def _post_processor(
    meta: dict[str, Any], config: dict[str, Any], *, add_bos: bool, add_eos: bool
) -> processors.TemplateProcessing:
    """What ``add_special_tokens=True`` adds around a text (and a pair of texts): the
    BOS and EOS tokens of ``config`` where ``add_bos`` and ``add_eos`` say so."""

    def sequence(name: str, type_id: int) -> str:
        bos, eos = config.get("bos_token"), config.get("eos_token")
        return f"{bos}:{type_id} " * add_bos + f"${name}:{type_id}" + f" {eos}:{type_id}" * add_eos

    return processors.TemplateProcessing(
        single=sequence("A", 0),
        pair=f"{sequence('A', 0)} {sequence('B', 1)}",
        special_tokens=[
            (config[name], meta[_SPECIAL[name]])
            for name, added in (("bos_token", add_bos), ("eos_token", add_eos))
            if added
        ],
    )


def eos_ids(gguf_path: Path) -> frozenset[int]:
    """The token ids that end a row: the GGUF file's end of sequence token.

    As ``load_tokenizer`` finds them in a checkpoint that transformers converted from the
    file: its generation config's ``eos_token_id`` is the file's.
    """
    eos = read_tokenizer_metadata(gguf_path).get("tokenizer.ggml.eos_token_id")
    return frozenset([eos] if isinstance(eos, int) else [])
