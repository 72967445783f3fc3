"""transformers' attention functions, the ones its models call: `sdpa_attention_forward` and Llama's
`eager_attention_forward`, each with the causal mask transformers builds itself (masking_utils).

Both take (B, H, N, d) queries and (B, Hkv, Nk, d) keys and values (GQA through the module's
num_key_value_groups) and return (B, N, H, d).  Causal attention gets the mask a model with a KV cache would
pass: `sdpa_mask` / `eager_mask` with q_offset = Nk - Nq, i.e. the bottom-right rule (without a mask,
`is_causal=True` is top-left, and sdpa_attention_forward slices the keys to Nq when Nk > Nq).  The eager mask
adds finfo.min instead of -inf, so a query row that sees no key gets the mean of v (declared
masked_rows="unspecified"), and its softmax runs in float32 whatever the input dtype: float64 inputs get
float32 accuracy (errors ~1e-8) and, since finfo(float64).min is -inf in float32, NaN rows, so the eager
adapter declares no float64.
transformers, integrations/sdpa_attention.py, models/llama/modeling_llama.py, masking_utils.py.
"""

from types import SimpleNamespace

import torch

from llm_inference_harness.contracts.attention import check_inputs, check_scores_budget
from llm_inference_harness.engine.registry import known_failure, register
from llm_inference_harness.impls.external.common import FIRST_CALL_IMPORTS_S, Library

TRANSFORMERS = Library("transformers", "transformers")


def module_for(q, k, causal: bool) -> SimpleNamespace:
    """What the attention functions read of the calling attention module."""
    return SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], is_causal=causal, training=False)


@register("attention", "transformers_sdpa", devices=("cpu", "cuda"), unavailable=TRANSFORMERS.unavailable,
          cite="transformers integrations/sdpa_attention.py with masking_utils.sdpa_mask (bottom-right)",
          caps={"call_limit_s": FIRST_CALL_IMPORTS_S,
                "nan_caveat": "it calls torch's SDPA, whose CPU kernel returns finite rows for a NaN in q or k when Nk "
                              "is small (as impls/attention/sdpa.py declares)"})
def transformers_sdpa(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    check_scores_budget("transformers_sdpa", q, k.shape[2])  # as our sdpa: with a mask, SDPA's math path
    sdpa = TRANSFORMERS.load("transformers.integrations.sdpa_attention")
    masks = TRANSFORMERS.load("transformers.masking_utils")
    (B, _, Nq, _), Nk = q.shape, k.shape[2]
    mask = masks.sdpa_mask(batch_size=B, q_length=Nq, kv_length=Nk, q_offset=Nk - Nq, device=q.device) \
        if causal else None  # None also where is_causal=True means the same (Nq = Nk, or one query)
    out, _ = sdpa.sdpa_attention_forward(module_for(q, k, causal), q, k, v, mask, scaling=scale, is_causal=causal)
    return out.transpose(1, 2)  # (B, H, Nq, d)


@register("attention", "transformers_eager", devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"),
          unavailable=TRANSFORMERS.unavailable,
          cite="transformers models/llama eager_attention_forward with masking_utils.eager_mask (bottom-right)",
          caps={"masked_rows": "unspecified", "call_limit_s": FIRST_CALL_IMPORTS_S})
def transformers_eager(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    check_scores_budget("transformers_eager", q, k.shape[2], copies=2, dtype=torch.float32)  # scores, softmax
    llama = TRANSFORMERS.load("transformers.models.llama.modeling_llama")
    masks = TRANSFORMERS.load("transformers.masking_utils")
    (B, _, Nq, _), Nk = q.shape, k.shape[2]
    mask = masks.eager_mask(batch_size=B, q_length=Nq, kv_length=Nk, q_offset=Nk - Nq, dtype=q.dtype,
                            device=q.device) if causal else None
    out, _ = llama.eager_attention_forward(module_for(q, k, causal), q, k, v, mask, scaling=scale)
    return out.transpose(1, 2)  # (B, H, Nq, d)


known_failure("attention", "transformers_sdpa", "empty_shapes_give_empty_output", library="transformers",
              version="5.24.0",
              what="sdpa_attention_forward ends with attn_output.reshape(batch, -1, q_length, head_dim), which "
                   "raises on an empty output (B = 0 or Nq = 0: the -1 is ambiguous) where torch's SDPA itself "
                   "returns the empty tensor",
              reproduce="""\
import types, torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
module = types.SimpleNamespace(num_key_value_groups=1, is_causal=False, training=False)
q, k = torch.randn(0, 2, 3, 8), torch.randn(0, 2, 5, 8)
assert torch.nn.functional.scaled_dot_product_attention(q, k, k).shape == (0, 2, 3, 8)
try:
    sdpa_attention_forward(module, q, k, k, None, is_causal=False)
    raise AssertionError("an empty batch worked")
except RuntimeError as exc:
    assert "ambiguous" in str(exc)
""")


known_failure("attention", "transformers_eager", "large_logits_stay_finite_and_correct", library="transformers",
              version="5.24.0",
              what="eager_attention_forward computes q k^T in the inputs' dtype: in bfloat16 at logits ~1e3 a score is "
                   "rounded by up to 4 (8 significant bits), so softmax weights are off by up to e^4, where the "
                   "contract carries scores in float32 (as FlashAttention does)",
              reproduce="""\
import types, torch
from transformers.models.llama.modeling_llama import eager_attention_forward
module = types.SimpleNamespace(num_key_value_groups=1, is_causal=False, training=False)
q = torch.tensor([[[[1000.0, 1.0]]]], dtype=torch.bfloat16)  # (B, H, Nq, d)
k = torch.tensor([[[[1.0, 0.0], [1.0, 2.0]]]], dtype=torch.bfloat16)  # scores 1000 and 1002
v = torch.tensor([[[[0.0, 0.0], [1.0, 1.0]]]], dtype=torch.bfloat16)
out, _ = eager_attention_forward(module, q, k, v, None, scaling=1.0)
assert abs(out[0, 0, 0, 0].item() - torch.sigmoid(torch.tensor(2.0)).item()) > 0.3  # 0.5, not 0.881
""")

TORCH_CAUSAL_SCALE_ZERO = """\
import torch, torch.nn.functional as F
q = torch.tensor([[[[1.0], [2.0]]]], dtype=torch.float64)  # (B, H, N, d)
out = F.scaled_dot_product_attention(q, q, q, is_causal=True, scale=0.0)  # uniform weights: row 0 is v[0] = 1
assert out[0, 0, 0, 0].isnan()  # (impls/attention/sdpa.py passes the explicit mask at scale <= 0 instead)
"""
for _prop in ("matches_reference", "large_logits_stay_finite_and_correct", "rows_are_convex_combinations_of_values"):
    known_failure("attention", "transformers_sdpa", _prop, library="torch", version="2.13.0",
                  what="sdpa_attention_forward passes is_causal=True when Nq = Nk, and torch's CPU SDPA with is_causal "
                       "at a scale <= 0 returns NaN in every row with a masked key (the mask's -inf times the scale)",
                  reproduce=TORCH_CAUSAL_SCALE_ZERO)
