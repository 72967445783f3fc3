"""Known-wrong attention kernels, each modelled on a real bug. The properties must kill every one.

All share one FA-2-shaped loop (Q blocks outer, K/V blocks inner) with a single bug switched on,
so each differs from a correct tiled kernel by exactly the bug it is named after.
"""

import torch

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs, check_scores_budget, no_work_output
from llm_inference_harness.engine.registry import register

BUGS = {
    "cheating_softmax": "each key block normalized on its own and the block outputs averaged",
    "missing_rescale": "running sum and output not rescaled by e^(m - m') when the max grows",
    "causal_top_left": "causal mask aligned top-left (j <= i) instead of bottom-right when Nq != Nk",
    "causal_one_past_diagonal": "causal mask one key too wide (j <= i + 1, tril's diagonal off by one): each "
                                "row also sees the next token",
    "drops_partial_tile": "the partial last key tile (Nk % Bc keys) is never visited",
    "unscaled_scores": "default scale 1 instead of 1/sqrt(d)",
    "contiguous_strides": "q, k, v read through their data pointers with contiguous strides: heads viewed out of "
                          "a (B, N, H, d) projection are read as garbage",
    "kv_shared_strides": "v read with k's strides, one set of kv strides passed to the kernel (vLLM's launchers "
                         "take kv_block_stride from the key cache): exact until k and v are laid out differently",
    "square_packed_qkv": "Nq == Nk and H == Hkv taken as self-attention over one packed QKV buffer: k and v read "
                         "with q's strides",
    "sniffs_transposed_keys": "accepts K^T too, sniffed from the shape: when Nk == d, k is read as (B, Hkv, d, Nk)",
    "half_scores_unshifted": "the float16/bfloat16 path skips the max subtraction ('half logits are small'): exp "
                             "overflows past 88 and underflows every key of a row far below zero",
    "half_scores_rounded": "float16/bfloat16 scores rounded to the inputs' dtype before the softmax (a math path "
                           "that keeps S in half precision): past logit 256 bfloat16 moves each score by a nat or "
                           "more",
    "keys_past_4096_dropped": "keys past 4096 never visited: a grid sized for 128 key blocks of 32 (split-K kernels "
                              "sized by a maximum sequence length)",
}
KILLED_BY = {**{name: ("matches_reference",) for name in BUGS},
             "half_scores_unshifted": ("large_logits_stay_finite_and_correct",),
             "half_scores_rounded": ("large_logits_stay_finite_and_correct",),
             "keys_past_4096_dropped": ("long_keys_and_wide_heads",),
             # wrong only where three draws meet (Nq == Nk, H == Hkv, k or v in another layout than q): every law
             # that compares values over the drawn cases has its chance at it
             "square_packed_qkv": ("matches_reference", "rows_are_convex_combinations_of_values",
                                   "key_value_permutation_invariance")}
HALF = (torch.float16, torch.bfloat16)


def buggy_attention(q, k, v, *, causal=False, scale=None, bug: str, Br=32, Bc=32):
    scale = 1.0 if bug == "unscaled_scores" and scale is None else check_inputs(q, k, v, scale, causal)
    check_scores_budget("attention mutant", q, k.shape[2])  # as the untiled implementations do: one bug apart
    if bug == "contiguous_strides":
        q, k, v = (as_if_contiguous(t) for t in (q, k, v))
    if bug == "kv_shared_strides":
        v = read_with_strides(v, k.stride())
    if bug == "square_packed_qkv" and q.shape[1:3] == k.shape[1:3]:
        k, v = read_with_strides(k, q.stride()), read_with_strides(v, q.stride())
    if bug == "sniffs_transposed_keys" and k.shape[2] == k.shape[3]:
        k = k.transpose(-1, -2)
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    qg = q.reshape(B, Hkv, H // Hkv, Nq, d).double()  # (B, Hkv, G, Nq, d)
    kT, vg = k[:, :, None].transpose(-1, -2).double(), v[:, :, None].double()  # (B,Hkv,1,d,Nk), (B,Hkv,1,Nk,d)
    offset = 0 if bug == "causal_top_left" else Nk - Nq
    k_stop = {"drops_partial_tile": (Nk // Bc) * Bc, "keys_past_4096_dropped": min(Nk, 4096)}.get(bug, Nk)
    unshifted = bug == "half_scores_unshifted" and q.dtype in HALF
    out = torch.zeros(qg.shape, dtype=torch.float64, device=q.device)
    for i0 in range(0, Nq, Br):
        i1 = min(i0 + Br, Nq)
        m = torch.full((*qg.shape[:3], i1 - i0), float("-inf"), dtype=torch.float64, device=q.device)
        l, acc, blocks = torch.zeros_like(m), torch.zeros_like(qg[..., i0:i1, :]), 0  # noqa: E741
        for j0 in range(0, k_stop, Bc):
            j1 = min(j0 + Bc, Nk)
            s = qg[..., i0:i1, :] @ kT[..., j0:j1] * scale  # (B, Hkv, G, Br, Bc)
            if bug == "half_scores_rounded" and q.dtype in HALF:
                s = s.to(q.dtype).double()
            if causal:
                i, j = torch.arange(i0, i1, device=q.device), torch.arange(j0, j1, device=q.device)
                wide = 1 if bug == "causal_one_past_diagonal" else 0
                s = s.masked_fill(~(j[None, :] <= i[:, None] + offset + wide), float("-inf"))  # (Br, Bc) mask
            m_new = torch.maximum(m, s.amax(-1))
            m_safe = torch.zeros_like(m_new) if unshifted else torch.where(torch.isfinite(m_new), m_new, 0)
            p = torch.exp(s - m_safe[..., None])
            if bug == "cheating_softmax":  # normalize inside the block, average over blocks
                lb = p.sum(-1, keepdim=True)
                acc = acc + torch.where(lb > 0, p / torch.where(lb > 0, lb, 1), 0) @ vg[..., j0:j1, :]
                blocks += 1
                l = torch.full_like(l, float(blocks))  # noqa: E741
                continue
            alpha = torch.ones_like(m) if bug == "missing_rescale" else torch.exp(m - m_safe)
            l = alpha * l + p.sum(-1)  # noqa: E741
            acc = alpha[..., None] * acc + p @ vg[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = torch.where(l[..., None] > 0, acc / torch.where(l > 0, l, 1)[..., None], 0)
    return out.to(q.dtype).reshape(B, H, Nq, d)  # (B, H, Nq, d)


def as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t's storage from its first element, read with the strides of a contiguous tensor of its shape."""
    return read_with_strides(t, torch.empty(t.shape, device="meta").stride())


def read_with_strides(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """t's storage from its first element read with other strides, as a kernel handed a raw pointer reads it;
    what lies past the storage reads as NaN (the garbage a real kernel would find there)."""
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())  # the whole storage, 1-d
    need = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, strides, strict=True)) + 1
    if t.numel() and need > flat.numel():
        flat = torch.cat([flat, flat.new_full((need - flat.numel(),), float("nan"))])
    return flat.as_strided(t.shape, strides, t.storage_offset())


def output_on_k_device(q, k, v, *, causal=False, scale=None):
    """The devices are never compared: the work runs where the KV cache lives, and so does the result (a meta
    tensor for a CPU q and a meta k)."""
    return buggy_attention(q.to(k.device), k, v.to(k.device), causal=causal, scale=scale, bug="")


def scores_past_budget(q, k, v, *, causal=False, scale=None):
    """Materializes the (Nq, Nk) scores in float64 with no look at the memory budget: 29 GB at 60,000 tokens."""
    scale = check_inputs(q, k, v, scale, causal)
    if (empty := no_work_output(q, k.shape[2])) is not None:
        return empty
    (B, H, Nq, d), Hkv, Nk = q.shape, k.shape[1], k.shape[2]
    s = q.reshape(B, Hkv, H // Hkv, Nq, d).double() @ k[:, :, None].double().transpose(-1, -2) * scale  # (.., Nq, Nk)
    if causal:
        s = s.masked_fill(~causal_allowed(Nq, Nk, device=q.device), float("-inf"))
    p = torch.where((s == float("-inf")).all(dim=-1, keepdim=True), 0, torch.softmax(s, dim=-1))
    return (p @ v[:, :, None].double()).to(q.dtype).reshape(q.shape)  # (B, H, Nq, d)


for _bug, _what in BUGS.items():
    register("attention", f"mutant_{_bug}", devices=("cpu", "cuda"), mutant=True, bug=_what,
             killed_by=KILLED_BY[_bug])(
        lambda q, k, v, *, causal=False, scale=None, _bug=_bug: buggy_attention(q, k, v, causal=causal,
                                                                                scale=scale, bug=_bug))
register("attention", "mutant_output_on_k_device", devices=("cpu", "cuda"), mutant=True,
         bug="devices never compared: computed on k's device, a meta result for a CPU q (outputs on the wrong "
             "device, as some attention wrappers return)", killed_by=("rejects_bad_input",))(output_on_k_device)
register("attention", "mutant_scores_past_budget", devices=("cpu", "cuda"), mutant=True,
         bug="materializes the (Nq, Nk) scores without the memory budget: a 60,000-token prompt tries to allocate "
             "29 GB instead of raising", killed_by=("rejects_bad_input",))(scores_past_budget)
