"""Batch-invariant arithmetic: every reduction in an order fixed by the positions of its terms alone.

A sum over n terms zero-pads them to the next power of two and folds the halves, x[:w] + x[w:], until one
term is left (`tree_sum`); `matmul` (and `linear` through it) adds a dot product's terms one
after another, k = 0, 1, ... (no split of K: the order a GEMM kernel without split-K keeps for every
output).  Each addition is one correctly rounded elementwise operation, so a result depends only on its own
terms -- never on how many other rows share the call, how the work is split over threads, or which GEMM
kernel a library picks for the shape.  Extra trailing zeros change nothing (t + 0 = t): a row whose visible
keys are a prefix gives the same bits whatever the padded width of the batch around it.  Invariant:
``tree_sum(pad(x, m)) == tree_sum(x)`` bitwise for any m trailing zeros, and likewise `matmul` along K.

Why spell it out on CPUs: MKL's GEMM picks its kernel by the number of rows M (M = 1 takes a GEMV path,
other blockings start at 4 or 8 rows), and torch's fused GELU computes the tail of a contiguous run with the
scalar erf, so one row's output moves in its last bits with the batch around it (harness/engine/batch_invariance.py
measures it).  He et al. 2025, "Defeating Nondeterminism in LLM Inference" (Thinking Machines Lab), sections
"batch invariance" and "fixed split-size"; on GPUs the same is one tile configuration and no split-K (the
batch_invariant_ops library).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from llm_inference_harness.numerics.online_softmax import Partial, finalize


def tree_sum(x: torch.Tensor, dim: int = -1, *, consume: bool = False) -> torch.Tensor:
    """Sum over ``dim`` by folding halves of the zero-padded power-of-two width; the dim is removed.
    ``consume``: x is a temporary of the caller's, folded in place when its width is a power of two."""
    dim, n = dim % x.dim(), x.shape[dim]
    width = 1 << max(0, n - 1).bit_length()
    if width == n and consume:
        return _fold(x, dim)
    padded = x.new_zeros((*x.shape[:dim], width, *x.shape[dim + 1:]))  # trailing zeros: no fold tells them apart
    padded.narrow(dim, 0, n).copy_(x)
    return _fold(padded, dim)


def _fold(x: torch.Tensor, dim: int) -> torch.Tensor:
    """tree_sum of a power-of-two wide ``x`` that the caller hands over: folded in place."""
    width = x.shape[dim]
    while width > 1:
        width //= 2
        x = x.narrow(dim, 0, width).add_(x.narrow(dim, width, width))  # term i meets term i + width
    return x.squeeze(dim)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (..., M, K) @ b (..., K, N), each dot product accumulated in the order k = 0, 1, ..., K - 1 -- one
    multiplication and one addition per term, no split of K -- whatever M, N and the batch dims are."""
    out = a[..., :, :1].sum(-1, keepdim=True) * b[..., :1, :].sum(-2, keepdim=True)  # (..., M, N): the k = 0 term
    for k in range(1, a.shape[-1]):
        out += a[..., :, k:k + 1] * b[..., k:k + 1, :]  # (..., M, 1) * (..., 1, N)
    return out


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear: input (..., in) @ weight.T + bias, each output a `matmul` dot product over the in-features
    (one multiply-add sweep per in-feature over the whole batch: a tenth of the time of summing the
    materialized products as a tree, for the same independence of M)."""
    y = matmul(input.reshape(-1, input.shape[-1]), weight.T.contiguous())  # (M, in) @ (in, out): rows read whole
    y = y.reshape(*input.shape[:-1], weight.shape[0])  # (..., out)
    return y if bias is None else y + bias


def layer_norm(input: torch.Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """F.layer_norm over the last dim: mean and variance as trees, (x - mean) / sqrt(var + eps) * weight + bias."""
    D = input.shape[-1]
    if tuple(normalized_shape) != (D,):
        raise NotImplementedError(f"fixed_order.layer_norm: normalizes the last dim only, got {normalized_shape}")
    centred = input - (tree_sum(input) / D)[..., None]
    y = centred / torch.sqrt(tree_sum(centred * centred) / D + eps)[..., None]
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU from separate elementwise ops: torch's fused kernel computes a run's tail with the scalar erf,
    its body with the vectorized one (they differ in the last bit); torch.erf is one function throughout."""
    if approximate != "none":
        raise NotImplementedError(f"fixed_order.gelu: approximate={approximate!r} is not provided")
    return input * 0.5 * (1 + torch.erf(input * (0.5 ** 0.5)))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v over the visible keys; q (B, H, Nq, d), k, v (B, Hkv, Nk, d), visible
    broadcastable to (B, 1, 1, Nq, Nk) and true on a prefix of each row's keys.  A row that sees no key
    gives zeros."""
    B, H, Nq, d = q.shape
    return finalize(attention_partial(q, k, v, visible, scale)).reshape(B, H, Nq, d)  # (B, H, Nq, d)


def attention_partial(q, k, v, visible, scale) -> Partial:
    """The online-softmax partial (m, l, acc) of `attention`, each (B, Hkv, G, Nq[, d]): scores are `matmul`
    dot products over d, l and acc trees and `matmul` sums over the keys; invisible keys add exact zeros
    (their values are zeroed first, so NaN garbage in unused slots cannot leak through 0 * NaN)."""
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    visible = visible.expand(B, 1, 1, Nq, Nk)
    seen = visible.any(dim=3)[..., None]  # (B, 1, 1, Nk, 1): keys some query sees
    k, v = (torch.where(seen, t[:, :, None], 0) for t in (k, v))  # (B, Hkv, 1, Nk, d)
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d)  # (B, Hkv, G, Nq, d): head h reads kv head h // G
    s = (matmul(qg, k.transpose(-1, -2)) * scale).masked_fill(~visible, float("-inf"))  # (B, Hkv, G, Nq, Nk)
    m = s.amax(dim=-1)  # exact: a max does not round
    p = torch.exp(s - torch.where(torch.isfinite(m), m, 0)[..., None])  # (B, Hkv, G, Nq, Nk); 0 where invisible
    return Partial(m, tree_sum(p), matmul(p, v))  # (B, Hkv, G, Nq), (B, Hkv, G, Nq), (B, Hkv, G, Nq, d)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention (boolean or no mask, is_causal top-left as torch's) via `attention`."""
    q, k, v = query, key, value
    if dropout_p or (attn_mask is not None and attn_mask.dtype != torch.bool):
        raise NotImplementedError("fixed_order.sdpa: no dropout, and only boolean masks")
    if not enable_gqa and q.shape[-3] != k.shape[-3]:  # as torch's: grouped heads only when asked for
        raise ValueError(f"fixed_order.sdpa: {q.shape[-3]} query heads, {k.shape[-3]} key heads, enable_gqa=False")
    Nq, Nk = q.shape[-2], k.shape[-2]
    visible = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    if is_causal:
        visible = visible.tril()
    if attn_mask is not None:
        if attn_mask.dim() > 2 and (attn_mask.dim() != 4 or attn_mask.shape[1] != 1):
            raise NotImplementedError(f"fixed_order.sdpa: masks of shape (Nq, Nk) or (B, 1, Nq, Nk), got "
                                      f"{tuple(attn_mask.shape)}")
        visible = visible & attn_mask
    visible = visible[:, :, None] if visible.dim() == 4 else visible[None, None, None]  # (B|1, 1, 1, Nq, Nk)
    return attention(q, k, v, visible, q.shape[-1] ** -0.5 if scale is None else scale)


class BatchInvariantMode(TorchFunctionMode):
    """Within ``with BatchInvariantMode():`` the layers of a model compute with fixed-order reductions:
    F.linear, F.layer_norm, F.gelu and F.scaled_dot_product_attention are replaced by this module's
    versions; every other op runs as usual (elementwise ops and lookups are batch invariant already).
    What batch_invariant_ops' ``set_batch_invariant_mode`` does with torch.library overrides on GPUs."""

    REPLACED = {F.linear: linear, F.layer_norm: layer_norm, F.gelu: gelu, F.scaled_dot_product_attention: sdpa}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.REPLACED.get(func, func)(*args, **(kwargs or {}))
