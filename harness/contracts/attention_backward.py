"""The attention backward contract.

    attention_backward(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None)
        -> (dq, dk, dv)

* q, k, v, causal, scale: exactly as in the forward contract (harness/contracts/attention.py):
  q (B, H, Nq, d); k, v (B, Hkv, Nk, d), query head h reads kv head h // (H // Hkv); bottom-right
  causal alignment; scale defaults to 1/sqrt(d).
* o (B, H, Nq, d): the forward output, q's dtype.  do (B, H, Nq, d): the gradient of the loss w.r.t. o.
* lse (B, H, Nq): per-row logsumexp of the scaled, masked scores, L_i = log sum_j e^(scale q_i.k_j),
  in float32 or float64; a row that sees no key has L_i = -inf (and o_i = 0).
* Returns dq, dk, dv with the shapes, dtype and device of q, k, v.  The gradient of a kv head shared
  by G query heads is the sum over those heads.  A row that sees no key contributes nothing: its dq
  row is 0.  Inputs are left unchanged.
* causal must be a bool.  B, H, Nq and Nk may be 0: the gradients are then empty (dq is 0 when Nk = 0).
* Layouts: every tensor argument may be a strided view, each its own -- o, lse and dO too: the outputs of a
  previous call are not always contiguous (FlashAttention pads lse to whole row blocks; autograd hands a
  transposed dO) -- and no layout may be inferred from the shape (H == Nq makes lse square).
* Devices: every tensor argument on q's device, else ValueError naming it; the gradients on q's device.
* Memory budget: as the forward's (harness/contracts/attention.py): an implementation that materializes
  (Nq, Nk) matrices (S, P, dP, dS; not declaring ``tiled``) refuses, before allocating, a call whose matrices
  exceed MEMORY_BUDGET, with a ValueError naming Nq and Nk.

Exact, up to rounding.  Exact: the masking, the head mapping and the group sums, zero dq rows for rows that see
no key.  Rounding, admitted by the earned gradient bounds: the scores in any order (float32 for half inputs),
P recomputed as exp(S - L) from the delivered L (base e, or base 2 of S log2 e - L log2 e) or as a softmax,
D = rowsum(dO o O) in any order (products rounded or fused), the scale applied before or after the products,
the sums over query tiles and over the G heads of a group in any order (references.attention_backward_plain).

Forward implementations (technique "attention") that can also return L declare
``caps={"returns_lse": True}`` and accept a keyword ``return_lse=True``, with which they return
``(o, lse)`` instead of ``o``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from llm_inference_harness.contracts import Rule, Technique, define
from llm_inference_harness.contracts.attention import check_inputs, on_device_of, same_device
from llm_inference_harness.engine.capabilities import Caps, cap
from llm_inference_harness.engine.guard import ContractViolation, call_limit, check_tensor, guarded_call

if TYPE_CHECKING:  # the registry imports the contracts: they name its record for type checking only
    from llm_inference_harness.engine.registry import Impl


@dataclass(frozen=True)
class AttentionBackwardCaps(Caps):
    max_len: int | None = cap(None, "the longest Nq / Nk it affords (an interpreted kernel): properties draw up to "
                                    "it, and the long-sequence properties skip")
    tiled: bool = cap(False, "never stores an (Nq, Nk) matrix (checked by the peak-memory property)")
    Br: int | None = cap(None, "query rows per tile (tiled kernels)")
    Bc: int | None = cap(None, "keys per tile (tiled kernels)")
    oracle: bool = cap(False, "the float64 definition itself (autograd through the reference forward)")
    triton: bool = cap(False, "a Triton kernel")

ATTENTION_BACKWARD = define(
    Technique(
        name="attention_backward",
        signature="attention_backward(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None)"
                  " -> (dq, dk, dv)",
        summary="gradients dq, dk, dv of exact attention from (q, k, v, o, lse, dO)",
        properties=("llm_inference_harness.properties.test_attention_backward",),
        reference="reference",
        caps=AttentionBackwardCaps,
        rules=(
            Rule("gradients", "dq, dk, dv equal float64 autograd within the earned gradient bound of their dtype, "
                              "whatever the shapes and strides",
                 ("matches_reference", "matches_reference_on_ambiguous_shapes", "matches_reference_past_one_tile",
                  "matches_reference_on_found_cases", "key_gradients_sum_to_zero")),
            Rule("large logits", "scores of any magnitude give finite gradients within the earned bound",
                 ("large_logits_stay_finite_and_correct",)),
            Rule("masked rows", "a row that sees no key contributes nothing: its dq row is 0",
                 ("fully_masked_rows_give_zero_gradients",)),
            Rule("memory", "a tiled backward never allocates a head's (Nq, Nk) score matrix",
                 ("never_materializes_the_score_matrix",)),
            Rule("empty shapes", "B, H, Nq and Nk may be 0: gradients of q's, k's and v's shapes, dq 0 where no key "
                                 "is seen", ("empty_shapes_give_empty_gradients",)),
            Rule("bad input", "inputs that break the contract raise ValueError/TypeError naming the argument",
                 ("rejects_bad_input",)),
        ),
    )
)


def check_backward_inputs(q, k, v, o, lse, do, scale: float | None = None, causal: bool = False) -> float:
    """Validate the contract's inputs; return the effective scale. Raises ValueError naming the argument."""
    scale = check_inputs(q, k, v, scale, causal)
    for name, t in (("o", o), ("do", do), ("lse", lse)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention_backward: {name} must be a torch.Tensor, got {type(t).__name__}")
    same_device("attention_backward", q, o=o, lse=lse, do=do)
    for name, t in (("o", o), ("do", do)):
        if t.shape != q.shape or t.dtype != q.dtype:
            raise ValueError(f"attention_backward: {name} must have q's shape {tuple(q.shape)} and dtype {q.dtype}, "
                             f"got {tuple(t.shape)} {t.dtype}")
    if lse.shape != q.shape[:-1] or lse.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"attention_backward: lse must be float32/float64 of shape {tuple(q.shape[:-1])} (B, H, Nq), "
                         f"got {tuple(lse.shape)} {lse.dtype}")
    if lse.numel() and bool((lse.isnan() | (lse == float("inf"))).any()):  # O(B H Nq): one cheap pass
        raise ValueError("attention_backward: lse must be finite, or -inf on rows that see no key; it holds NaN "
                         "or +inf (a NaN L would be read as 'no key' and give finite, wrong gradients)")
    return scale


def call(impl: Impl, q, k, v, o, lse, do, *, causal: bool, scale: float | None):
    """Call an implementation under guard and check the three promised gradients."""
    out = guarded_call(impl.fn, q, k, v, o, lse, do, causal=causal, scale=scale,
                       arg_names=("q", "k", "v", "o", "lse", "do"), timeout_s=call_limit(impl))
    if not (isinstance(out, tuple | list) and len(out) == 3):
        got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, tuple | list) else type(out).__name__
        raise ContractViolation(f"{impl.name}: returned {got}, expected a tuple (dq, dk, dv)")
    return tuple(on_device_of(q, check_tensor(g, what=f"{impl.name} {name}", shape=tuple(x.shape), dtype=x.dtype,
                                              device=x.device), f"{impl.name} {name}")
                 for g, name, x in zip(out, ("dq", "dk", "dv"), (q, k, v), strict=True))
