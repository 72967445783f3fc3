"""Properties of paged attention (contract: harness/contracts/paged_attention.py).

Every case stores each sequence's K/V in a pool whose physical blocks are shuffled and whose unused slots --
the tail of each last block, spare blocks, what padding table entries point at -- are NaN (sequences may
share leading blocks, and two may meet at a later block after different ones; tables may be full, and half the
cases pass q, the caches and the tables as views into larger tensors), then compares each sequence's output with
the attention contract's float64 reference on its contiguous K/V, within the tolerance earned by the plain
computation in the case's dtype.
"""

import torch
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.contracts.attention import MEMORY_BUDGET
from llm_inference_harness.contracts.paged_attention import call
from llm_inference_harness.engine.devices import available
from llm_inference_harness.engine.guard import ContractViolation, assert_rejected
from llm_inference_harness.engine.memory import address_space_headroom
from llm_inference_harness.engine.tolerance import assert_earned, dtype_of
from llm_inference_harness.references.attention import attention64, attention_plain, large_logit_yardstick
from llm_inference_harness.strategies.attention import BAD_CAUSAL, PAST_BUDGET_TOKENS, just_past_budget
from llm_inference_harness.strategies.paged_attention import paged_attention_blind_row_cases, paged_attention_cases

TECHNIQUE = "paged_attention"


def check_against_contiguous(impl, case):
    q, k_cache, v_cache, tables, seq_lens = case.paged()
    out = call(impl, q, k_cache, v_cache, tables, seq_lens, causal=case.causal, scale=case.scale)
    q, kv = case.contiguous()
    large = case.magnitude > 1 or case.offset  # |logits| of 1e2-1e4: rounding the scores dominates
    for b, (k, v) in enumerate(kv):
        qb = q[b:b + 1]  # (1, H, Nq, d)
        truth = attention64(qb, k, v, causal=case.causal, scale=case.scale)
        plain, conditioning = (large_logit_yardstick(qb, k, v, causal=case.causal, scale=case.scale) if large else
                               (attention_plain(qb, k, v, causal=case.causal, scale=case.scale), 0.0))
        assert_earned(out[b:b + 1], truth, plain, dtype_of(case.dtype), kind="large_logits" if large else "forward",
                      conditioning=conditioning,
                      what=f"{impl.name} sequence {b} (of length {case.seq_lens[b]}, block {case.block_size})")


@given(data=st.data())
def test_matches_contiguous_attention(impl, data):
    """Any block size, any shuffle of the physical blocks, NaN in every unused slot, decode or prefill, GQA:
    each sequence's output equals contiguous attention over its own keys."""
    case = data.draw(paged_attention_cases(dtypes=impl.dtypes, devices=available(impl.devices)), label="case")
    check_against_contiguous(impl, case)


@given(data=st.data())
def test_decode_matches_contiguous_attention(impl, data):
    """Decode (Nq = 1) over sequences of different lengths in one batch, as a serving step runs it; up to
    1100 tokens, so a sequence spans three of vLLM V2's 512-token partitions and their merge is checked; one
    draw in PAST_GRID is one sequence of more than 4096 one-token blocks (a table past 4096 entries)."""
    case = data.draw(paged_attention_cases(dtypes=impl.dtypes, devices=available(impl.devices), max_len=1100,
                                           decode=True, past_grid=True), label="case")
    check_against_contiguous(impl, case)


V2_PARTITION = 512  # vLLM's paged attention V2 reduces over partitions of 512 tokens (Kwon et al. 2023)

@given(data=st.data())
def test_large_logits_stay_finite_and_correct(impl, data):
    """Scores of magnitude 1e3-1e4 (q scaled up) must not overflow: the running max is subtracted first, the
    max of every 512-token partition included in V2's reduce (half the draws are decodes up to 1100 tokens).
    In every declared dtype: a half-precision kernel carries scores in float32 (the contract)."""
    long = data.draw(st.booleans(), label="decode past one partition")
    case = data.draw(paged_attention_cases(dtypes=impl.dtypes, devices=available(impl.devices),
                                           max_len=1100 if long else 130, min_len=V2_PARTITION + 1 if long else 1,
                                           decode=True if long else None,
                                           magnitude=st.floats(1e3, 1e4), wide=False), label="case")
    check_against_contiguous(impl, case)


@given(data=st.data())
def test_logits_far_below_zero(impl, data):
    """Every logit of a row moved down by 800-3000 (through one extra head dim: q -offset/scale, k 1, v 0)
    changes no output, softmax being shift-invariant, in decodes up to 1100 tokens and every declared dtype.
    A max that starts at 0 instead of -inf -- in the running max, or in split-K's reduce over 512-token
    partitions -- underflows every e^(s - m) to 0 there and returns 0 or NaN."""
    case = data.draw(paged_attention_cases(dtypes=impl.dtypes, devices=available(impl.devices), max_len=1100,
                                           decode=True, offset=st.floats(800, 3000)), label="case")
    check_against_contiguous(impl, case)


def test_empty_shapes_give_empty_output(impl):
    """An empty batch (B=0), head group (H=0) or query chunk (Nq=0) gives an empty output, not an error."""
    dtype, device = dtype_of(impl.dtypes[0]), available(impl.devices)[0]
    k_cache, v_cache = torch.randn(2, 4, 1, 4, 8, dtype=dtype, device=device).unbind(0)  # (blocks 4, Hkv 1, bs 4, d 8)
    for name, (B, H, Nq) in {"B=0": (0, 2, 3), "H=0": (1, 0, 3), "Nq=0": (2, 2, 0)}.items():
        q = torch.randn(B, H, Nq, 8, dtype=dtype, device=device)
        tables = torch.arange(2 * B, device=device).reshape(B, 2)  # (B, 2): two blocks per sequence
        seq_lens = torch.full((B,), 5, device=device)
        for causal in (False, True):
            try:
                call(impl, q, k_cache, v_cache, tables, seq_lens, causal=causal, scale=None)
            except ContractViolation as exc:
                raise AssertionError(f"{impl.name} on {name} (causal={causal}): {exc}") from exc


NAMES = ("q", "k_cache", "v_cache", "block_tables", "seq_lens")
BAD_INPUTS = {
    "block table entry past the pool": ("block_tables", lambda t, s: (t + 1000, s)),
    "sequence longer than its table": ("seq_lens", lambda t, s: (t, s + 10_000)),
    "float block table": ("block_tables", lambda t, s: (t.double(), s)),
    "uint8 block table (indexes as a mask)": ("block_tables", lambda t, s: (t.to(torch.uint8), s)),
    "seq_lens of the wrong length": ("seq_lens", lambda t, s: (t, s[:0])),
}


@given(data=st.data())
def test_rows_that_see_no_key_are_zero(impl, data):
    """Causal chunks longer than a sequence (Nq > seq_len): its first Nq - seq_len rows see no key and are zero."""
    case = data.draw(paged_attention_blind_row_cases(dtypes=impl.dtypes, devices=available(impl.devices)),
                     label="case")
    check_against_contiguous(impl, case)
    q, k_cache, v_cache, tables, seq_lens = case.paged()
    out = call(impl, q, k_cache, v_cache, tables, seq_lens, causal=True, scale=case.scale)
    for b, n in enumerate(case.seq_lens):
        blind = out[b, :, :max(case.Nq - n, 0)]  # (H, Nq - seq_len, d): query i sees keys j <= i + n - Nq < 0
        assert torch.equal(blind, torch.zeros_like(blind)), f"{impl.name}: rows of sequence {b} that see no key"


def test_rejects_bad_input(impl):
    """Tables and lengths that break the contract raise ValueError/TypeError naming the argument; so do caches
    of block_size 0 (naming k_cache, not the seq_lens that then look too long), any argument on another device
    than q (meta here), and, from an implementation that materializes a sequence's (Nq, Nk) scores (not tiled),
    a 60,000-token prefill past the memory budget and one just past it, refused before allocating (address space
    capped)."""
    q = torch.randn(2, 2, 1, 8, dtype=dtype_of(impl.dtypes[0]))
    k_cache, v_cache = torch.randn(2, 4, 2, 4, 8, dtype=q.dtype).unbind(0)  # (num_blocks=4, Hkv=2, bs=4, d=8)
    tables, seq_lens = torch.tensor([[0, 1], [2, 3]]), torch.tensor([5, 8])
    for name in sorted(BAD_INPUTS):
        arg, spoil = BAD_INPUTS[name]
        t, s = spoil(tables, seq_lens)
        assert_rejected(impl, name, q, k_cache, v_cache, t, s, causal=False, scale=None, names=(arg,))
    empty = k_cache[:, :, :0]  # (4, 2, 0, 8): block_size 0
    assert_rejected(impl, "block_size 0", q, empty, empty, tables, seq_lens, causal=False, scale=None,
                    names=("k_cache", "block_size"))
    good = dict(zip(NAMES, (q, k_cache, v_cache, tables, seq_lens), strict=True))
    for name in NAMES[1:]:
        moved = good | {name: good[name].to("meta")}
        assert_rejected(impl, f"{name} on the meta device", *moved.values(), causal=False, scale=None,
                        names=(name,))
    # far past the budget, and just past it: a refusal that counts the scores short refuses only the first
    for n in (PAST_BUDGET_TOKENS, just_past_budget(q.dtype, multiple=16)) if not impl.caps.tiled else ():
        bs = 16
        long_q, cache = torch.zeros(1, 1, n, 1, dtype=q.dtype), torch.zeros(n // bs, 1, bs, 1, dtype=q.dtype)
        with address_space_headroom(2 * MEMORY_BUDGET):
            assert_rejected(impl, f"a {n}-token prefill past the memory budget", long_q, cache, cache,
                            torch.arange(n // bs)[None], torch.tensor([n]), causal=False, scale=None,
                            names=("Nq", "Nk"))
    for causal in BAD_CAUSAL:
        assert_rejected(impl, f"causal={causal!r}", q, k_cache, v_cache, tables, seq_lens, causal=causal, scale=None,
                        names=("causal",))
