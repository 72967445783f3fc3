"""A known-wrong split-K combine: partitions weighted by their l alone, without e^(m_i - m).

Each partition's partial (m_i, l_i, acc_i) is correct, but the combine forms
sum_i acc_i / sum_i l_i -- the l-weighted average of the partition outputs o_i = acc_i / l_i -- as if
every partition had been shifted by the same max.  It is exact only when all partition maxima are
equal (e.g. a single partition), which is why a one-partition test would never see it.
"""

from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.attention.splitk_decode import partition_partials, tree_combine
from llm_inference_harness.numerics.online_softmax import Partial, finalize


def merge_without_rescale(a: Partial, b: Partial) -> Partial:
    return Partial(a.m.maximum(b.m), a.l + b.l, a.acc + b.acc)


@register("attention", "mutant_splitk_unrescaled_combine", devices=("cpu", "cuda"), mutant=True,
          bug="split-K combine weights partition outputs by l_i without the e^(m_i - m) rescale",
          killed_by=("matches_reference",), caps={"split": 32})
def splitk_unrescaled(q, k, v, *, causal=False, scale=None):
    parts = partition_partials(q, k, v, causal=causal, scale=scale, split=32)
    return finalize(tree_combine(parts, merge_without_rescale)).to(q.dtype).reshape(q.shape)  # (B, H, Nq, d)
