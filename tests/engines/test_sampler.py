"""The transformers engine's sampler (numpy, no model) and its import without torch."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

import numpy

from ponder.engines.base import SampleRequest
from ponder.engines.runner import Logits
from ponder.engines.transformers import _draw, _generator, _Row, _sample

VOCAB = 64


def row(temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None) -> _Row:
    """A row as the engine opens it (the sampler reads only its request and generator)."""
    request = SampleRequest(prompt="-", temperature=temperature, top_p=top_p, seed=seed)
    return _Row(
        request=request,
        future=None,  # type: ignore[arg-type]
        loop=None,  # type: ignore[arg-type]
        priority=0,
        arrival=0.0,
        generator=_generator(request),
    )


def logits(seed: int, rows: int = 1, scale: float = 2.0) -> Logits:
    return (numpy.random.default_rng(seed).normal(size=(rows, VOCAB)) * scale).astype(numpy.float32)


def draws(sampled: _Row, steps: int, row_logits: Logits) -> list[int]:
    """``steps`` tokens of ``sampled`` alone over the same ``[1, vocab]`` logits."""
    return [_sample(row_logits, [sampled])[0][0] for _ in range(steps)]


def test_the_engine_module_imports_no_torch() -> None:
    code = "import sys, ponder.engines.transformers; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True
    )
    assert done.stdout.strip() == "False", done.stderr


def test_greedy_rows_take_the_argmax() -> None:
    batch = logits(0, rows=3)
    # a vanishing temperature (floored at 1e-4) samples the argmax too
    tokens, _ = _sample(batch, [row(), row(1e-9, seed=1), row(1e-9, 0.5, seed=2)])
    assert tokens == batch.argmax(axis=-1).tolist()


def test_a_seed_gives_the_same_draws() -> None:
    flat = logits(1, scale=0.5)
    first = draws(row(1.0, seed=7), 40, flat)
    assert draws(row(1.0, seed=7), 40, flat) == first
    assert draws(row(1.0, seed=7 + 2**64), 40, flat) == first  # seeds are taken mod 2**64
    assert draws(row(1.0, seed=8), 40, flat) != first
    assert len(set(first)) > 10


def test_a_row_draws_the_same_alone_and_in_any_batch() -> None:
    mine = logits(2)
    alone_row = row(0.8, 0.9, seed=3)
    alone = [_sample(mine, [alone_row]) for _ in range(30)]
    mates = [row(), row(1.0, 0.5, seed=4), row(0.7, seed=5)]
    batched_row = row(0.8, 0.9, seed=3)
    for step, (tokens, logprobs) in enumerate(alone):
        others = logits(100 + step, rows=len(mates), scale=3.0)
        # the row in the middle of a batch whose other rows change at every step
        batch = numpy.concatenate([others[:2], mine, others[2:]])
        got, got_logprobs = _sample(batch, [*mates[:2], batched_row, mates[2]])
        assert got[2] == tokens[0]
        assert got_logprobs[2] == logprobs[0]


def test_top_p_keeps_the_most_likely_tokens() -> None:
    probs = numpy.array([0.05, 0.3, 0.02, 0.5, 0.13])
    five = numpy.log(probs).astype(numpy.float32)[None]
    # 0.7: token 4 goes, the mass before it (0.5 + 0.3) already reaches top_p
    counts = Counter(draws(row(1.0, 0.7, seed=1), 2000, five))
    assert set(counts) == {1, 3}
    assert abs(counts[3] / 2000 - 0.5 / 0.8) < 0.04  # renormalised within the nucleus
    assert set(draws(row(1.0, 0.81, seed=1), 500, five)) == {1, 3, 4}
    assert set(draws(row(1.0, 0.01, seed=1), 100, five)) == {3}
    assert set(draws(row(1.0, 1.0, seed=1), 2000, five)) == {0, 1, 2, 3, 4}


def test_the_nucleus_is_the_head_of_the_whole_sorted_vocabulary() -> None:
    """_draw sorts only the tokens that can be in the nucleus: it draws as a full sort does."""

    def full_sort(values: Logits, top_p: float, generator: numpy.random.Generator) -> int:
        scaled = values / 0.8
        probs = numpy.exp(scaled - scaled.max())
        probs /= probs.sum()
        order = numpy.argsort(-probs, kind="stable")
        head = probs[order]
        kept = order[numpy.cumsum(head, dtype=numpy.float64) - head < top_p]
        uniform = generator.random(len(values), dtype=numpy.float32)
        with numpy.errstate(divide="ignore"):
            gumbel = -numpy.log(-numpy.log(uniform))
        return int(kept[numpy.argmax((scaled + gumbel)[kept])])

    for seed, top_p in [(4, 0.7), (5, 0.9), (6, 0.99)]:
        values = logits(seed)[0]
        ours, theirs = (numpy.random.Generator(numpy.random.PCG64(seed)) for _ in range(2))
        drawn = [_draw(values, 0.8, top_p, ours) for _ in range(300)]
        assert drawn == [full_sort(values, top_p, theirs) for _ in range(300)]
        assert len(set(drawn)) > 1


def test_rounding_noise_in_the_logits_does_not_change_the_draw() -> None:
    """A row's logits alone and in a batch differ by float32 rounding (~1e-5): on a
    model-sized vocabulary with a long tail, the same seed draws the same token from both.
    (The inverse CDF this engine drew with before fails it: its running sum over the
    vocabulary moves every boundary of the tail by that much.)"""
    rng = numpy.random.default_rng(9)
    for step in range(1000):
        values = (rng.standard_normal(49152) * 2.0).astype(numpy.float32)
        noisy = values + rng.uniform(-2e-5, 2e-5, size=values.shape).astype(numpy.float32)
        top_p = 1.0 if step % 5 else 0.95
        a, b = (numpy.random.Generator(numpy.random.PCG64(step)) for _ in range(2))
        assert _draw(values, 1.0, top_p, a) == _draw(noisy, 1.0, top_p, b), step


def test_logprobs_are_the_log_softmax_of_the_unscaled_logits() -> None:
    batch = logits(3, rows=4, scale=5.0)
    batch[3] += 1000  # far from zero: only a stable log-sum-exp stays finite
    rows = [row(), row(0.5, seed=1), row(2.0, 0.9, seed=2), row()]
    tokens, logprobs = _sample(batch, rows)
    for values, token, logprob in zip(batch.tolist(), tokens, logprobs, strict=True):
        peak = max(values)
        expected = values[token] - peak - math.log(math.fsum(math.exp(v - peak) for v in values))
        assert math.isclose(logprob, expected, abs_tol=1e-5)
