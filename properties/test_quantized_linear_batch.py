"""Batch invariance and determinism of quantized linear layers (contract: harness/contracts/quantized_linear.py).

For an implementation declaring ``batch_invariant``: token i's output is bit-identical (torch.equal) computed
alone and inside a drawn batch of up to 64 tokens (outlier columns, all-zero rows, with and without
calibration activations), and in any permutation of the tokens.  A scheme that computes statistics over the
whole batch at run time (per-tensor activation scales, LLM.int8()'s outlier columns, SmoothQuant without
calibration data) cannot declare it: a token's quantization then depends on the others by design.  For
``deterministic``: the same bits on a second run and at 1 and 2 intra-op threads.
"""

from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.batch_invariance import assert_same_bits, linear_comparisons, linear_determinism
from llm_inference_harness.engine.capabilities import needs_cap
from llm_inference_harness.engine.devices import available
from llm_inference_harness.strategies.batch import linear_batches

TECHNIQUE = "quantized_linear"


def draw(data, impl):
    return data.draw(linear_batches(dtypes=impl.dtypes, devices=available(impl.devices),
                                    multiple_of=impl.caps.group_size or 1), label="batch")


@needs_cap("batch_invariant", "each token's bits may depend on its batch")
@given(data=st.data())
def test_rows_are_batch_invariant(impl, data):
    """Token i of a drawn batch, and of the batch permuted, holds the bits of token i computed alone."""
    for c in linear_comparisons(impl, draw(data, impl), kinds=("batch", "permutation")):
        assert_same_bits(c, impl.name)


@needs_cap("deterministic", "its bits may change from run to run or with the thread count")
@given(data=st.data())
def test_same_bits_every_run_and_thread_count(impl, data):
    """A drawn batch computed twice, and at 1 and 2 intra-op threads, gives the same bits each time."""
    for c in linear_determinism(impl, draw(data, impl)):
        assert_same_bits(c, impl.name)
