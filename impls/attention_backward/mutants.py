"""Known-wrong attention backward kernels, each modelled on a real bug. The properties must kill every one.

All share one FA-2-backward-shaped loop (K/V blocks outer, Q blocks inner, P recomputed from L) with a
single bug switched on, so each differs from impls/attention_backward/fa2.py by exactly that bug.
"""

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs, check_scores_budget
from llm_inference_harness.contracts.attention_backward import check_backward_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.attention.mutants import as_if_contiguous

BUGS = {
    "unmasked_key_padding": "K/V padded to a multiple of the tile with unwritten (NaN) slots and keys past Nk "
                            "not masked in the backward: NaN dQ (FlashAttention/vLLM varlen bugs)",
    "drops_one_key_tile": "tile count ceil((Nk - 1) / Bc): the partial last key tile is skipped when Nk % Bc == 1",
    "delta_from_q": "D_i computed from the wrong (same-shaped) tensor, dO_i . Q_i instead of dO_i . O_i",
    "gqa_first_head_only": "dK, dV of a shared kv head taken from the first query head of its group, not summed",
    "masked_row_nan": "L = -inf of a row that sees no key used unguarded: exp(-inf - (-inf)) = NaN",
    "dq_overwritten": "a query tile's dQ assigned by each key tile instead of accumulated (only the last one counts)",
    "do_read_contiguous": "dO read through its data pointer with contiguous strides (autograd hands a transposed dO)",
    "lse_read_contiguous": "L read through its data pointer as a contiguous (B, H, Nq): FlashAttention pads L to "
                           "whole row blocks, so the L a caller slices off is a strided view",
    "keys_past_4096_dropped": "key tiles past 4096 keys never launched: a grid sized for 128 tiles of 32",
    "half_scores_rounded": "float16/bfloat16 scores recomputed and rounded to the inputs' dtype before "
                           "P = exp(S - L): past logit 256 bfloat16 moves each score by a nat or more",
    "lse_sniffed_square": "accepts L stored (B, Nq, H) too (the layout of packed and varlen kernels), sniffed from "
                          "the shape: when H == Nq the (B, H, Nq) L is read transposed",
    "output_on_k_device": "devices never compared: every input moved to k's device and the gradients computed "
                          "there (meta gradients for a CPU q)",
}
KILLED_BY = {
    "unmasked_key_padding": ("matches_reference",),
    "drops_one_key_tile": ("matches_reference",),
    "delta_from_q": ("key_gradients_sum_to_zero",),
    "gqa_first_head_only": ("matches_reference",),
    "masked_row_nan": ("fully_masked_rows_give_zero_gradients",),
    "dq_overwritten": ("matches_reference",),
    "do_read_contiguous": ("matches_reference",),
    "lse_read_contiguous": ("matches_reference",),
    "keys_past_4096_dropped": ("matches_reference_past_one_tile",),
    "lse_sniffed_square": ("matches_reference_on_ambiguous_shapes",),
    "output_on_k_device": ("rejects_bad_input",),
    "half_scores_rounded": ("large_logits_stay_finite_and_correct",),
}


def buggy_attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, bug: str, Br=32, Bc=32):
    if bug == "output_on_k_device":  # moved to k's device, then only the shapes are checked (L's values can't be)
        q, v, o, lse, do = (t.to(k.device) for t in (q, v, o, lse, do))
        scale = check_inputs(q, k, v, scale, causal)
    else:
        scale = check_backward_inputs(q, k, v, o, lse, do, scale, causal)
    check_scores_budget("attention_backward mutant", q, k.shape[2])  # as the untiled implementations do
    do = as_if_contiguous(do) if bug == "do_read_contiguous" else do
    lse = as_if_contiguous(lse) if bug == "lse_read_contiguous" else lse
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    lse = lse.transpose(1, 2) if bug == "lse_sniffed_square" and H == Nq else lse  # (B, Nq, H) read as (B, H, Nq)
    qg, og, dog = (t.reshape(B, Hkv, H // Hkv, Nq, d).double() for t in (q, o, do))  # (B, Hkv, G, Nq, d)
    kg, vg = k[:, :, None].double(), v[:, :, None].double()  # (B, Hkv, 1, Nk, d)
    n_keys = Nk
    if bug == "unmasked_key_padding":  # unwritten slots up to the tile edge, NaN as vLLM fills them; never masked
        n_keys = -(-Nk // Bc) * Bc
        pad = torch.full((B, Hkv, 1, n_keys - Nk, d), float("nan"), dtype=torch.float64, device=q.device)
        kg, vg = torch.cat([kg, pad], dim=3), torch.cat([vg, pad], dim=3)  # (B, Hkv, 1, n_keys, d)
    D = ((dog * (qg if bug == "delta_from_q" else og)).sum(-1))  # (B, Hkv, G, Nq)
    L = lse.reshape(D.shape).double()
    L = L if bug == "masked_row_nan" else torch.where(torch.isfinite(L), L, 0)
    dq, dk, dv = torch.zeros_like(qg), torch.zeros_like(kg[:, :, 0]), torch.zeros_like(vg[:, :, 0])
    n_tiles = -(-(Nk - 1) // Bc) if bug == "drops_one_key_tile" else -(-n_keys // Bc)
    n_tiles = min(n_tiles, 4096 // Bc) if bug == "keys_past_4096_dropped" else n_tiles
    for j0 in range(0, n_tiles * Bc, Bc):
        j1 = min(j0 + Bc, n_keys)
        kj, vj = kg[..., j0:j1, :], vg[..., j0:j1, :]  # (B, Hkv, 1, Bc, d)
        for i0 in range(0, Nq, Br):
            i1 = min(i0 + Br, Nq)
            s = qg[..., i0:i1, :] @ kj.transpose(-1, -2) * scale  # (B, Hkv, G, Br, Bc)
            if bug == "half_scores_rounded" and q.dtype in (torch.float16, torch.bfloat16):
                s = s.to(q.dtype).double()
            if causal:  # key j visible to query i iff j <= i + Nk - Nq (this alone says nothing of j >= Nk)
                i, j = torch.arange(i0, i1, device=q.device), torch.arange(j0, j1, device=q.device)
                s = s.masked_fill(j[None, :] > i[:, None] + Nk - Nq, float("-inf"))  # (Br, Bc) mask
            p = torch.exp(s - L[..., i0:i1, None])  # (B, Hkv, G, Br, Bc)
            ds = p * (dog[..., i0:i1, :] @ vj.transpose(-1, -2) - D[..., i0:i1, None])  # (B, Hkv, G, Br, Bc)
            if bug == "dq_overwritten":
                dq[..., i0:i1, :] = ds @ kj * scale
            else:
                dq[..., i0:i1, :] += ds @ kj * scale
            dvj, dkj = p.transpose(-1, -2) @ dog[..., i0:i1, :], ds.transpose(-1, -2) @ qg[..., i0:i1, :] * scale
            head = slice(0, 1) if bug == "gqa_first_head_only" else slice(None)  # (B, Hkv, G, Bc, d) -> group sum
            dv[..., j0:j1, :] += dvj[:, :, head].sum(dim=2)
            dk[..., j0:j1, :] += dkj[:, :, head].sum(dim=2)
    return dq.reshape(q.shape).to(q.dtype), dk[..., :Nk, :].to(k.dtype), dv[..., :Nk, :].to(v.dtype)


for _bug, _what in BUGS.items():
    register("attention_backward", f"mutant_{_bug}", devices=("cpu", "cuda"), mutant=True, bug=_what,
             killed_by=KILLED_BY[_bug])(
        lambda q, k, v, o, lse, do, *, causal=False, scale=None, _bug=_bug: buggy_attention_backward(
            q, k, v, o, lse, do, causal=causal, scale=scale, bug=_bug))


def scores_past_budget(q, k, v, o, lse, do, *, causal=False, scale=None):
    """The standard backward (S, P, dP, dS materialized in float64) with no look at the memory budget."""
    scale = check_backward_inputs(q, k, v, o, lse, do, scale, causal)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    qg, og, dog = (t.reshape(B, Hkv, H // Hkv, Nq, d).double() for t in (q, o, do))  # (B, Hkv, G, Nq, d)
    kg, vg = k[:, :, None].double(), v[:, :, None].double()  # (B, Hkv, 1, Nk, d)
    L = lse.double().reshape(B, Hkv, H // Hkv, Nq, 1)
    s = qg @ kg.transpose(-1, -2) * scale  # (B, Hkv, G, Nq, Nk)
    if causal:
        s = s.masked_fill(~causal_allowed(Nq, Nk, device=q.device), float("-inf"))
    p = torch.exp(s - torch.where(torch.isfinite(L), L, 0))
    ds = p * (dog @ vg.transpose(-1, -2) - (dog * og).sum(-1, keepdim=True))  # (B, Hkv, G, Nq, Nk)
    dq, dk = (ds @ kg * scale).reshape(q.shape), (ds.transpose(-1, -2) @ qg).sum(dim=2) * scale
    return dq.to(q.dtype), dk.to(k.dtype), (p.transpose(-1, -2) @ dog).sum(dim=2).to(v.dtype)


register("attention_backward", "mutant_scores_past_budget", devices=("cpu", "cuda"), mutant=True,
         bug="materializes S, P, dP and dS without the memory budget: a 60,000-token backward tries to allocate "
             "115 GB instead of raising", killed_by=("rejects_bad_input",))(scores_past_budget)
