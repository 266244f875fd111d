"""A GGUF file rewritten, with the ``gguf`` package alone, into weights the engine reads.

OpenVINO GenAI reads GGUF files itself, but only some tensor types (F32, F16, Q8_0, Q4_0,
Q4_1, Q4_K, Q6_K: its reader is a preview), and the packaged SmolLM2 file's Q4_1 weights
lose most of its answers there. :func:`rewrite` writes a copy with the same metadata and:

- ``f16``: every quantized tensor dequantized and stored as float16 — the weights of the
  float32 model up to float16 rounding, so greedy answers are the float32 model's
  (SmolLM2: 20 of 20 short prompts in the engine issue's measurement);
- ``gguf``: the file's own tensors kept, each type OpenVINO cannot read (Qwen's Q5_0)
  dequantized and requantized to Q8_0 (float16 where a row does not split into Q8_0's
  blocks of 32).

Pure numpy: a few seconds for SmolLM2, about 20 s for Qwen2.5-0.5B.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy

from ponder.errors import ConfigError

__all__ = ["READABLE", "Weights", "model_architecture", "rewrite"]

Weights = Literal["f16", "gguf"]

#: the tensor types OpenVINO GenAI 2026.4 reads from a GGUF file
READABLE = frozenset({"F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"})
#: llama.cpp's file type "mostly F16", written into an f16 file's metadata
_MOSTLY_F16 = 1


def model_architecture(fields: Mapping[str, Any], path: Path) -> str:
    """The ``general.architecture`` of a GGUF file's metadata (ConfigError: none)."""
    field = fields.get("general.architecture")
    if field is None:
        raise ConfigError(f"{path} is not a model: its metadata has no general.architecture")
    arch: str = field.contents()
    return arch


def rewrite(source: Path, dest: Path, weights: Weights) -> None:
    """Write ``source`` to ``dest`` with ``weights`` (see the module docstring)."""
    import gguf
    from gguf.quants import dequantize, quantize

    try:
        reader = gguf.GGUFReader(source)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the GGUF file {source}: {e}") from e
    arch = model_architecture(reader.fields, source)
    writer = gguf.GGUFWriter(dest, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type" and weights == "f16":
            writer.add_uint32(key, _MOSTLY_F16)
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for tensor in reader.tensors:
        qtype = tensor.tensor_type
        shape = tuple(int(n) for n in reversed(tensor.shape))  # numpy's order
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(tensor.name, numpy.asarray(tensor.data).reshape(shape))
        elif weights == "gguf" and qtype.name in READABLE:
            data = tensor.data
            writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            values = dequantize(tensor.data, qtype).reshape(shape)
            if weights == "gguf" and shape[-1] % 32 == 0:
                packed = quantize(values, q8)
                writer.add_tensor(tensor.name, packed, raw_shape=packed.shape, raw_dtype=q8)
            else:
                writer.add_tensor(tensor.name, values.astype(numpy.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
