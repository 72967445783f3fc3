"""vLLM's top-k / top-p masking, `vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p(logits, k, p)` (its v1
Sampler's processing, after temperature), as the processing level of the sampling contract: temperature divides
the logits (a greedy row is its argmax, as the Sampler's greedy path), then top-k and top-p from one ascending sort,
per-row k (V where a row has none) and p (1.0), then softmax.  The penalties and min-p are other processors of the
Sampler, not part of this function: the adapter declares the parameters it applies.
vLLM, v1/sample/ops/topk_topp_sampler.py.  CUDA only: skipped elsewhere.
"""

import torch

from llm_inference_harness.contracts.sampling import check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.common import Library

VLLM = Library("vllm", "vllm", install="a CUDA build: pip install vllm")


@register("sampling", "vllm_top_k_top_p", devices=("cuda",), dtypes=("float32",), unavailable=VLLM.unavailable,
          cite="vLLM v1 TopKTopPSampler: apply_top_k_top_p",
          caps={"returns": "probs", "order": "vllm", "ties": "keep", "params": ("temperature", "top_k", "top_p")})
def vllm_top_k_top_p(logits, params):
    check_inputs(logits, params)
    ops = VLLM.load("vllm.v1.sample.ops.topk_topp_sampler")
    B, V = logits.shape
    T = torch.tensor(params.temperature, dtype=logits.dtype, device=logits.device)[:, None]  # (B, 1)
    k = torch.tensor([t or V for t in params.top_k], device=logits.device)  # (B,): V where top_k is off
    p = torch.tensor(params.top_p, dtype=logits.dtype, device=logits.device)  # (B,)
    masked = ops.apply_top_k_top_p(logits / torch.where(T > 0, T, 1), k, p)  # (B, V)
    greedy = torch.nn.functional.one_hot(logits.argmax(-1), V).to(logits.dtype)  # (B, V)
    return torch.where(T > 0, torch.softmax(masked, -1), greedy)
