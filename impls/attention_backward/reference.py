"""Float64 reference backward: autograd through the float64 reference attention.

The oracle of every backward property.  Invariant: nothing but the definition -- inputs upcast to
float64, the forward recomputed with the full score matrix, gradients by torch.autograd (o and lse
are not used).  Vaswani et al. 2017, Sec. 3.2.1; the gradients of softmax as in Dao et al. 2022, App. B.2.
"""

import torch

from llm_inference_harness.contracts.attention import check_scores_budget
from llm_inference_harness.contracts.attention_backward import check_backward_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.references.attention_backward import attention_backward64


@register("attention_backward", "reference", devices=("cpu", "cuda"), cite="autograd of Vaswani et al. 2017",
          caps={"oracle": True})
def reference_attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None):
    scale = check_backward_inputs(q, k, v, o, lse, do, scale, causal)
    check_scores_budget("attention_backward reference", q, k.shape[2], copies=4, dtype=torch.float64)
    dq, dk, dv = attention_backward64(q, k, v, do, causal=causal, scale=scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
