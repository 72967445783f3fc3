"""Batch invariance and determinism of attention (contract: harness/contracts/attention.py).

For an implementation declaring ``batch_invariant``: each row's output is bit-identical (torch.equal, no
tolerance) computed alone, inside a batch of drawn size and composition (other rows of other magnitudes,
before and after it), and in any permutation of that batch; and its queries cut into chunks, each with the
keys its last query sees (a chunked prefill, or one decode step per query), give the bits of one call.
For ``deterministic``: the same bits on a second run and at 1 and 2 intra-op threads.  The comparisons
are harness/engine/batch_invariance.py's, which also measures them where nothing is declared (the report).
"""

from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.batch_invariance import assert_same_bits, attention_comparisons, attention_determinism
from llm_inference_harness.engine.capabilities import needs_cap
from llm_inference_harness.engine.devices import available
from llm_inference_harness.strategies.batch import attention_batches

TECHNIQUE = "attention"


def draw(data, impl):
    return data.draw(attention_batches(dtypes=impl.dtypes, devices=available(impl.devices),
                                       max_len=min(64, impl.caps.max_len or 64)), label="batch")


@needs_cap("batch_invariant", "each row's bits may depend on its batch")
@given(data=st.data())
def test_rows_are_batch_invariant(impl, data):
    """Row b of a drawn batch, and of the batch permuted, holds the bits of row b computed alone."""
    for c in attention_comparisons(impl, draw(data, impl), kinds=("batch", "permutation")):
        assert_same_bits(c, impl.name)


@needs_cap("batch_invariant", "each row's bits may depend on the queries computed with it")
@given(data=st.data())
def test_query_chunks_are_invariant(impl, data):
    """A row's queries computed in drawn chunks (causal: each chunk with the keys up to its last query)
    concatenate to the bits of one call over all of them."""
    for c in attention_comparisons(impl, draw(data, impl), kinds=("chunks",)):
        assert_same_bits(c, impl.name)


@needs_cap("deterministic", "its bits may change from run to run or with the thread count")
@given(data=st.data())
def test_same_bits_every_run_and_thread_count(impl, data):
    """A drawn batch computed twice, and at 1 and 2 intra-op threads, gives the same bits each time."""
    for c in attention_determinism(impl, draw(data, impl)):
        assert_same_bits(c, impl.name)
