"""The C paged-attention kernel (impls/paged_attention/compiled.py) beyond the contract's shared properties.

Its loop order is fixed by the logical key order alone, so the bits of its output cannot depend on where
the blocks lie in the pool or on how many threads run it (its build: tests/test_paged_attention_compiled.py).
"""

import torch
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.contracts.paged_attention import call
from llm_inference_harness.engine.capabilities import needs_cap
from llm_inference_harness.engine.devices import available
from llm_inference_harness.strategies.paged_attention import paged_attention_cases

TECHNIQUE = "paged_attention"


def moved(k_cache, v_cache, tables, seed):
    """The same sequences with every physical block moved to another place in the pool."""
    perm = torch.randperm(k_cache.shape[0], generator=torch.Generator().manual_seed(seed))  # old id -> new id
    k2, v2 = torch.empty_like(k_cache), torch.empty_like(v_cache)
    k2[perm], v2[perm] = k_cache, v_cache
    return k2, v2, perm[tables]  # (B, max_blocks)


@needs_cap("compiled", "a kernel whose loop order is fixed by logical key order")
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_bits_do_not_depend_on_placement_or_threads(impl, data, seed):
    case = data.draw(paged_attention_cases(dtypes=impl.dtypes, devices=available(impl.devices)), label="case")
    q, k_cache, v_cache, tables, seq_lens = case.paged()
    out = call(impl, q, k_cache, v_cache, tables, seq_lens, causal=case.causal, scale=case.scale)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3 - min(threads, 2))  # 1 thread <-> 2 threads
        again = call(impl, q, *moved(k_cache, v_cache, tables, seed), seq_lens, causal=case.causal, scale=case.scale)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out, again), f"{impl.name}: moving blocks / changing the thread count changed the output"


@needs_cap("compiled", "converts its inputs for the C signature")
@given(data=st.data())
def test_strided_inputs_and_int32_tables(impl, data):
    """A strided q and int32 tables and lengths give the bits of the contiguous int64 call."""
    case = data.draw(paged_attention_cases(dtypes=impl.dtypes, devices=available(impl.devices)), label="case")
    q, k_cache, v_cache, tables, seq_lens = case.paged()
    out = call(impl, q, k_cache, v_cache, tables, seq_lens, causal=case.causal, scale=case.scale)
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, Nq, d) laid out as (B, Nq, H, d)
    again = call(impl, strided, k_cache, v_cache, tables.int(), seq_lens.int(), causal=case.causal, scale=case.scale)
    assert torch.equal(out, again), f"{impl.name}: strided q / int32 tables changed the output"
