"""ponder's own forward pass for Llama and Qwen2 models, with int8 weights: the fast runner.

:class:`NativeRunner` implements the :class:`~ponder.engines.runner.ModelRunner` seam for
the two architectures of the packaged models (``LlamaForCausalLM``: SmolLM2;
``Qwen2ForCausalLM``: Qwen2.5) without transformers' modelling code. What makes it fast
on a CPU at one thread (measured against the generic runner):

- **int8 weights** through fbgemm's dynamic-quantized linear
  (``torch.ops.quantized.linear_dynamic``, AVX2): 4 x less memory traffic than float32,
  about 1.5-2 x its decode rate at 1-8 rows here (prefill, compute-bound, is no faster:
  without VNNI fbgemm's int8 matches MKL's float32 at many rows). torch's weight-only
  ``_weight_int8pack_mm`` / ``_weight_int4pack_mm_for_cpu`` have no AVX2 kernels and
  are 10-40 x slower here.
- **Per-row activation quantization.** fbgemm quantizes its whole input with one scale,
  which would make a row's result depend on its batch mates. Each row is divided by its
  own max-abs before the call and one constant sentinel row ``[1, -1, 0, ...]`` is put
  first, so the input range is always exactly [-1, 1]: every row is quantized on the
  same grid, relative to its own magnitude, whatever else is in the batch; the output is
  multiplied back by the row's max-abs. (``reduce_range`` keeps AVX2's 16-bit pair sums
  from saturating.)
- **SmoothQuant**: a few input channels carry most of the range; a calibration pass over
  built-in prompts at preparation time moves part of it into the weights
  (:func:`_smooth`), which brings int8 close to weight-only quantization's error.
- **Folded normalization**: RMSNorm's gain is folded into the next linear's weights
  before quantization (the smoothing factors become the RMSNorm's weight).
- **Fused projections** (q|k|v and gate|up are one matrix each) and **RoPE as one
  complex multiplication**: q and k output channels are permuted at load time so that
  rotated pairs are adjacent (attention scores do not change under a permutation applied
  to both q and k).
- **A preallocated KV cache** (one tensor per layer for all rows, grown in steps, never
  per decode step); rows that leave free their slot by moving the last rows into it, not
  by copying the whole cache.
- **Packed prefill**: the tokens of several prompts go through the linears as one matrix
  (no padding); only attention runs per prompt.

**Bit-identical rows.** int8 activations amplify float noise (one rounding flip) into
different tokens, so no sum may depend on what else is computed: besides the per-row
quantization grid, the attention of the query at position ``p`` always runs over
``_width(p)`` keys (``p`` rounded up to a multiple of 32) in calls of a fixed shape, in
decode (:meth:`NativeRunner._spans`) as in prefill (:func:`_attend_causal`). A row's
logits are then bit-identical alone and in any batch, and a prompt's KV cache is
bit-identical however it is cut into chunks.

The weights are prepared once from the float32 safetensors checkpoint that
:mod:`ponder.engines.models` writes, and saved as int8 safetensors beside it
(:func:`prepared_weights`); later starts read that file tensor by tensor (the embedding
table memory-mapped), so float32 weights are never loaded and the process holds about
one byte per parameter.

``weights="fp32"`` (the engine's default, ``PONDER_MODEL_WEIGHTS=float32``) runs the same
forward pass with float32 weights: its greedy tokens equal those of the transformers
model (the tests check it). int8 changes small models' greedy answers (on SmolLM2-135M,
34 % of 50 short answers agree with float32: ``bench/results/engine-agreement-short.md``),
which is why it is not the default.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import mmap
import shutil
import struct
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from ponder.config import Settings
from ponder.engines.models import (
    Progress,
    _as_config_error,
    _to_stderr,
    checkpoint_dir,
    load_tokenizer,
)
from ponder.engines.runner import Logits, ModelRunner, Prefill, Prefix
from ponder.errors import ConfigError

__all__ = [
    "ARCHITECTURES",
    "NativeRunner",
    "Weights",
    "prepared_weights",
    "select_runner",
    "supports",
]

#: the architectures (``config.json``'s ``architectures[0]``) this runner computes
ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM"})
Weights = Literal["int8", "fp32"]
_Tensors = Mapping[str, torch.Tensor]

#: bump when the prepared file's layout changes: older files are then prepared again
_FORMAT = "ponder-native-4"
#: the KV cache grows by this many positions (and rows by _ROW_STEP) when it is full
_KV_STEP = 64
_ROW_STEP = 8
#: decode attention widths are multiples of this (see NativeRunner._spans); divides _KV_STEP
_WIDTH_STEP = 32
#: tokens per chunk of one prefill pass (bounds the attention matrix of a long prompt)
_PREFILL_CHUNK = 512


def select_runner(settings: Settings, progress: Progress | None = None) -> NativeRunner | None:
    """The native runner ``settings.model_runner`` asks for; None: use the generic one.

    ``auto`` takes the native runner for the architectures it knows; ``native`` insists
    (ConfigError naming the reason otherwise); ``hf`` never takes it. int8 weights
    (``settings.model_weights``) exist only in the native runner: ConfigError otherwise.
    """
    int8 = settings.model_weights == "int8"
    if settings.model_runner == "hf":
        if int8:
            raise ConfigError(
                "PONDER_MODEL_WEIGHTS=int8 needs the native runner: set "
                "PONDER_MODEL_RUNNER=auto or native, or PONDER_MODEL_WEIGHTS=float32"
            )
        return None
    source = checkpoint_dir(settings.model, settings.model_cache_dir, progress)
    why = supports(source)
    if why is None:
        weights: Weights = "int8" if int8 else "fp32"
        return NativeRunner.load(settings.model, settings.model_cache_dir, weights, progress)
    if settings.model_runner == "native" or int8:
        setting = (
            "PONDER_MODEL_RUNNER=native"
            if settings.model_runner == "native"
            else ("PONDER_MODEL_WEIGHTS=int8")
        )
        raise ConfigError(
            f"{setting} needs the native runner, which cannot run {settings.model!r}: it has "
            f"{why}; set PONDER_MODEL_RUNNER=auto or hf and PONDER_MODEL_WEIGHTS=float32"
        )
    return None


def _config(path: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((path / "config.json").read_text())
    return config


def supports(path: Path) -> str | None:
    """None when :class:`NativeRunner` computes the checkpoint at ``path``; else why not."""
    config = _config(path)
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        return f"architecture {arch} (the native runner knows {', '.join(sorted(ARCHITECTURES))})"
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rope type {rope.get('rope_type', rope.get('type'))}"
    if config.get("use_sliding_window"):
        return "sliding-window attention"
    if config.get("hidden_act", "silu") != "silu" or config.get("mlp_bias"):
        return "an MLP other than SiLU-gated without bias"
    return None


@dataclass(frozen=True)
class _Shape:
    """The model's dimensions, from its ``config.json``."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float
    context: int
    qkv_bias: bool

    @classmethod
    def of(cls, config: dict[str, Any]) -> _Shape:
        heads = config["num_attention_heads"]
        rope = config.get("rope_parameters") or {}
        arch = config["architectures"][0]
        return cls(
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            eps=config["rms_norm_eps"],
            rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
            context=config.get("max_position_embeddings") or 2048,
            # Qwen2 always has q/k/v biases; Llama has them when attention_bias says so
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(config.get("attention_bias")),
        )


# --- preparing the weights ----------------------------------------------------------------


def _pair_order(shape: _Shape, heads: int) -> torch.Tensor:
    """Output-channel order that makes RoPE's rotated pairs (i, i + d/2) adjacent, per head."""
    half = shape.head_dim // 2
    within = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)
    return (torch.arange(heads)[:, None] * shape.head_dim + within).reshape(-1)


def _prepare(source: Path, shape: _Shape, tied: bool) -> dict[str, torch.Tensor]:
    """The runner's float32 tensors, made from a transformers checkpoint's.

    Fused q|k|v and gate|up matrices with the preceding RMSNorm's gain folded in, q and k
    rows in RoPE pair order, the final norm folded into the LM head.
    """
    out: dict[str, torch.Tensor] = {}
    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors weights in {source}")
    handles: list[Any] = [safe_open(str(f), framework="pt") for f in files]
    where = {key: h for h in handles for key in h.keys()}  # noqa: SIM118 - not a dict

    def get(key: str) -> torch.Tensor:
        if key not in where:
            raise ConfigError(f"{source} has no tensor {key}")
        tensor: torch.Tensor = where[key].get_tensor(key).float()
        return tensor

    q_order, kv_order = _pair_order(shape, shape.heads), _pair_order(shape, shape.kv_heads)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        gain = get(p + "input_layernorm.weight")
        q = get(p + "self_attn.q_proj.weight")[q_order]
        k = get(p + "self_attn.k_proj.weight")[kv_order]
        v = get(p + "self_attn.v_proj.weight")
        out[f"{i}.qkv"] = torch.cat([q, k, v]) * gain
        if shape.qkv_bias:
            out[f"{i}.qkv_bias"] = torch.cat(
                [
                    get(p + "self_attn.q_proj.bias")[q_order],
                    get(p + "self_attn.k_proj.bias")[kv_order],
                    get(p + "self_attn.v_proj.bias"),
                ]
            )
        out[f"{i}.o"] = get(p + "self_attn.o_proj.weight")
        gain = get(p + "post_attention_layernorm.weight")
        gate_up = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
        out[f"{i}.gate_up"] = gate_up * gain
        out[f"{i}.down"] = get(p + "mlp.down_proj.weight")
    embed = get("model.embed_tokens.weight")
    out["embed"] = embed
    head = embed if tied else get("lm_head.weight")
    out["head_gain"] = get("model.norm.weight")
    out["head"] = head * out["head_gain"]
    return out


#: prompts whose activations set the smoothing of the int8 weights (see :func:`_smooth`)
_CALIBRATION = [
    "What is the capital of France? Answer in one sentence.",
    "Solve step by step: a shop sells pens at 3 dollars each. Ann buys 9 pens and pays "
    "with a 50 dollar note. How much change does she get?",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain the difference between a list and a tuple, then give three examples of each.",
    "Translate into French: 'The weather is nice today and we are going to the beach.'",
    "What is 17 * 23? Show your work, then give the answer on its own line.",
    "Summarize the causes of the First World War in five bullet points.",
]
#: SmoothQuant's migration strength: how much of an input channel's range moves to the weights
_ALPHA = 0.5


def _smooth(tensors: dict[str, torch.Tensor], config: dict[str, Any], tokenizer: Any) -> None:
    """Move activation outliers into the weights before int8 quantization (SmoothQuant).

    A few input channels of each linear carry values far larger than the rest, and a
    row quantized by its max-abs would leave the others a handful of levels. A float32
    pass over :data:`_CALIBRATION` measures each input channel's peak ``a``; the weight's
    column is multiplied by ``s = a^alpha / w^(1-alpha)`` (``w``: the column's peak) and
    the activation divided by it: by a stored ``.smooth`` vector for q|k|v, gate|up and
    the head; folded into the up projection's rows for the down projection.
    """
    peaks: dict[str, torch.Tensor] = {}

    class Recorder(_Linear):
        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            peak = x.abs().amax(dim=0)
            seen = peaks.get(self.name)
            peaks[self.name] = peak if seen is None else torch.maximum(seen, peak)
            return super().__call__(x)

    model = _Model(config, tensors.__getitem__, lambda key, bias: Recorder(key, tensors, bias))
    with torch.inference_mode():
        for prompt in _CALIBRATION:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            model.forward(tokenizer(text, add_special_tokens=False)["input_ids"])
    for key, peak in peaks.items():
        if key.endswith(".o"):  # the attention output has no outliers to speak of
            continue
        weight = tensors[key]
        column = weight.abs().amax(dim=0).clamp(min=1e-5)
        factor = (peak.clamp(min=1e-5) ** _ALPHA / column ** (1 - _ALPHA)).clamp(min=1e-5)
        tensors[key] = weight * factor
        if key.endswith(".down"):  # h = silu(gate) * up: dividing up's rows divides h
            gate_up = tensors[key.replace(".down", ".gate_up")]
            gate_up[len(gate_up) // 2 :] /= factor[:, None]
        else:
            tensors[key + ".smooth"] = 1 / factor


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: ``(int8 [N, K], float32 scale [N])``."""
    scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
    return torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def prepared_weights(
    spec: str, cache_dir: str | Path, weights: Weights = "int8", progress: Progress | None = None
) -> Path:
    """The directory of the runner's weights for ``spec`` (``settings.model``), made once.

    Beside the float32 checkpoint of :func:`~ponder.engines.models.checkpoint_dir`, an
    entry ``<checkpoint>.native-<weights>`` holds ``weights.safetensors`` (the prepared
    tensors, int8 with float32 scales for ``weights="int8"``), ``config.json`` and the
    tokenizer files. It is written to a temporary directory and renamed into place.
    ConfigError for a checkpoint this runner does not support.
    """
    report = progress or _to_stderr
    source = checkpoint_dir(spec, cache_dir, progress)
    why = supports(source)
    if why is not None:
        raise ConfigError(f"the native runner cannot run {spec!r}: {why}")
    cache = Path(cache_dir).expanduser()
    # a checkpoint outside the cache is named by its location, as models.py names files
    name = source.name
    if source.parent.resolve() != cache.resolve():
        name += "-" + hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
    target = cache / f"{name}.native-{weights}"
    if _is_current(target):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    report(f"preparing {weights} weights in {target} (first start only) ...")
    config = _config(source)
    shape = _Shape.of(config)
    tied = bool(config.get("tie_word_embeddings"))
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{target.name}.") as tmp:
        work = Path(tmp) / "entry"
        work.mkdir()
        with _as_config_error(f"cannot prepare the weights of {spec!r} from {source}"):
            tensors = _prepare(source, shape, tied)
        gain = tensors.pop("head_gain")
        if weights == "fp32" and tied:
            # the head is the embedding table (one copy in memory), its gain applied apart
            del tensors["head"]
            tensors["head_gain"] = gain
        if weights == "int8":
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            _smooth(tensors, config, tokenizer)
            for key in [k for k in tensors if not k.endswith(("_bias", ".smooth"))]:
                tensors[key], tensors[key + ".scale"] = _quantize(tensors[key])
        save_file(tensors, str(work / "weights.safetensors"), metadata={"format": _FORMAT})
        for f in source.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name != "format":
                shutil.copy2(f, work / f.name)
        try:
            work.rename(target)
        except OSError:
            # another process prepared the same entry meanwhile, or an older format lies
            # there: replace an outdated one, keep a current one
            if not _is_current(target):
                shutil.rmtree(target, ignore_errors=True)
                work.rename(target)
    return target


def _is_current(entry: Path) -> bool:
    path = entry / "weights.safetensors"
    if not path.is_file():
        return False
    with safe_open(str(path), framework="pt") as f:
        return bool((f.metadata() or {}).get("format") == _FORMAT)


# --- the forward pass ---------------------------------------------------------------------


class _Linear:
    """``y = x @ W.T [+ bias]``; :meth:`normed` applies the RMSNorm before it.

    ``tensors[key]`` is the weight, ``tensors[bias]`` the bias.
    """

    def __init__(self, key: str, tensors: _Tensors, bias: str | None) -> None:
        self.name = key
        self.weight = tensors[key]
        self.bias = tensors[bias] if bias else None
        #: the RMSNorm's weight: its gain is folded into ``W``; int8 puts its smoothing here
        self.norm_weight: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def normed(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return self(F.rms_norm(x, x.shape[-1:], self.norm_weight, eps))


class _Int8Linear(_Linear):
    """fbgemm int8 with per-row activation scales (see the module docstring)."""

    def __init__(
        self, key: str, tensors: _Tensors, bias: str | None, buffers: dict[int, torch.Tensor]
    ) -> None:
        """``buffers``: per input width, the input buffer shared by one model's linears;
        its row 0 is the sentinel row, rows 1.. the input."""
        self._buffers = buffers
        weight = tensors[key]
        n, self.in_features = weight.shape
        with warnings.catch_warnings():
            # quantized tensors are deprecated in torch but remain fbgemm's only entry point
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch._make_per_channel_quantized_tensor(
                weight, tensors[key + ".scale"].double(), torch.zeros(n, dtype=torch.long), 0
            )
        del weight  # a copy is in qweight: hold two copies at most while packing
        self.name = key
        self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.bias = tensors[bias] if bias else None
        smooth = key + ".smooth"
        self.norm_weight = tensors.get(smooth)

    def _rows(self, n: int) -> torch.Tensor:
        buffer = self._buffers.get(self.in_features)
        if buffer is None or len(buffer) <= n:
            buffer = torch.zeros(
                max(n + 1, 2 * len(buffer) if buffer is not None else 33), self.in_features
            )
            buffer[0, :2] = torch.tensor([1.0, -1.0])
            self._buffers[self.in_features] = buffer
        return buffer

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = len(x)
        peak = torch.linalg.vector_norm(x, ord=math.inf, dim=-1, keepdim=True).clamp_(min=1e-30)
        rows = self._rows(n)
        torch.div(x, peak, out=rows[1 : n + 1])
        y = torch.ops.quantized.linear_dynamic(rows[: n + 1], self.packed, True)[1:]
        return y.mul_(peak) if self.bias is None else torch.addcmul(self.bias, y, peak)


def _attend_causal(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int
) -> torch.Tensor:
    """Causal attention of ``q`` ``[n, heads, d]`` at positions ``start..start+n-1``.

    ``keys`` and ``values`` are ``[kv_heads, start + n, d]``. Queries go in blocks of
    aligned positions, the query at position ``p`` over ``width(p)`` keys (the decode
    step's width, see :meth:`NativeRunner._spans`; zero keys past the end are masked):
    its sums then run in the same order however the prompt is cut into chunks.
    """
    end = start + len(q)
    padded = _width(end - 1)
    keys = F.pad(keys, (0, 0, 0, padded - end))
    values = F.pad(values, (0, 0, 0, padded - end))
    q = q.transpose(0, 1)
    out = torch.empty_like(q)
    rows = torch.zeros(q.shape[0], _WIDTH_STEP, q.shape[2])
    for block in range(start - start % _WIDTH_STEP, end, _WIDTH_STEP):
        a, b, width = max(block, start), min(block + _WIDTH_STEP, end), block + _WIDTH_STEP
        # a whole block of query rows in every call: SDPA's sums depend on the row count
        rows[:, a - block : b - block] = q[:, a - start : b - start]
        mask = torch.arange(width)[None, :] <= torch.arange(block, width)[:, None]
        attended = F.scaled_dot_product_attention(
            rows, keys[:, :width], values[:, :width], attn_mask=mask, enable_gqa=True
        )
        out[:, a - start : b - start] = attended[:, a - block : b - block]
    return out.transpose(0, 1)


def _width(position: int) -> int:
    """The attention width of the query at ``position``: a multiple of _WIDTH_STEP."""
    return (position // _WIDTH_STEP + 1) * _WIDTH_STEP


@dataclass
class _Layer:
    qkv: _Linear
    o: _Linear
    gate_up: _Linear
    down: _Linear


class _Model:
    """The prepared weights and the pieces of the forward pass shared by prefill and decode.

    ``get(key)`` reads a tensor; ``linear(key, bias_key)`` builds each linear.
    """

    def __init__(
        self,
        config: dict[str, Any],
        get: Callable[[str], torch.Tensor],
        linear: Callable[[str, str | None], _Linear],
    ) -> None:
        self.shape = shape = _Shape.of(config)
        self.layers = [
            _Layer(
                qkv=linear(f"{i}.qkv", f"{i}.qkv_bias" if shape.qkv_bias else None),
                o=linear(f"{i}.o", None),
                gate_up=linear(f"{i}.gate_up", None),
                down=linear(f"{i}.down", None),
            )
            for i in range(shape.layers)
        ]
        self.embed = get("embed")
        self.embed_scale = get("embed.scale") if self.embed.dtype == torch.int8 else None
        try:
            self.head = linear("head", None)
        except KeyError:  # float32, tied embeddings: the head is the embedding table
            self.head = _Linear("embed", {"embed": self.embed}, None)
            self.head.norm_weight = get("head_gain")
        self.q_dim = shape.heads * shape.head_dim
        self.kv_dim = shape.kv_heads * shape.head_dim
        half = shape.head_dim // 2
        inv = 1.0 / shape.rope_theta ** (torch.arange(half, dtype=torch.float64) / half)
        angles = torch.outer(torch.arange(shape.context, dtype=torch.float64), inv)
        #: e^(i * position * frequency), [context, head_dim / 2]
        self.rotation = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = self.embed[tokens]
        if self.embed_scale is None:
            return rows  # a copy already: indexing copies
        return rows.float().mul_(self.embed_scale[tokens, None])

    def qkv(
        self, layer: _Layer, x: torch.Tensor, rotation: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated q ``[T, heads, d]``, rotated k and v ``[T, kv_heads, d]`` for rows ``x``.

        ``rotation``: ``self.rotation[positions][:, None]``, the same for every layer.
        """
        s = self.shape
        qkv = layer.qkv.normed(x, s.eps)
        n = len(x)
        qk = qkv[:, : self.q_dim + self.kv_dim].reshape(n, s.heads + s.kv_heads, -1, 2)
        turned = torch.view_as_complex(qk) * rotation
        qk = torch.view_as_real(turned).view(n, s.heads + s.kv_heads, s.head_dim)
        v = qkv[:, self.q_dim + self.kv_dim :].view(n, s.kv_heads, s.head_dim)
        return qk[:, : s.heads], qk[:, s.heads :], v

    def finish_layer(self, layer: _Layer, x: torch.Tensor, attended: torch.Tensor) -> None:
        """Add the attention output projection and the MLP to the residual ``x`` (in place)."""
        x.add_(layer.o(attended.reshape(len(x), self.q_dim)))
        gate_up = layer.gate_up.normed(x, self.shape.eps)
        gate, up = gate_up.chunk(2, dim=-1)
        x.add_(layer.down(F.silu(gate).mul_(up)))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head.normed(x, self.shape.eps)

    def forward(self, tokens: Sequence[int]) -> torch.Tensor:
        """The next-token logits after every token of one sequence (no cache kept)."""
        x = self.embed_tokens(torch.tensor(tokens))
        rotation = self.rotation[: len(tokens), None]
        for layer in self.layers:
            q, k, v = self.qkv(layer, x, rotation)
            keys, values = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
            self.finish_layer(layer, x, _attend_causal(q, keys, values, 0))
        return self.logits(x)


def _open_model(entry: Path, weights: Weights) -> _Model:
    buffers: dict[int, torch.Tensor] = {}

    def linear(key: str, bias: str | None) -> _Linear:
        if weights == "int8":
            return _Int8Linear(key, tensors, bias, buffers)
        return _Linear(key, tensors, bias)

    with _File(entry / "weights.safetensors") as tensors:
        model = _Model(_config(entry), tensors.embedding, linear)
    _trim_heap()
    return model


def _trim_heap() -> None:
    """Give the heap's free pages back to the system (glibc; elsewhere a no-op).

    Loading frees as much as it keeps (each matrix is read, copied and packed); glibc
    keeps the freed pages of allocations under its adaptive mmap threshold, about 0.1 GB
    of resident memory for Qwen2.5-0.5B.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


_DTYPES = {"I8": torch.int8, "F32": torch.float32}


class _File(Mapping[str, torch.Tensor]):
    """The tensors of a safetensors file, each read when asked for, without a memory map.

    A matrix is read into its own memory, packed by fbgemm and dropped, so loading holds
    one copy of the weights (a memory map would keep the pages of the whole file resident
    as well). :meth:`embedding` maps the embedding table instead: only the rows of tokens
    that occur are ever read into memory.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file = path.open("rb")
        (size,) = struct.unpack("<Q", self._file.read(8))
        header = json.loads(self._file.read(size))
        header.pop("__metadata__", None)
        self._start = 8 + size
        self._header: dict[str, Any] = header

    def __enter__(self) -> _File:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def __getitem__(self, key: str) -> torch.Tensor:
        info = self._header[key]
        begin = info["data_offsets"][0]
        tensor = torch.empty(info["shape"], dtype=_DTYPES[info["dtype"]])
        self._file.seek(self._start + begin)
        self._file.readinto(tensor.numpy().data.cast("B"))
        return tensor

    def embedding(self, key: str) -> torch.Tensor:
        """``self[key]`` for the embedding table (memory-mapped, read-only); else a copy."""
        info = self._header[key]
        if key != "embed" or info["dtype"] != "I8":
            return self[key]
        begin, end = info["data_offsets"]
        mapped = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        with warnings.catch_warnings():
            # the table is only read from: torch warns that the buffer is not writable
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(mapped, dtype=torch.int8, count=end - begin,
                                    offset=self._start + begin)  # fmt: skip
        return flat.view(info["shape"])

    def __iter__(self) -> Iterator[str]:
        return iter(self._header)

    def __len__(self) -> int:
        return len(self._header)


@dataclass
class _Cache:
    """Every row's keys and values: per layer ``[rows, kv_heads, positions, head_dim]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def capacity(self) -> tuple[int, int]:
        rows, _, positions, _ = self.keys[0].shape
        return rows, positions


class NativeRunner(ModelRunner):
    """The :class:`ModelRunner` for Llama and Qwen2 checkpoints (see the module docstring).

    Build it with :meth:`load`. Prefix states are per-layer ``(keys, values)`` tensors of
    shape ``[kv_heads, length, head_dim]``.
    """

    def __init__(self, model: _Model, tokenizer: Any, eos_ids: frozenset[int]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.context_length = model.shape.context
        self._cache: _Cache | None = None
        #: running row i lives in cache slot _slots[i]; slots 0..rows-1 are all in use
        self._slots: list[int] = []
        #: each slot's length (the position its next token takes)
        self._lengths: list[int] = []

    @classmethod
    def load(
        cls,
        spec: str,
        cache_dir: str | Path,
        weights: Weights = "int8",
        progress: Progress | None = None,
    ) -> NativeRunner:
        """The runner for ``settings.model`` = ``spec``, preparing its weights on first use."""
        entry = prepared_weights(spec, cache_dir, weights, progress)
        with _as_config_error(f"cannot load the model {spec!r} from {entry}"):
            tokenizer, eos_ids = load_tokenizer(entry)
            model = _open_model(entry, weights)
        return cls(model, tokenizer, eos_ids)

    @property
    def rows(self) -> int:
        return len(self._slots)

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.inference_mode()

    # --- prefill ----------------------------------------------------------------------

    def prefill(self, items: Sequence[Prefill]) -> list[Prefix]:
        results: list[Prefix | None] = [None] * len(items)
        todo: list[tuple[int, Prefill]] = []
        for index, item in enumerate(items):
            start = item.prefix.length if item.prefix else 0
            if start + len(item.tokens) > self.context_length:
                raise ValueError(
                    f"{start + len(item.tokens)} tokens exceed the context of {self.context_length}"
                )
            if not item.tokens:
                if item.prefix is None:
                    raise ValueError("nothing to prefill: no tokens and no prefix")
                results[index] = item.prefix
            else:
                todo.append((index, item))
        # long prompts go through in chunks, short ones together, up to a chunk of tokens
        while todo:
            group: list[tuple[int, Prefill]] = []
            size = 0
            while todo and (not group or size + len(todo[0][1].tokens) <= _PREFILL_CHUNK):
                index, item = todo.pop(0)
                if len(item.tokens) > _PREFILL_CHUNK:
                    head = Prefill(item.tokens[:_PREFILL_CHUNK], item.prefix)
                    todo.insert(0, (index, Prefill(item.tokens[_PREFILL_CHUNK:], None)))
                    item = head
                group.append((index, item))
                size += len(item.tokens)
            prefixes = self._prefill_pass([item for _, item in group])
            for (index, _), prefix in zip(group, prefixes, strict=True):
                if todo and todo[0][0] == index:  # the rest of a long prompt continues it
                    todo[0] = (index, Prefill(todo[0][1].tokens, prefix))
                else:
                    results[index] = prefix
        out = []
        for done in results:
            assert done is not None
            out.append(done)
        return out

    def _prefill_pass(self, items: list[Prefill]) -> list[Prefix]:
        """One forward pass over the tokens of ``items`` packed into one matrix."""
        m = self.model
        starts = [item.prefix.length if item.prefix else 0 for item in items]
        counts = [len(item.tokens) for item in items]
        tokens = torch.tensor([t for item in items for t in item.tokens])
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, counts, strict=True)])
        x = m.embed_tokens(tokens)
        states: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in items]
        rotation = m.rotation[positions][:, None]
        for i, layer in enumerate(m.layers):
            q, k, v = m.qkv(layer, x, rotation)
            attended = torch.empty_like(q)
            offset = 0
            for j, (item, n) in enumerate(zip(items, counts, strict=True)):
                rows = slice(offset, offset + n)
                keys, values = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
                if item.prefix is not None:
                    old_keys, old_values = item.prefix.state[i]
                    keys, values = (
                        torch.cat([old_keys, keys], 1),
                        torch.cat([old_values, values], 1),
                    )
                else:
                    keys, values = keys.contiguous(), values.contiguous()
                states[j].append((keys, values))
                attended[rows] = _attend_causal(q[rows], keys, values, starts[j])
                offset += n
            m.finish_layer(layer, x, attended)
        last = torch.tensor(counts).cumsum(0) - 1
        # the head's output is this pass's own tensor: its numpy view aliases nothing
        # that the runner writes to again
        logits = m.logits(x[last]).numpy()
        return [
            Prefix(
                length=start + n,
                logits=logits[j],
                nbytes=sum(kk.nbytes + vv.nbytes for kk, vv in states[j]),
                state=tuple(states[j]),
            )
            for j, (start, n) in enumerate(zip(starts, counts, strict=True))
        ]

    # --- the running batch ------------------------------------------------------------

    def join(self, prefix: Prefix) -> None:
        slot = len(self._slots)
        self._reserve(slot + 1, prefix.length + 1)
        assert self._cache is not None
        for (keys, values), cache_k, cache_v in zip(
            prefix.state, self._cache.keys, self._cache.values, strict=True
        ):
            cache_k[slot, :, : prefix.length] = keys
            cache_v[slot, :, : prefix.length] = values
        self._slots.append(slot)
        self._lengths.append(prefix.length)

    def keep(self, rows: Sequence[int]) -> None:
        if not rows:
            self._slots, self._lengths, self._cache = [], [], None  # the memory goes back
            return
        kept = [self._slots[i] for i in rows]
        # the slots at or past len(kept) empty out: move the kept rows there into the
        # freed slots below, so that slots 0..len(kept)-1 stay the ones in use
        free = sorted(set(range(len(kept))) - set(kept))
        moves = {slot: free.pop(0) for slot in sorted(kept) if slot >= len(kept)}
        if moves and self._cache is not None:
            src, dst = torch.tensor(list(moves)), torch.tensor(list(moves.values()))
            for tensor in (*self._cache.keys, *self._cache.values):
                tensor[dst] = tensor[src]
        lengths = list(self._lengths)
        for src_slot, dst_slot in moves.items():
            lengths[dst_slot] = self._lengths[src_slot]
        self._slots = [moves.get(slot, slot) for slot in kept]
        self._lengths = lengths[: len(kept)]

    def _reserve(self, rows: int, positions: int) -> None:
        """Make the cache hold at least ``rows`` slots of ``positions`` each."""
        s = self.model.shape
        have_rows, have_positions = self._cache.capacity if self._cache else (0, 0)
        if rows <= have_rows and positions <= have_positions:
            return
        new_rows = max(have_rows, -(-rows // _ROW_STEP) * _ROW_STEP)
        new_positions = max(have_positions, -(-positions // _KV_STEP) * _KV_STEP)
        shape = (new_rows, s.kv_heads, new_positions, s.head_dim)
        if self._cache is None:
            self._cache = _Cache(
                [torch.zeros(shape) for _ in range(s.layers)],
                [torch.zeros(shape) for _ in range(s.layers)],
            )
            return
        # one tensor at a time, each old one dropped once copied: growing holds one
        # layer's worth of memory more, not a second cache
        used = len(self._slots)
        for tensors in (self._cache.keys, self._cache.values):
            for i, old in enumerate(tensors):
                tensors[i] = torch.zeros(shape)
                tensors[i][:used, :, :have_positions] = old[:used]
                del old

    # --- decode -----------------------------------------------------------------------

    def _spans(self) -> list[tuple[int, int, int]]:
        """Runs of slots ``(first, end, width)`` whose attention is one call over ``width``.

        A row's attention width is a function of its own length (rounded up to
        :data:`_WIDTH_STEP`), never of its batch mates': the sums over positions then
        run in the same order alone and in any batch, so a row's float noise does not
        depend on its neighbours (int8 activations would amplify that noise into
        different tokens). Adjacent slots of the same width share a call.
        """
        spans: list[tuple[int, int, int]] = []
        for slot, length in enumerate(self._lengths):
            width = _width(length)
            if spans and spans[-1][2] == width:
                spans[-1] = (spans[-1][0], slot + 1, width)
            else:
                spans.append((slot, slot + 1, width))
        return spans

    def decode(self, tokens: Sequence[int]) -> Logits:
        n = len(self._slots)
        if len(tokens) != n:
            raise ValueError(f"decode got {len(tokens)} tokens for {n} rows")
        if max(self._lengths) >= self.context_length:
            raise ValueError(f"a row reached the context of {self.context_length} tokens")
        self._reserve(n, max(self._lengths) + _WIDTH_STEP)
        assert self._cache is not None
        m = self.model
        # work in slot order; row i's inputs go to slot _slots[i]
        by_slot = [0] * n
        for row, slot in enumerate(self._slots):
            by_slot[slot] = tokens[row]
        positions = torch.tensor(self._lengths)
        spans = self._spans()
        masks = [
            (torch.arange(width)[None, :] <= positions[a:b, None])[:, None, None, :]
            for a, b, width in spans
        ]
        slots = torch.arange(n)
        x = m.embed_tokens(torch.tensor(by_slot))
        s = m.shape
        group = s.heads // s.kv_heads
        rotation = m.rotation[positions][:, None]
        for layer, cache_k, cache_v in zip(
            m.layers, self._cache.keys, self._cache.values, strict=True
        ):
            q, k, v = m.qkv(layer, x, rotation)
            cache_k[slots, :, positions] = k
            cache_v[slots, :, positions] = v
            q = q.view(n, s.kv_heads, group, s.head_dim)
            parts = [
                F.scaled_dot_product_attention(
                    q[a:b], cache_k[a:b, :, :width], cache_v[a:b, :, :width], attn_mask=mask
                )
                for (a, b, width), mask in zip(spans, masks, strict=True)
            ]
            m.finish_layer(layer, x, parts[0] if len(parts) == 1 else torch.cat(parts))
        self._lengths = [length + 1 for length in self._lengths]
        logits = m.logits(x)  # this step's own tensor, as in _prefill_pass
        if self._slots != list(range(n)):
            logits = logits[torch.tensor(self._slots)]
        out: Logits = logits.numpy()
        return out
