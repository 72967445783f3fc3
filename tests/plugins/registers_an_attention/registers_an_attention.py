"""An entry-point plugin of another distribution that registers a correct attention, and notes the process that
imported it (IMPORTED_BY names the file): the harness must import it only in processes of its own."""

import os

import torch

from llm_inference_harness import register

with open(os.environ.get("IMPORTED_BY", os.devnull), "a") as notes:
    notes.write(f"{os.getpid()}\n")


@register("attention", "theirs_sdpa", dtypes=("float64", "float32"), devices=("cpu",))
def attention(q, k, v, *, causal=False, scale=None):
    from llm_inference_harness.contracts.attention import check_inputs

    scale = check_inputs(q, k, v, scale, causal)
    Nq, Nk = q.shape[2], k.shape[2]
    seen = torch.ones(Nq, Nk, dtype=torch.bool).tril(Nk - Nq) if causal else None
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale, enable_gqa=True)
    return out if seen is None else torch.where(seen.any(-1, keepdim=True), out, 0)
