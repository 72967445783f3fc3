"""The (m, l, o) merge of partial softmax results that every tiled attention kernel shares
(harness/numerics/online_softmax.py): associative, commutative, with an identity, and merged in any order it
finalizes to softmax(s) v (Milakov and Gimelshein 2018).
"""

import itertools

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY
from llm_inference_harness.numerics.online_softmax import Partial, finalize, identity, merge, partial
from llm_inference_harness.strategies.attention import score_blocks


# ---------------------------------------------------------------------------------------------
# the (m, l, o) merge
def _parts(s, v, cuts):
    return [partial(s[:, a:b], v[a:b]) for a, b in itertools.pairwise(cuts)]


def _close(a: Partial, b: Partial) -> None:
    for x, y, what in zip(a, b, ("m", "l", "acc"), strict=True):
        assert torch.equal(x.isinf(), y.isinf()), f"merge: {what} differs in which entries are infinite"
        err = (x.nan_to_num(0, 0, 0) - y.nan_to_num(0, 0, 0)).abs().max().item()
        scale = max(1.0, y.nan_to_num(0, 0, 0).abs().max().item())
        assert err <= FLOAT64_IDENTITY * scale, f"merge: {what} off by {err:.3g}"


@given(blocks=score_blocks())
def test_merge_is_associative_and_commutative(blocks):
    s, v, cuts = blocks
    a, b, c = (_parts(s, v, cuts) + [identity(s.shape[:-1], v.shape[-1])] * 3)[:3]
    _close(merge(merge(a, b), c), merge(a, merge(b, c)))
    _close(merge(a, b), merge(b, a))


@given(blocks=score_blocks())
def test_merge_identity(blocks):
    s, v, _ = blocks
    p = partial(s, v)
    _close(merge(p, identity(s.shape[:-1], v.shape[-1])), p)
    _close(merge(identity(s.shape[:-1], v.shape[-1]), p), p)


@given(blocks=score_blocks(), order_seed=st.integers(0, 2**31 - 1))
@example(blocks=(torch.tensor([[1000.0, 999.0, 998.0, 10.0]], dtype=torch.float64),
                 torch.eye(4, dtype=torch.float64), [0, 1, 3, 4]), order_seed=0)
def test_blockwise_merge_in_any_order_is_softmax(blocks, order_seed):
    """Merging per-block partials in a random order and finalizing gives softmax(s) v."""
    s, v, cuts = blocks
    parts = _parts(s, v, cuts)
    order = torch.randperm(len(parts), generator=torch.Generator().manual_seed(order_seed)).tolist()
    total = identity(s.shape[:-1], v.shape[-1])
    for i in order:
        total = merge(total, parts[i])
    expected = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v  # fully masked rows -> 0, per the contract
    err = (finalize(total) - expected).abs().max().item()
    assert err <= FLOAT64_IDENTITY, f"blockwise merge in order {order} is off softmax(s) v by {err:.3g}"
