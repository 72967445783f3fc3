"""Batch invariance and determinism of paged attention (contract: harness/contracts/paged_attention.py).

For an implementation declaring ``batch_invariant``: sequence b's output is bit-identical (torch.equal) computed
alone and inside a batch of up to six sequences of other lengths (before and after it, over one shuffled,
NaN-padded pool), and in any permutation of that batch; and its queries cut into chunks -- a chunked prefill,
each chunk seeing the keys up to its last query -- give the bits of one call.  For ``deterministic``: the same
bits on a second run and at 1 and 2 intra-op threads.  The comparisons are harness/engine/batch_invariance.py's.
"""

from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.batch_invariance import assert_same_bits, paged_comparisons, paged_determinism
from llm_inference_harness.engine.capabilities import needs_cap
from llm_inference_harness.engine.devices import available
from llm_inference_harness.strategies.batch import paged_batches

TECHNIQUE = "paged_attention"


def draw(data, impl):
    return data.draw(paged_batches(dtypes=impl.dtypes, devices=available(impl.devices)), label="batch")


@needs_cap("batch_invariant", "each sequence's bits may depend on its batch")
@given(data=st.data())
def test_rows_are_batch_invariant(impl, data):
    """Sequence b of a drawn ragged batch, and of the batch permuted, holds the bits of sequence b alone."""
    for c in paged_comparisons(impl, draw(data, impl), kinds=("batch", "permutation")):
        assert_same_bits(c, impl.name)


@needs_cap("batch_invariant", "each query's bits may depend on the queries computed with it")
@given(data=st.data())
def test_query_chunks_are_invariant(impl, data):
    """A sequence's queries computed in drawn chunks concatenate to the bits of one call over all of them."""
    for c in paged_comparisons(impl, draw(data, impl), kinds=("chunks",)):
        assert_same_bits(c, impl.name)


@needs_cap("deterministic", "its bits may change from run to run or with the thread count")
@given(data=st.data())
def test_same_bits_every_run_and_thread_count(impl, data):
    """A drawn batch computed twice, and at 1 and 2 intra-op threads, gives the same bits each time."""
    for c in paged_determinism(impl, draw(data, impl)):
        assert_same_bits(c, impl.name)
