"""Float64 reference attention: softmax(q k^T * scale) v straight from the definition.

The oracle of every attention property.  Invariant: nothing but the formula -- inputs upcast to
float64, the full score matrix materialized, masked-out rows set to zero.
Vaswani et al. 2017, "Attention Is All You Need", Sec. 3.2.1.
"""

from llm_inference_harness.engine.registry import register
from llm_inference_harness.references.attention import attention64


@register("attention", "reference", devices=("cpu", "cuda"), cite="Vaswani et al. 2017, Sec. 3.2.1",
          caps={"oracle": True})
def reference_attention(q, k, v, *, causal=False, scale=None):
    return attention64(q, k, v, causal=causal, scale=scale).to(q.dtype)
