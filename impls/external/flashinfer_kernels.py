"""FlashInfer's prefill kernel, `flashinfer.single_prefill_with_kv_cache(q, k, v, causal=, sm_scale=)` on one
sequence at a time in its "NHD" layout: q (Nq, H, d), k and v (Nk, Hkv, d), GQA when H is a multiple of Hkv,
float16 / bfloat16.  Its causal mask is aligned bottom-right (the queries are the last Nq of the Nk positions),
which the contract's rule is; a batch is a loop over its sequences, empty shapes are answered before the kernel.
Ye et al. 2025, "FlashInfer"; flashinfer, flashinfer/prefill.py.  CUDA only: skipped elsewhere.
"""

import torch

from llm_inference_harness.contracts.attention import check_inputs, no_work_output
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.common import Library

FLASHINFER = Library("flashinfer-python", "flashinfer", install="a CUDA build: pip install flashinfer-python")


@register("attention", "flashinfer_prefill", devices=("cuda",), dtypes=("bfloat16", "float16"),
          unavailable=FLASHINFER.unavailable, cite="Ye et al. 2025, FlashInfer (single_prefill_with_kv_cache)")
def flashinfer_prefill(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    if (empty := no_work_output(q, k.shape[2])) is not None:
        return empty
    flashinfer = FLASHINFER.load()
    rows = [flashinfer.single_prefill_with_kv_cache(q[b].transpose(0, 1), k[b].transpose(0, 1),
                                                    v[b].transpose(0, 1), causal=causal, sm_scale=scale)
            for b in range(q.shape[0])]  # each (Nq, H, d)
    return torch.stack(rows).transpose(1, 2)  # (B, H, Nq, d)
