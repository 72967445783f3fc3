"""Batch invariance and determinism of KV-cache decoding (contract: harness/contracts/kvcache.py).

For a decoder declaring ``batch_invariant``: each sequence's logits at every position are bit-identical
(torch.equal) whether it is decoded alone or inside a batch of up to four ragged prompts, in any order of
that batch, and under continuous batching -- a drawn schedule of epochs in which sequences join, leave, and
come back re-prefilled with everything they have so far (a serving engine's recompute preemption; the
contract's prefill starts a new batch, so this is how rows join and leave it).  A position's logits must
then not depend on whether it was computed in a prefill, with the tokens before it, or in a decode step.
For ``deterministic``: the same bits on a second run and at 1 and 2 intra-op threads.
"""

from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.batch_invariance import (
    assert_same_bits,
    decode_comparisons,
    decode_determinism,
    threads,
)
from llm_inference_harness.engine.capabilities import needs_cap
from llm_inference_harness.strategies.batch import decode_schedules

TECHNIQUE = "kvcache"


def draw(data, impl):
    return data.draw(decode_schedules(dtypes=impl.dtypes), label="schedule")


@needs_cap("batch_invariant", "each sequence's bits may depend on its batch")
@given(data=st.data())
def test_rows_are_batch_invariant(impl, data):
    """Row b of a drawn ragged batch, and of the batch permuted, decodes to the bits of sequence b alone."""
    with threads(1):  # tiny models: a second thread only waits on a loaded machine
        for c in decode_comparisons(impl, draw(data, impl), kinds=("batch", "permutation")):
            assert_same_bits(c, impl.name)


@needs_cap("batch_invariant", "each sequence's bits may depend on which rows share its prefill and steps")
@given(data=st.data())
def test_continuous_batching_is_invariant(impl, data):
    """Under a drawn schedule of rows joining, leaving and re-prefilled, every logit a sequence gets holds the
    bits it has when the sequence is decoded alone (its prompt prefilled, then one step per token)."""
    with threads(1):
        for c in decode_comparisons(impl, draw(data, impl), kinds=("continuous",)):
            assert_same_bits(c, impl.name)


@needs_cap("deterministic", "its bits may change from run to run or with the thread count")
@given(data=st.data())
def test_same_bits_every_run_and_thread_count(impl, data):
    """A drawn batch decoded twice, and at 1 and 2 intra-op threads, gives the same bits each time."""
    for c in decode_determinism(impl, draw(data, impl)):
        assert_same_bits(c, impl.name)
