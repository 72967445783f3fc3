"""Batch invariance and determinism of speculative samplers (contract: harness/contracts/speculative.py).

The contract samples one sequence.  A sampler declaring ``batch_invariant`` also has a batch form,
``fn.batched(target, draft, prompts, *, gamma, max_new_tokens, rngs, eos=None) -> list[Generation]``,
with one generator per row, and row b's tokens and rounds must equal the single-sequence call on
``prompts[b]`` with ``rngs[b]`` -- whatever the other rows (up to four more, other prompts, finishing at
other times) and their order: a row's draws must not depend on the other rows.  Models are exact tables, so
a model row is the same bits batched or alone.  For ``deterministic``: the same seed gives the same tokens
on a second run and at 1 and 2 intra-op threads (torch's global generator seeded alike each run, for a
sampler that draws from it).
"""

from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.engine.batch_invariance import assert_same_bits, sampler_comparisons, sampler_determinism
from llm_inference_harness.engine.capabilities import needs_cap
from llm_inference_harness.strategies.batch import sampler_batches

TECHNIQUE = "speculative"


@needs_cap("batch_invariant", "a row's draws may depend on the other rows of its batch")
@given(data=st.data())
def test_rows_are_batch_invariant(impl, data):
    """Row b of the batch form, and of the batch permuted, samples the tokens and rounds of sampling row b
    alone with the same generator."""
    for c in sampler_comparisons(impl, data.draw(sampler_batches(), label="batch"), kinds=("batch", "permutation")):
        assert_same_bits(c, impl.name)


@needs_cap("deterministic", "the same seed may give other tokens run to run or with the thread count")
@given(data=st.data())
def test_same_bits_every_run_and_thread_count(impl, data):
    """The same prompt and seed sampled twice, and at 1 and 2 intra-op threads, give the same tokens."""
    for c in sampler_determinism(impl, data.draw(sampler_batches(), label="batch")):
        assert_same_bits(c, impl.name)
