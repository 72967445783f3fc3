"""xFormers' memory-efficient attention, `xformers.ops.memory_efficient_attention(q, k, v, attn_bias=, scale=)`
on (B, N, H, d) tensors, with `LowerTriangularFromBottomRightMask` for the contract's bottom-right causal rule.
GQA goes in as its 5-d (B, N, Hkv, H / Hkv, d) form, k and v expanded over the group without a copy.  Empty
shapes are answered before the kernel.
Rabe & Staats 2021, "Self-attention does not need O(n^2) memory"; xformers, xformers/ops/fmha/__init__.py.
CUDA only: skipped elsewhere.
"""

from llm_inference_harness.contracts.attention import check_inputs, no_work_output
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.common import Library

XFORMERS = Library("xformers", "xformers", install="a CUDA build: pip install xformers")


@register("attention", "xformers_memory_efficient", devices=("cuda",), dtypes=("float32", "bfloat16", "float16"),
          unavailable=XFORMERS.unavailable, cite="xformers.ops.memory_efficient_attention (Rabe & Staats 2021)")
def xformers_memory_efficient(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    if (empty := no_work_output(q, k.shape[2])) is not None:
        return empty
    ops = XFORMERS.load("xformers.ops")
    bias = XFORMERS.load("xformers.ops.fmha.attn_bias").LowerTriangularFromBottomRightMask() if causal else None
    (B, H, Nq, d), (Hkv, Nk) = q.shape, k.shape[1:3]
    g = H // Hkv
    q5 = q.transpose(1, 2).reshape(B, Nq, Hkv, g, d)  # (B, Nq, Hkv, g, d)
    k5, v5 = (t.transpose(1, 2)[:, :, :, None].expand(B, Nk, Hkv, g, d) for t in (k, v))  # (B, Nk, Hkv, g, d)
    out = ops.memory_efficient_attention(q5, k5, v5, attn_bias=bias, scale=scale)  # (B, Nq, Hkv, g, d)
    return out.reshape(B, Nq, H, d).transpose(1, 2)  # (B, H, Nq, d)
