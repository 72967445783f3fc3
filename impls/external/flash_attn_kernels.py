"""FlashAttention-2's CUDA kernel through the flash-attn package: `flash_attn_func(q, k, v, softmax_scale=,
causal=)` on (B, N, H, d) tensors, float16 / bfloat16, GQA when H is a multiple of Hkv.  Since 2.1 its causal
mask is aligned bottom-right (query i sees key j <= i + Nk - Nq) and a row that sees no key is zero, as the
contract asks.  Empty shapes are answered before the kernel, which does not launch on them.
Dao 2023, "FlashAttention-2"; flash-attn, flash_attn/flash_attn_interface.py.  CUDA only: skipped elsewhere.
"""

from llm_inference_harness.contracts.attention import check_inputs, no_work_output
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.common import Library

FLASH_ATTN = Library("flash-attn", "flash_attn", install="a CUDA build: pip install flash-attn --no-build-isolation")


@register("attention", "flash_attn_2", devices=("cuda",), dtypes=("bfloat16", "float16"),
          unavailable=FLASH_ATTN.unavailable, cite="Dao 2023, FlashAttention-2 (flash_attn_func)")
def flash_attn_2(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    if (empty := no_work_output(q, k.shape[2])) is not None:
        return empty
    flash_attn = FLASH_ATTN.load()
    out = flash_attn.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
                                     causal=causal)  # (B, Nq, H, d)
    return out.transpose(1, 2)  # (B, H, Nq, d)
