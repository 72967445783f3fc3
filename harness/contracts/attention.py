"""The attention contract.

    attention(q, k, v, *, causal: bool = False, scale: float | None = None) -> Tensor

* q: (B, H, Nq, d); k, v: (B, Hkv, Nk, d) with H divisible by Hkv (MHA, GQA, MQA).
  Query head h reads kv head h // (H // Hkv).
* scale defaults to 1/sqrt(d).
* causal is aligned bottom-right: query i sees key j iff j <= i + Nk - Nq (FlashAttention >= 2.1,
  and what KV-cache decoding needs). A query row that sees no key returns zeros.  An implementation aligned
  top-left (j <= i: PyTorch SDPA's is_causal, ONNX's Attention operator) declares ``causal_align="top_left"``
  and is judged against the top-left reference; the two agree when Nq = Nk.
* causal must be a bool. B, H, Nq and Nk may be 0: the output is then empty (or zeros when Nk = 0).
* The output has q's shape, dtype and device. Inputs are left unchanged.
* Layouts: q, k and v may each be any strided view, each its own -- heads viewed out of a (B, N, H, d)
  projection, a slice of a larger persistent buffer -- and k need not share v's strides, nor q's.  Read them
  through their strides (or copy them); never infer a layout from the shape (Nk == d, Nq == H, Nq == Nk and
  H == Hkv are all legal shapes of this one layout).
* Devices: q, k and v lie on one device, else ValueError naming the one that is not on q's; the output lies
  on q's device (same_device, on_device_of).
* Memory budget: a call allocates at most MEMORY_BUDGET bytes at once.  An implementation that materializes
  the (B, H, Nq, Nk) scores (not declaring ``tiled``) checks before allocating them (check_scores_budget) and
  raises ValueError naming Nq, Nk and the bytes; a tiled one holds a tile per head and has no such limit.

Exact, up to rounding.  Exact: which keys each row sees, the head mapping, the scale, the zeros of rows that
see no key.  Rounding, and what the earned bounds of harness/engine/tolerance.py admit:
  * each score's dot product and scaling, in any summation order.  float16/bfloat16 inputs carry scores and
    softmax in float32 (score_dtype), as FlashAttention does: in the inputs' own precision q.k overflows
    float16 past 65504 and a bfloat16 logit past 256 is rounded by a nat or more, so at large logits the bound
    is earned by a plain computation with float32 scores, and a kernel keeping half-precision scores fails;
  * normalizing by the row sum (before or after the product with v), or by subtracting a logsumexp
    c = m + log l computed from the same scores (P = exp(S - L), no division), or partitions (o_p, lse_p)
    merged with weights e^(lse_p - lse) without renormalizing (one level of partitions under the total:
    split-K, FlashInfer's merge); exponentials in base e or base 2 of scores scaled by log2(e);
  * P rounded to the inputs' dtype before P V, and the output to it.
  At ordinary logits the bound is k x the largest error of six such plain computations in the dtype
  (references.attention_plain); at logits past ~88 it adds attention_score_conditioning: what rounding the
  scores, and the logsumexps a kernel subtracts (min(|c| eps, c - m) each), costs.  Not admitted at large
  logits: a P recomputed in another order than the scores its L came from, or a deeper tree of lse merges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from llm_inference_harness.contracts import Rule, Technique, batch_rules, define
from llm_inference_harness.engine.capabilities import BatchedCaps, cap
from llm_inference_harness.engine.guard import ContractViolation, call_limit, check_tensor, guarded_call

if TYPE_CHECKING:  # the registry imports the contracts: they name its record for type checking only
    from llm_inference_harness.engine.registry import Impl


@dataclass(frozen=True)
class AttentionCaps(BatchedCaps):
    returns_lse: bool = cap(False, "accepts return_lse=True and then returns (o, L), L the natural-log logsumexp "
                                   "of the scaled, masked scores (what the backward recomputes P from)")
    max_len: int | None = cap(None, "the longest Nq / Nk it affords (an interpreted kernel): properties draw up to "
                                    "it, and the long-sequence properties skip")
    tiled: bool = cap(False, "a tiled kernel that never materializes an (Nq, Nk) matrix (benchmarked as one)")
    Br: int | None = cap(None, "query rows per tile (tiled kernels)")
    Bc: int | None = cap(None, "keys per tile (tiled kernels)")
    io: Literal["fa1", "fa2"] | None = cap(None, "the loop order whose HBM traffic harness/analytic/iomodel.py models")
    split: int | None = cap(None, "keys per split-K partition (Flash-Decoding)")
    oracle: bool = cap(False, "the float64 definition itself, the reference every property compares with")
    nan_caveat: str | None = cap(None, "a documented way NaN inputs fail to propagate (the NaN property then skips, "
                                       "quoting it)")
    triton: bool = cap(False, "a Triton kernel (also checked by the Triton output-and-L property)")
    masked_rows: Literal["zeros", "unspecified"] = cap(
        "zeros", "what a query row that sees no key returns: zeros (the contract), or unspecified (unchecked)")
    causal_align: Literal["bottom_right", "top_left"] = cap(
        "bottom_right", "causal mask when Nq != Nk: query i sees key j <= i + Nk - Nq (bottom_right, FlashAttention "
                        ">= 2.1), or j <= i (top_left: SDPA's is_causal, ONNX Attention)")


ATTENTION = define(
    Technique(
        name="attention",
        signature="attention(q, k, v, *, causal: bool = False, scale: float | None = None) -> Tensor",
        summary="exact softmax(q k^T * scale) v with GQA and bottom-right causal alignment",
        properties=("llm_inference_harness.properties.test_attention",
                    "llm_inference_harness.properties.test_triton_attention",
                    "llm_inference_harness.properties.test_attention_batch"),
        reference="reference",
        caps=AttentionCaps,
        rules=(
            Rule("output", "the output is softmax(q k^T * scale) v with query head h reading kv head h // (H // Hkv), "
                           "exact up to the rounding its dtype's earned bound admits",
                 ("matches_reference", "long_keys_and_wide_heads", "key_value_permutation_invariance",
                  "rows_are_convex_combinations_of_values", "triton_output_and_lse_match_reference")),
            Rule("causal alignment", "causal is aligned bottom-right (query i sees key j iff j <= i + Nk - Nq), "
                                     "top-left where declared", ("causal_alignment_is_the_declared_one",)),
            Rule("logsumexp", "a forward declaring returns_lse returns (o, L), L the natural-log logsumexp of the "
                              "scaled, masked scores",
                 ("returned_lse_is_logsumexp_of_scaled_scores", "triton_output_and_lse_match_reference")),
            Rule("large logits", "scores of any magnitude give a finite output within the earned bound (no overflow "
                                 "of exp)",
                 ("large_logits_stay_finite_and_correct", "scores_1000_999_998_10", "triton_large_logits")),
            Rule("NaN", "a NaN input reaches every output entry that reads it (or the call is rejected)",
                 ("nan_inputs_propagate",)),
            Rule("empty shapes", "B, H, Nq and Nk may be 0: the output has q's shape, zeros where no key is seen",
                 ("empty_shapes_give_empty_output",)),
            Rule("bad input", "shapes, flags, dtypes and devices that break the contract raise ValueError/TypeError "
                              "naming the argument, never a silent answer", ("rejects_bad_input",)),
            *batch_rules("query_chunks_are_invariant"),
        ),
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
    same_device("attention", q, k=k, v=v)
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


def same_device(technique: str, q: torch.Tensor, **others: torch.Tensor) -> None:
    """Every tensor argument on q's device, or a ValueError naming the one that is not: a kernel that moves it
    silently hides a copy per call; one that does not check reads another device's pointer."""
    for name, t in others.items():
        if t.device != q.device:
            raise ValueError(f"{technique}: {name} is on {t.device} but q is on {q.device}; every tensor argument "
                             "must be on one device")


# The working-memory budget of one call (module docstring).  2 GiB: the largest (Nq, Nk) score matrix a CPU test
# machine affords next to its other work; a 60,000-token prompt's scores are 14 GB.
MEMORY_BUDGET = 2 * 2**30


def check_scores_budget(technique: str, q: torch.Tensor, Nk: int, copies: int = 1, dtype=None) -> None:
    """For an implementation that materializes ``copies`` (B, H, Nq, Nk) matrices of ``dtype`` (default the
    scores': score_dtype(q.dtype)): a ValueError naming the sizes, before allocating, when they exceed
    MEMORY_BUDGET."""
    B, H, Nq = q.shape[:3]
    size = torch.empty((), dtype=dtype or score_dtype(q.dtype)).element_size()
    need = copies * B * H * Nq * Nk * size
    if need > MEMORY_BUDGET:
        raise ValueError(f"{technique}: {copies} x the (B, H, Nq, Nk) = ({B}, {H}, {Nq}, {Nk}) score matrix needs "
                         f"{need / 2**30:.1f} GiB at once, past the memory budget of {MEMORY_BUDGET / 2**30:g} GiB "
                         "(llm_inference_harness.contracts.attention.MEMORY_BUDGET); a tiled implementation needs no "
                         "such matrix")


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores and softmax are carried in for inputs of ``dtype``: float32 for float16/bfloat16
    (as FlashAttention's kernels do; the module docstring says why), the inputs' own otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def check_causal(causal, technique: str) -> None:
    """causal must be a real bool: "no", 0.5 or a tensor would otherwise read as True (or raise deep inside)."""
    if not isinstance(causal, bool):
        raise TypeError(f"{technique}: causal must be a bool, got {causal!r} ({type(causal).__name__})")


def no_work_output(q: torch.Tensor, Nk: int) -> torch.Tensor | None:
    """The whole answer when there is nothing to compute: no query rows (B, H or Nq is 0) gives an empty
    output, no keys gives zeros (every row sees no key); None when there is work to do."""
    return torch.zeros_like(q) if q.numel() == 0 or Nk == 0 else None


def causal_allowed(Nq: int, Nk: int, rows: slice = slice(None), cols: slice = slice(None), device=None,
                   align: str = "bottom_right"):
    """Bool (rows, cols) block of the causal mask: query i may see key j iff j <= i + Nk - Nq (bottom-right), or
    j <= i (``align="top_left"``)."""
    i = torch.arange(Nq, device=device)[rows, None]  # (Br, 1)
    j = torch.arange(Nk, device=device)[None, cols]  # (1, Bc)
    return j <= i + (0 if align == "top_left" else Nk - Nq)


def call(impl: Impl, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float | None):
    """Call an implementation under guard and check the promised output.  For an implementation declaring
    ``masked_rows="unspecified"`` the rows that see no key are set to the contract's zeros before any check."""
    out = guarded_call(impl.fn, q, k, v, causal=causal, scale=scale, arg_names=("q", "k", "v"),
                       timeout_s=call_limit(impl))
    if impl.caps.masked_rows == "unspecified" and isinstance(out, torch.Tensor) and out.shape == q.shape:
        out = out.masked_fill(~sees_a_key(q.shape[2], k.shape[2], causal, out.device, impl.caps.causal_align)[:, None],
                              0)
    return on_device_of(q, check_tensor(out, what=f"{impl.name} output", shape=tuple(q.shape), dtype=q.dtype,
                                        device=q.device), f"{impl.name} output")


def on_device_of(q: torch.Tensor, out: torch.Tensor, what: str) -> torch.Tensor:
    """``out`` itself, if it lies on q's device (the index too: cuda:1 inputs give cuda:1 outputs)."""
    if out.device != q.device:
        raise ContractViolation(f"{what}: returned a tensor on {out.device}, expected q's device {q.device}")
    return out


def sees_a_key(Nq: int, Nk: int, causal: bool, device=None, align: str = "bottom_right") -> torch.Tensor:
    """Bool (Nq,): whether query row i sees at least one key (with causal, iff i + Nk - Nq >= 0; top-left: always
    where there is a key)."""
    rows = torch.arange(Nq, device=device)
    offset = 0 if align == "top_left" else Nk - Nq
    return (rows + offset >= 0) & (Nk > 0) if causal else torch.full((Nq,), Nk > 0, device=device)


def declared_max_len(impl: Impl) -> str | None:
    """The skip reason of the long-sequence properties for a kernel that declares a largest length."""
    return f"declares max_len={impl.caps.max_len}: the other properties draw up to it" if impl.caps.max_len else None
