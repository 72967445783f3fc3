"""FlashInfer's sorting-free sampler, `flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, top_k, top_p,
filter_apply_order="top_k_first", generator=...)`: rejection sampling over the row with per-row top_k and top_p
tensors, top-k first and top-p over the renormalized top-k set (transformers' order), one token per row.  The
temperature divides the logits first (a greedy row is its argmax).  It draws from a torch.Generator of its own,
seeded with ``rng`` (caps rng="own"): the statistical tier judges it.
Ye et al. 2025, "FlashInfer"; flashinfer, flashinfer/sampling.py.  CUDA only: skipped elsewhere.
"""

import torch

from llm_inference_harness.contracts.sampling import check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.common import Library

FLASHINFER = Library("flashinfer-python", "flashinfer", install="a CUDA build: pip install flashinfer-python")


@register("sampling", "flashinfer_top_k_top_p", devices=("cuda",), dtypes=("float32",),
          unavailable=FLASHINFER.unavailable, cite="FlashInfer top_k_top_p_sampling_from_logits (rejection sampling)",
          caps={"rng": "own", "order": "transformers", "ties": "keep", "params": ("temperature", "top_k", "top_p")})
def flashinfer_top_k_top_p(logits, params, *, rng):
    check_inputs(logits, params)
    sampling = FLASHINFER.load("flashinfer.sampling")
    B, V = logits.shape
    T = torch.tensor(params.temperature, dtype=logits.dtype, device=logits.device)[:, None]  # (B, 1)
    k = torch.tensor([t or V for t in params.top_k], dtype=torch.int32, device=logits.device)  # (B,): V is off
    p = torch.tensor(params.top_p, dtype=torch.float32, device=logits.device)  # (B,)
    gen = torch.Generator(device=logits.device).manual_seed(rng)
    tokens = sampling.top_k_top_p_sampling_from_logits((logits / torch.where(T > 0, T, 1)).contiguous(), k, p,
                                                       filter_apply_order="top_k_first", generator=gen)
    return torch.where(T[:, 0] > 0, tokens.long(), logits.argmax(-1))
