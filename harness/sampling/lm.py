"""The two protocols a sampler is written against: language models and randomness.

    lm(prefixes, n=1) -> Tensor (B, n, V) float64
        Row [b, i] is the next-token distribution after the first len(prefixes[b]) - n + 1 + i tokens of
        prefixes[b]: one call scores the last n positions of every prefix (a target verifying gamma draft
        tokens asks for n = gamma + 1).  Prefixes are non-empty lists of token ids and may differ in length.
        `lm.vocab_size` is V.

    rng.categorical(probs (..., V)) -> LongTensor (...)     one draw per row
    rng.bernoulli(probs (...)) -> BoolTensor (...)           True with the given probability (or a float: 0-dim)

A sampler draws randomness only through its `Rng`, so `llm_inference_harness.sampling.enumeration` can replace it by
one that visits every branch with its exact probability.  `TorchRng` is the real back end (a seeded
torch.Generator on cpu or cuda).  Wrappers: `Counted` counts calls, `Tempered` applies a temperature
before the sampler sees p and q, `PerPrefix` pins each prefix's distribution, `TableLM` is an exact
context table (Hypothesis draws these), `GPTLM` adapts a `llm_inference_harness.models.gpt.GPT` and offers a KV-cached
`session()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from llm_inference_harness.engine.tolerance import PROBABILITY_SUM
from llm_inference_harness.models.gpt import ConcatCache


class LM(Protocol):
    vocab_size: int

    def __call__(self, prefixes: Sequence[Sequence[int]], n: int = 1) -> torch.Tensor: ...


class Rng(Protocol):
    def categorical(self, probs: torch.Tensor) -> torch.Tensor: ...

    def bernoulli(self, probs: torch.Tensor) -> torch.Tensor: ...


NUMPY_FLOATS = (torch.float64, torch.float32)


def check_distribution(p: torch.Tensor, what: str) -> None:
    """ValueError unless every row of p (..., V) is finite, non-negative and sums to one."""
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{what}: probabilities must be a torch.Tensor, got {type(p).__name__}")
    if p.numel() and p.device.type == "cpu" and p.dtype in NUMPY_FLOATS and not p.requires_grad:
        a = p.numpy()  # no copy; a sampler checks every row it draws from, and NumPy's calls cost ~2 us
        if a.min() >= 0 and (abs(float(a.sum()) - 1) if a.ndim == 1 else np.abs(a.sum(-1) - 1).max()) \
                <= PROBABILITY_SUM:
            return  # the fast path (one row: its sum as a Python float); NaN and inf fail a comparison
    elif p.numel() and float(p.min()) >= 0 and float((p.sum(-1) - 1).abs().max()) <= PROBABILITY_SUM:
        return  # the same on other devices and dtypes
    if not torch.isfinite(p).all():
        raise ValueError(f"{what}: probabilities must be finite, got a NaN or inf")
    if (p < 0).any():
        raise ValueError(f"{what}: probabilities must be non-negative, got {p.min().item():.3g}")
    err = (p.sum(-1) - 1).abs().max().item() if p.numel() else 0.0
    if err > PROBABILITY_SUM:
        raise ValueError(f"{what}: probabilities must sum to one (off by {err:.3g} > {PROBABILITY_SUM:g})")


def check_probability(p: torch.Tensor, what: str) -> None:
    if not torch.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError(f"{what}: a Bernoulli probability must lie in [0, 1], got {p}")


class TorchRng:
    """Seeded draws from a torch.Generator (cpu or cuda)."""

    UNIFORMS = 256  # uniforms drawn per generator call for one-row draws and acceptance tests

    def __init__(self, seed: int, device: str = "cpu") -> None:
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device
        self.uniforms: list[float] = []  # drawn ahead, consumed from the end

    def _uniform(self) -> float:
        """The next U[0, 1) float64 of a stream drawn UNIFORMS at a time: one generator call per 256 draws
        instead of one per draw (a sampler's per-token overhead), the same stream for the same seed."""
        if not self.uniforms:
            self.uniforms = torch.rand(self.UNIFORMS, generator=self.gen, dtype=torch.float64,
                                       device=self.device).tolist()[::-1]
        return self.uniforms.pop()

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        if probs.dim() == 1 and probs.device.type == "cpu":  # a sampler's every draw
            return self._inverse_cdf(probs)
        check_distribution(probs, "rng.categorical")
        flat = probs.reshape(-1, probs.shape[-1]).to(self.device)  # (rows, V)
        return torch.multinomial(flat, 1, generator=self.gen).reshape(probs.shape[:-1]).cpu()

    def _inverse_cdf(self, probs: torch.Tensor) -> torch.Tensor:
        """One draw by inversion: the first i with cdf[i] > u * cdf[-1], u ~ U[0, 1), in numpy (a fifth of
        multinomial's cost on a small vocabulary).  A token of probability 0 has cdf[i] == cdf[i - 1] and
        can never be that first i; u * cdf[-1] < cdf[-1] keeps i in range.  cdf[-1] is the sum, so the
        checks of `check_distribution` come for free (NaN fails them and gets its full diagnosis)."""
        p = (probs.detach() if probs.requires_grad else probs).numpy()  # (V,), no copy
        if not p.size:
            raise ValueError("rng.categorical: probabilities must have at least one entry, got an empty vector")
        cdf = np.add.accumulate(p)  # (V,)
        total = float(cdf[-1])
        if not (p.min() >= 0 and abs(total - 1) <= PROBABILITY_SUM):
            check_distribution(probs, "rng.categorical")  # raises, naming what is wrong
        i = int(cdf.searchsorted(self._uniform() * total, side="right"))
        return torch.scalar_tensor(i, dtype=torch.long)  # () int64, in half torch.tensor(i)'s time

    def bernoulli(self, probs: torch.Tensor | float) -> torch.Tensor:
        if type(probs) is float:  # one acceptance test: the same draw, without tensor checks around it
            if not 0.0 <= probs <= 1.0:
                raise ValueError(f"rng.bernoulli: a Bernoulli probability must lie in [0, 1], got {probs}")
            return torch.tensor(self._uniform() < probs)
        probs = torch.as_tensor(probs, dtype=torch.float64)
        check_probability(probs, "rng.bernoulli")
        u = torch.rand(probs.shape, generator=self.gen, dtype=torch.float64, device=self.device).cpu()
        return u < probs


class Counted:
    """Counts calls (and scored positions) of the wrapped model."""

    def __init__(self, lm: LM) -> None:
        self.lm, self.vocab_size, self.calls, self.positions = lm, lm.vocab_size, 0, 0

    def __call__(self, prefixes, n=1):
        self.calls += 1
        self.positions += n * len(prefixes)
        return self.lm(prefixes, n)


class Tempered:
    """p ** (1 / t), renormalized: the distribution a sampler at temperature t sees."""

    def __init__(self, lm: LM, temperature: float) -> None:
        if not temperature > 0:
            raise ValueError(f"Tempered: temperature must be > 0, got {temperature}")
        self.lm, self.vocab_size, self.t = lm, lm.vocab_size, temperature

    def __call__(self, prefixes, n=1):
        p = self.lm(prefixes, n) ** (1.0 / self.t)
        return p / p.sum(-1, keepdim=True)


class TableLM:
    """An exact model of order k: the next token depends on the last k tokens (V marks 'before the start').

    table: float64 (V+1,)*k + (V,) -- table[c_1, ..., c_k] is the next-token distribution after context c.
    """

    # What it computes from: an implementation in its own process gets a copy (harness/engine/wire.py value_key),
    # kept there while unchanged, so that its calls of the model cost no round trip to the judge (a sampler calls it
    # ~5 times a sample: 31,801 callbacks in a goodness-of-fit run); a change to it is a changed input.
    harness_tensors = ("table",)

    def __init__(self, table: torch.Tensor) -> None:
        self.order, self.vocab_size = table.dim() - 1, table.shape[-1]
        self.table = table

    def row(self, prefix: Sequence[int]) -> torch.Tensor:
        ctx = [self.vocab_size] * self.order + list(prefix)
        return self.table[tuple(ctx[len(ctx) - self.order :])] if self.order else self.table

    def __call__(self, prefixes, n=1):
        return torch.stack([torch.stack([self.row(x[: len(x) - n + 1 + i]) for i in range(n)]) for x in prefixes])


class PerPrefix:
    """Each distribution computed once, from its own prefix, and reused.

    A float32 model's rounding depends on the length of the sequence it runs over (~1e-8), so the p a
    target call over gamma + 1 positions returns differs in the last bits from what single-position calls
    return.  Comparing a sampler with the autoregressive reference to 1e-12 needs both to see one p.  Rows
    are shared with processes forked later (`llm_inference_harness.sampling.enumeration`'s workers), not with the
    forking one: compute the reference first.
    """

    def __init__(self, lm: LM) -> None:
        self.lm, self.vocab_size, self.rows = lm, lm.vocab_size, {}

    def __call__(self, prefixes, n=1):
        wanted = [tuple(x[: len(x) - n + 1 + i]) for x in prefixes for i in range(n)]
        by_length: dict[int, list[tuple[int, ...]]] = {}
        for w in dict.fromkeys(w for w in wanted if w not in self.rows):
            by_length.setdefault(len(w), []).append(w)
        for group in by_length.values():  # equal lengths: one batched call, no padding, each row its own prefix
            self.rows.update(zip(group, self.lm([list(w) for w in group], 1)[:, 0], strict=True))  # (B, V)
        return torch.stack([self.rows[w] for w in wanted]).reshape(len(prefixes), n, -1)  # (B, n, V)


class GPTLM:
    """A `llm_inference_harness.models.gpt.GPT` as an LM: float64 softmax of its logits; `session()` keeps a KV
    cache."""

    def __init__(self, model) -> None:
        self.model, self.vocab_size = model, model.cfg.vocab_size

    @torch.no_grad()
    def __call__(self, prefixes, n=1):
        head = shared_head(prefixes, n)
        if head is not None:
            return self.siblings(head, [x[-1] for x in prefixes], n)
        width = max(len(x) for x in prefixes)
        idx = torch.tensor([list(x) + [0] * (width - len(x)) for x in prefixes], dtype=torch.long)  # (B, W)
        logits = self.model(idx)  # (B, W, V); right padding is never seen by a causal row
        rows = [logits[b, len(x) - n : len(x)] for b, x in enumerate(prefixes)]  # n rows each
        return torch.softmax(torch.stack(rows).double(), dim=-1)  # (B, n, V)

    @torch.no_grad()
    def siblings(self, head: tuple[int, ...], lasts: list[int], n: int) -> torch.Tensor:
        """``self([[*head, t] for t in lasts], n)`` with the head run once: its keys and values serve all B
        siblings, each of which then costs one cached position instead of len(head) + 1 (an enumeration
        scores every token after a prefix at once).  The same distributions up to float32 rounding."""
        L, B, cache = len(head), len(lasts), ConcatCache()
        head_logits = self.model.forward_with(torch.tensor([head]), None, cache.attend)[0, L + 1 - n :]  # (n-1, V)
        cache.layers = {layer: (k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1))  # (B, Hkv, L, d)
                        for layer, (k, v) in cache.layers.items()}
        idx = torch.tensor(lasts, dtype=torch.long)[:, None]  # (B, 1)
        last = self.model.forward_with(idx, torch.full((B, 1), L), cache.attend)  # (B, 1, V)
        return torch.softmax(torch.cat([head_logits.expand(B, -1, -1), last], 1).double(), dim=-1)  # (B, n, V)

    def session(self) -> KVSession:
        return KVSession(self.model)


def shared_head(prefixes: Sequence[Sequence[int]], n: int) -> tuple[int, ...] | None:
    """The tokens two or more prefixes of one length all start with, when they differ in their last token
    only (siblings) and n fits in them; else None."""
    if len(prefixes) < 2 or not 1 <= n <= len(prefixes[0]) or len(prefixes[0]) < 2:
        return None
    head = tuple(prefixes[0][:-1])
    return head if all(tuple(x[:-1]) == head and len(x) == len(head) + 1 for x in prefixes) else None


class KVSession:
    """One sequence's KV cache: `extend(tokens)` scores the new tokens, `rollback(length)` forgets the rest.

    Verifying gamma draft tokens costs one cached step over gamma + 1 positions; rejected positions are
    dropped by truncating every layer's cache, never recomputed.
    """

    def __init__(self, model) -> None:
        self.model, self.length, self.cache = model, 0, ConcatCache()

    @torch.no_grad()
    def extend(self, tokens: Sequence[int]) -> torch.Tensor:
        """(len(tokens), V) float64: the distribution after each new token."""
        tokens, cfg = list(tokens), self.model.cfg
        if not tokens or not all(isinstance(t, int) and 0 <= t < cfg.vocab_size for t in tokens):
            raise ValueError(f"KVSession.extend: tokens must be a non-empty list of ids in [0, {cfg.vocab_size})")
        if self.length + len(tokens) > cfg.block_size:
            raise ValueError(f"KVSession.extend: {self.length} + {len(tokens)} positions exceed block_size "
                             f"{cfg.block_size}")
        idx = torch.tensor([tokens], dtype=torch.long)  # (1, t)
        positions = torch.arange(self.length, self.length + len(tokens))[None]  # (1, t)
        logits = self.model.forward_with(idx, positions, self.cache.attend, checked=True)[0]  # (t, V)
        self.length += len(tokens)
        return torch.softmax(logits, dim=-1, dtype=torch.float64)  # the logits cast first: one op, same floats

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"KVSession.rollback: length must lie in [0, {self.length}], got {length}")
        if length != self.length:  # a round that accepted every draft token rolls nothing back
            self.cache.truncate(length)
            self.length = length


class RecomputeSession:
    """The session interface for any LM, by re-scoring the whole prefix (used where no cache exists)."""

    def __init__(self, lm: LM) -> None:
        self.lm, self.tokens = lm, []

    def extend(self, tokens: Sequence[int]) -> torch.Tensor:
        self.tokens += list(tokens)
        return self.lm([self.tokens], len(tokens))[0]

    def rollback(self, length: int) -> None:
        del self.tokens[length:]

    @property
    def length(self) -> int:
        return len(self.tokens)


def session(lm: LM):
    """A KV-cached session when the model offers one, else one that recomputes."""
    return lm.session() if hasattr(lm, "session") else RecomputeSession(lm)
