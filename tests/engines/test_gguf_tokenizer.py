"""write_tokenizer against transformers' tokenizer of the packaged GGUF files.

Each packaged model's tokenizer, written from its GGUF file, must give transformers' token
ids, chat texts, decoded texts and end ids (``AutoTokenizer.from_pretrained(dir,
gguf_file=...)``, which is how the converted checkpoints get theirs), and OpenVINO
GenAI's token ids where it is installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoTokenizer

from ponder.config import load_settings
from ponder.engines.gguf_tokenizer import eos_ids, read_tokenizer_metadata, write_tokenizer
from ponder.engines.models import PACKAGED_MODELS, assemble_gguf, engine_files, load_tokenizer
from ponder.engines.tokenizer import ChatTokenizer
from ponder.errors import ConfigError
from tests.engines.prompts import CONVERSATIONS

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

TEXTS = [
    "Hello, world! How are you today?",
    "12345 678 3.14159 -42 1,000,000 2024-06-01 0x1F 1e-9",
    "a  5 and  77 x\t9",
    "def f(x):\n    if x:\n\treturn x  # tab\n\n\n\n    return None\n",
    "\n\n\n   \n\t\t\n \r\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|endoftext|> <|im_start|>",
    "Emoji: 😀👍🏽🇫🇷 👩‍👩‍👧 ✨",
    "Écris « bonjour » : où est l'hôtel ? Ça coûte 12,50 €.",
    "日本語のテキスト、東京は晴れです。カタカナ\uff01",
    "Mixed: Straße ΑΒΓ Привет مرحبا שלום 한국어 ไทย",
    "  leading spaces and trailing   ",
    "I'm sure they've done it; we'll see. DON'T SHOUT'S",
    "e\u0301 vs \u00e9, \ufb01 ligature, full-width \uff21\uff22\uff23\uff11\uff12\uff13",
    '<tool_call>\n{"name": "f"}\n</tool_call>',
    "[PAD151665] <repo_name> <|fim_prefix|>",
    "",
]


#: texts whose ids llama.cpp (and OpenVINO GenAI) give differently, on purpose: for
#: "smollm" llama.cpp splits digits off before GPT-2's regex (as SmolLM2's own
#: tokenizer.json does), transformers does not, so "a  5" is a, Ġ, Ġ, 5 here and a, ĠĠ, 5
#: there; ponder follows transformers, whose tokenizer its converted checkpoints carry
LLAMA_CPP_DIFFERS = {"smollm2-135m": {"a  5 and  77 x\t9"}}


@dataclass
class Case:
    name: str
    gguf: Path
    out: Path
    ours: ChatTokenizer
    theirs: Any


@pytest.fixture(scope="module", params=["smollm2-135m", "qwen0.5b"])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    model = PACKAGED_MODELS[request.param]
    try:
        parts = model.locate()
    except ConfigError as e:
        pytest.skip(f"the packaged model is not installed: {e}")
    work = tmp_path_factory.mktemp(request.param)
    gguf = assemble_gguf(parts, model.sha256, work / "model.gguf")
    write_tokenizer(gguf, work / "tokenizer")
    theirs = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    return Case(request.param, gguf, work / "tokenizer", ChatTokenizer(work / "tokenizer"), theirs)


def _check_decoding(case: Case, ids: list[int]) -> None:
    for skip in (True, False):
        # prefixes, as the incremental detokenizer decodes windows of ids
        for end in [*range(0, len(ids), 7), len(ids)]:
            assert case.ours.decode(ids[:end], skip_special_tokens=skip) == case.theirs.decode(
                ids[:end], skip_special_tokens=skip
            ), (ids[:end], skip)


def test_token_ids_and_decoding_equal_transformers(case: Case) -> None:
    for text in TEXTS:
        ids = case.ours(text, add_special_tokens=False)["input_ids"]
        assert ids == case.theirs(text, add_special_tokens=False)["input_ids"], text
        assert case.ours(text)["input_ids"] == case.theirs(text)["input_ids"], text
        _check_decoding(case, ids)
    # the control tokens stay whole and decode away with skip_special_tokens
    ids = case.ours("<|im_start|>x<|im_end|>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3 and case.ours.decode(ids, skip_special_tokens=True) == "x"


def test_chat_texts_equal_transformers(case: Case) -> None:
    assert case.ours.chat_template == case.theirs.chat_template
    for messages in CONVERSATIONS:
        for generation in (True, False):
            text = case.ours.apply_chat_template(
                messages, add_generation_prompt=generation, tokenize=False
            )
            assert text == case.theirs.apply_chat_template(
                messages, add_generation_prompt=generation, tokenize=False
            )
            ids = case.ours(text, add_special_tokens=False)["input_ids"]
            assert ids == case.theirs(text, add_special_tokens=False)["input_ids"]
            _check_decoding(case, ids)


def test_the_special_tokens_and_end_ids_equal_transformers(case: Case) -> None:
    config = AutoConfig.from_pretrained(
        case.gguf.parent, gguf_file=case.gguf.name, local_files_only=True
    )
    # a converted checkpoint's end ids: the tokenizer's EOS and its generation config's
    expected = {case.theirs.eos_token_id, config.eos_token_id}
    assert eos_ids(case.gguf) == expected
    assert case.ours.eos_token_id == case.theirs.eos_token_id
    assert load_tokenizer(case.out, light=True)[1] == expected
    config = json.loads((case.out / "tokenizer_config.json").read_text())
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert config.get(name) == getattr(case.theirs, name), name


def test_token_ids_equal_openvino_genai(case: Case) -> None:
    import openvino_genai

    # OpenVINO reads the tensors too, and not Qwen's Q5_0 ones: the engine's f16 file (the
    # same tokenizer metadata) is what it reads
    files = engine_files(case.name, load_settings().model_cache_dir, "f16")
    ov = openvino_genai.Tokenizer(str(files / "model.gguf"))
    for text in TEXTS:
        if not text or text in LLAMA_CPP_DIFFERS.get(case.name, ()):
            continue
        theirs = ov.encode(text, add_special_tokens=False).input_ids.data[0].tolist()
        assert case.ours(text, add_special_tokens=False)["input_ids"] == theirs, text


@pytest.fixture(scope="module")
def smollm2() -> tuple[Path, GGUFReader]:
    (path,) = PACKAGED_MODELS["smollm2-135m"].locate()
    return path, GGUFReader(path)


def test_the_metadata_equals_gguf_readers(smollm2: tuple[Path, GGUFReader]) -> None:
    path, reader = smollm2
    expected = {
        key: field.contents()
        for key, field in reader.fields.items()
        if key.startswith("tokenizer.") or key == "general.architecture"
    }
    assert read_tokenizer_metadata(path) == expected


def _copy(reader: GGUFReader, dest: Path, changes: dict[str, Any]) -> Path:
    """A GGUF file with the metadata of ``reader`` (and no tensors), ``changes`` applied."""
    writer = GGUFWriter(dest, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in changes:
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    for key, value in changes.items():
        writer.add_key_value(key, value, GGUFValueType.get_type(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def test_added_bos_and_eos_equal_transformers(
    smollm2: tuple[Path, GGUFReader], tmp_path: Path
) -> None:
    changes = {"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}
    gguf = _copy(smollm2[1], tmp_path / "bos.gguf", changes)
    write_tokenizer(gguf, tmp_path / "out")
    ours = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf.name, local_files_only=True)
    for text, pair in (("hi there", None), ("a", "b")):
        ids = ours.encode(text, pair).ids
        assert ids == theirs(text, pair)["input_ids"]
        assert ids[0] == 1 and ids[-1] == 2  # <|im_start|> and <|im_end|>, as the file says


@pytest.mark.parametrize(
    "changes",
    [{"tokenizer.ggml.model": "llama"}, {"tokenizer.ggml.pre": "llama-bpe"}],
)
def test_other_tokenizers_are_config_errors(
    smollm2: tuple[Path, GGUFReader], tmp_path: Path, changes: dict[str, str]
) -> None:
    gguf = _copy(smollm2[1], tmp_path / "other.gguf", changes)
    with pytest.raises(ConfigError, match="is not supported") as error:
        write_tokenizer(gguf, tmp_path / "out")
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()


def test_a_file_that_is_no_gguf_is_a_config_error(tmp_path: Path) -> None:
    for content in (b"", b"GGML" + bytes(40), b"GGUF\x03\x00\x00\x00" + bytes(4)):
        (tmp_path / "bad.gguf").write_bytes(content)
        with pytest.raises(ConfigError, match="cannot read the GGUF metadata"):
            write_tokenizer(tmp_path / "bad.gguf", tmp_path / "out")
