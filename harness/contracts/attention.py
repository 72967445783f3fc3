"""The attention contract.

    attention(q, k, v, *, causal: bool = False, scale: float | None = None) -> Tensor

* q: (B, H, Nq, d); k, v: (B, Hkv, Nk, d) with H divisible by Hkv (MHA, GQA, MQA).
  Query head h reads kv head h // (H // Hkv).
* scale defaults to 1/sqrt(d).
* causal is aligned bottom-right: query i sees key j iff j <= i + Nk - Nq (FlashAttention >= 2.1,
  and what KV-cache decoding needs). A query row that sees no key returns zeros.
* causal must be a bool. B, H, Nq and Nk may be 0: the output is then empty (or zeros when Nk = 0).
* The output has q's shape, dtype and device. Inputs are left unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from harness.capabilities import BatchedCaps, cap
from harness.contracts import Technique, define
from harness.guard import call_limit, check_tensor, guarded_call
from harness.registry import Impl


@dataclass(frozen=True)
class AttentionCaps(BatchedCaps):
    returns_lse: bool = cap(False, "accepts return_lse=True and then returns (o, L), L the natural-log logsumexp "
                                   "of the scaled, masked scores (what the backward recomputes P from)")
    max_len: int | None = cap(None, "the longest Nq / Nk it affords (an interpreted kernel): properties draw up to "
                                    "it, and the long-sequence properties skip")
    tiled: bool = cap(False, "a tiled kernel that never materializes an (Nq, Nk) matrix (benchmarked as one)")
    Br: int | None = cap(None, "query rows per tile (tiled kernels)")
    Bc: int | None = cap(None, "keys per tile (tiled kernels)")
    io: Literal["fa1", "fa2"] | None = cap(None, "the loop order whose HBM traffic harness/iomodel.py models")
    split: int | None = cap(None, "keys per split-K partition (Flash-Decoding)")
    oracle: bool = cap(False, "the float64 definition itself, the reference every property compares with")
    nan_caveat: str | None = cap(None, "a documented way NaN inputs fail to propagate (the NaN property then skips, "
                                       "quoting it)")
    triton: bool = cap(False, "a Triton kernel (also checked by the Triton output-and-L property)")
    masked_rows: Literal["zeros", "unspecified"] = cap(
        "zeros", "what a query row that sees no key returns: zeros (the contract), or unspecified (unchecked)")


ATTENTION = define(
    Technique(
        name="attention",
        signature="attention(q, k, v, *, causal: bool = False, scale: float | None = None) -> Tensor",
        summary="exact softmax(q k^T * scale) v with GQA and bottom-right causal alignment",
        properties=("properties.test_attention", "properties.test_triton_attention"),
        reference="reference",
        caps=AttentionCaps,
    )
)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                 causal: bool = False) -> float:
    """Validate the contract's inputs; return the effective scale. Raises ValueError naming the argument."""
    check_causal(causal, "attention")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must have 4 dims (B, heads, N, d), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"attention: {name} must be floating point, got {t.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"attention: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    (B, H, _, d), (Bk, Hkv, _, dk) = q.shape, k.shape
    if Bk != B:
        raise ValueError(f"attention: k has batch {Bk} but q has batch {B}")
    if dk != d:
        raise ValueError(f"attention: k has head dim {dk} but q has head dim {d}")
    if d == 0:
        raise ValueError("attention: q's head dim d must be at least 1, got 0")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"attention: q's {H} heads must be a multiple of k/v's {Hkv} heads")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if scale is None:
        return 1.0 / math.sqrt(d)
    if not (isinstance(scale, int | float) and math.isfinite(scale)):
        raise ValueError(f"attention: scale must be a finite float or None, got {scale!r}")
    return float(scale)


def check_causal(causal, technique: str) -> None:
    """causal must be a real bool: "no", 0.5 or a tensor would otherwise read as True (or raise deep inside)."""
    if not isinstance(causal, bool):
        raise TypeError(f"{technique}: causal must be a bool, got {causal!r} ({type(causal).__name__})")


def no_work_output(q: torch.Tensor, Nk: int) -> torch.Tensor | None:
    """The whole answer when there is nothing to compute: no query rows (B, H or Nq is 0) gives an empty
    output, no keys gives zeros (every row sees no key); None when there is work to do."""
    return torch.zeros_like(q) if q.numel() == 0 or Nk == 0 else None


def causal_allowed(Nq: int, Nk: int, rows: slice = slice(None), cols: slice = slice(None), device=None):
    """Bool (rows, cols) block of the bottom-right causal mask: query i may see key j iff j <= i + Nk - Nq."""
    i = torch.arange(Nq, device=device)[rows, None]  # (Br, 1)
    j = torch.arange(Nk, device=device)[None, cols]  # (1, Bc)
    return j <= i + (Nk - Nq)


def call(impl: Impl, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float | None):
    """Call an implementation under guard and check the promised output.  For an implementation declaring
    ``masked_rows="unspecified"`` the rows that see no key are set to the contract's zeros before any check."""
    out = guarded_call(impl.fn, q, k, v, causal=causal, scale=scale, arg_names=("q", "k", "v"),
                       timeout_s=call_limit(impl))
    if impl.caps.masked_rows == "unspecified" and isinstance(out, torch.Tensor) and out.shape == q.shape:
        out = out.masked_fill(~sees_a_key(q.shape[2], k.shape[2], causal, out.device)[:, None], 0)
    return check_tensor(out, what=f"{impl.name} output", shape=tuple(q.shape), dtype=q.dtype, device=q.device)


def sees_a_key(Nq: int, Nk: int, causal: bool, device=None) -> torch.Tensor:
    """Bool (Nq,): whether query row i sees at least one key (with causal, iff i + Nk - Nq >= 0)."""
    rows = torch.arange(Nq, device=device)
    return (rows + Nk - Nq >= 0) & (Nk > 0) if causal else torch.full((Nq,), Nk > 0, device=device)


def declared_max_len(impl: Impl) -> str | None:
    """The skip reason of the long-sequence properties for a kernel that declares a largest length."""
    return f"declares max_len={impl.caps.max_len}: the other properties draw up to it" if impl.caps.max_len else None
