"""The (m, l, o) merge of online softmax: what FlashAttention, split-K decoding and paged attention share.

A partial result over a subset J of keys is (m, l, acc) with m = max_J s, l = sum_J e^(s - m) and
acc = sum_J e^(s - m) v.  Two partials over disjoint key sets merge into the partial of their union
by rescaling both to the larger max (Milakov & Gimelshein 2018, "Online normalizer calculation
for softmax"; FlashAttention, Dao et al. 2022, Sec. 3.1).  The identity is (-inf, 0, 0); the
merge is associative and commutative, so blocks may be combined in any order.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Partial(NamedTuple):
    m: torch.Tensor  # (..., N) running max of the scores
    l: torch.Tensor  # (..., N) sum of e^(s - m)  # noqa: E741 - paper notation
    acc: torch.Tensor  # (..., N, d) sum of e^(s - m) v  (unnormalized output)


def partial(s: torch.Tensor, v: torch.Tensor) -> Partial:
    """Partial of scores s (..., N, J) against values v (..., J, d); -inf scores are masked keys."""
    m = s.amax(dim=-1)  # (..., N)
    p = torch.exp(s - _finite(m)[..., None])  # (..., N, J)
    return Partial(m, p.sum(dim=-1), p @ v)


def identity(shape_n: tuple[int, ...], d: int, dtype=torch.float64, device=None) -> Partial:
    m = torch.full(shape_n, float("-inf"), dtype=dtype, device=device)
    return Partial(m, torch.zeros(shape_n, dtype=dtype, device=device),
                   torch.zeros(*shape_n, d, dtype=dtype, device=device))


def merge(a: Partial, b: Partial) -> Partial:
    """Partial of the union of two disjoint key sets."""
    m = torch.maximum(a.m, b.m)
    ca, cb = torch.exp(a.m - _finite(m)), torch.exp(b.m - _finite(m))  # e^(m_a - m), e^(m_b - m)
    return Partial(m, ca * a.l + cb * b.l, ca[..., None] * a.acc + cb[..., None] * b.acc)


def finalize(p: Partial) -> torch.Tensor:
    """o = acc / l; rows that saw no key (l = 0) give 0, as the attention contract requires."""
    l = p.l[..., None]  # noqa: E741
    return torch.where(l == 0, 0, p.acc / torch.where(l == 0, 1, l))


def _finite(m: torch.Tensor) -> torch.Tensor:
    """A max of -inf (no key seen) shifts by 0 instead, so exp(-inf - -inf) never makes NaN."""
    return torch.where(torch.isfinite(m), m, 0)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16/bf16 kernels accumulate scores and outputs in fp32, as FlashAttention does on GPUs."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
