"""torch.nn.functional.scaled_dot_product_attention behind the attention contract.

SDPA's own is_causal is aligned top-left, so when Nq != Nk an explicit bottom-right mask is
passed; query rows that see no key (Nq > Nk) are zeroed as the contract requires (SDPA leaves
them NaN or undefined).  The baseline every tiled implementation is measured against.

Caveat, declared as ``nan_caveat``: on the CPU (torch 2.13) SDPA returns finite rows for a NaN in q
or k when there are few keys (one key in float64, four in float32 at d = 8), where softmax's NaN
should reach the output; found by test_nan_inputs_propagate.

Worked around: with is_causal=True and scale=0 (uniform weights), torch 2.13's CPU SDPA returns NaN in the
first row, and with a negative scale NaN in every row that has a masked key (the -inf of the mask comes out
+inf: found with logits far below zero, reproduced by q = [[1], [2]], k = [[1], [1.5]], scale=-1), so causal
calls at scales <= 0 pass the explicit mask, which computes them correctly.
"""

import functools

import torch
import torch.nn.functional as F

from llm_inference_harness.contracts.attention import causal_allowed, check_inputs, check_scores_budget
from llm_inference_harness.engine.registry import register


@register("attention", "sdpa", devices=("cpu", "cuda"), cite="PyTorch scaled_dot_product_attention",
          caps={"nan_caveat": "torch's CPU SDPA returns finite rows for a NaN in q or k when Nk is small"})
def sdpa_attention(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    check_scores_budget("attention sdpa", q, k.shape[2])  # its math path materializes the scores
    (Nq, H), (Nk, Hkv) = (q.shape[2], q.shape[1]), (k.shape[2], k.shape[1])
    if not causal or (Nq == Nk and scale > 0):  # is_causal at scale <= 0 gives NaN rows on the CPU
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=H != Hkv)
    allowed = bottom_right(Nq, Nk, q.device)  # (Nq, Nk)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=H != Hkv)
    return out if Nq <= Nk else torch.where(allowed.any(dim=-1)[:, None], out, 0)  # rows with no visible key -> 0


@functools.lru_cache(maxsize=64)
def bottom_right(Nq: int, Nk: int, device: torch.device) -> torch.Tensor:
    """The bottom-right causal mask, built once per shape: a KV cache verifying draft tokens asks for the
    same few shapes step after step.  Read-only (SDPA never writes its mask)."""
    return causal_allowed(Nq, Nk, device=device)
