"""Batch invariance and determinism of logits processing (contract: harness/contracts/sampling.py).

An implementation of the processing level (caps returns="probs") declaring ``batch_invariant`` must give each row
the same bits alone as inside a batch of other rows (other logits, parameters and histories) and in a permuted
batch; one declaring ``deterministic`` the same bits on a second call and at 1 and 2 intra-op threads.  A sampler's
tokens come from one generator for the batch, so they follow the stream's position: samplers are judged by the
exact properties of properties/test_sampling.py.  He et al. 2025, "Defeating Nondeterminism in LLM Inference".
"""

from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.contracts.sampling import call
from llm_inference_harness.engine.batch_invariance import Comparison, assert_same_bits, threads
from llm_inference_harness.engine.capabilities import applies, needs_cap
from llm_inference_harness.strategies.batch import permutation
from llm_inference_harness.strategies.common import seeds
from llm_inference_harness.strategies.sampling import sampling_cases

TECHNIQUE = "sampling"


def processing(impl):
    return None if impl.caps.returns == "probs" else "a sampler: its tokens follow its generator's stream"


def batches(impl):
    dtypes = tuple(d for d in impl.dtypes if d in ("float32", "float64"))
    return sampling_cases(dtypes, supported=impl.caps.params, enumerable=False, max_vocab=impl.caps.max_vocab,
                          max_batch=5)


@applies(processing)
@needs_cap("batch_invariant", "a row's distribution may depend on the other rows of its batch")
@given(data=st.data())
def test_rows_are_batch_invariant(impl, data):
    """Row b of the batch, and of the batch permuted, has the bits of row b processed alone."""
    case = data.draw(batches(impl), label="batch")
    perm = permutation(case.B, data.draw(seeds, label="permutation"))
    batch = call(impl, case.logits(), case.params)
    permuted = case.rows(perm)
    shuffled = call(impl, permuted.logits(), permuted.params)
    for b in range(case.B):
        row = case.rows([b])
        alone = call(impl, row.logits(), row.params)[0]
        assert_same_bits(Comparison("batch", f"row {b} of {case.B}", batch[b], alone), impl.name)
        assert_same_bits(Comparison("permutation", f"row {b} at {perm.index(b)} of a permuted batch",
                                    shuffled[perm.index(b)], alone), impl.name)


@applies(processing)
@needs_cap("deterministic", "the same inputs may give other bits call to call or with the thread count")
@given(data=st.data())
def test_same_bits_every_run_and_thread_count(impl, data):
    """The same batch processed twice, and at 1 and 2 intra-op threads, gives the same bits."""
    case = data.draw(batches(impl), label="batch")
    logits = case.logits()
    runs = []
    for n in (1, 2, 1):
        with threads(n):
            runs.append(call(impl, logits, case.params))
    assert_same_bits(Comparison("rerun", "a second call", runs[2], runs[0]), impl.name)
    assert_same_bits(Comparison("threads", "2 intra-op threads against 1", runs[1], runs[0]), impl.name)
