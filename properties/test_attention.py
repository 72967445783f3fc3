"""Properties of exact attention (contract: harness/contracts/attention.py).

Every test taking ``impl`` runs against each registered implementation (pytest, via conftest) and
backs a column of ``harness check attention``.  The (m, l, o) merge that all tiled kernels share has its own
laws in tests/test_online_softmax.py.
"""

import itertools

import torch
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.contracts.attention import MEMORY_BUDGET, call, causal_allowed, declared_max_len
from llm_inference_harness.engine.capabilities import applies
from llm_inference_harness.engine.devices import available
from llm_inference_harness.engine.guard import (
    ContractViolation,
    assert_rejected,
    call_limit,
    guarded_call,
    names_argument,
)
from llm_inference_harness.engine.memory import address_space_headroom
from llm_inference_harness.engine.tolerance import assert_earned, dtype_of, earned_bound, with_margin
from llm_inference_harness.references.attention import (
    attention64,
    attention_lse64,
    attention_lse_plain,
    attention_plain,
    large_logit_yardstick,
)
from llm_inference_harness.strategies.attention import (
    BAD_CAUSAL,
    EMPTY_SHAPES,
    PAST_BUDGET_TOKENS,
    AttentionCase,
    attention_cases,
    just_past_budget,
    long_cases,
)

TECHNIQUE = "attention"


def draw_case(data, impl, **kw):
    kw.setdefault("max_len", impl.caps.max_len or 300)  # interpreted kernels declare a smaller size
    return data.draw(attention_cases(dtypes=impl.dtypes, devices=available(impl.devices), **kw), label="case")


def truth_and_plain(case, q, k, v, impl):
    """The float64 reference and the plain computations, with the implementation's declared causal alignment."""
    align = impl.caps.causal_align
    return (attention64(q, k, v, causal=case.causal, scale=case.scale, align=align),
            attention_plain(q, k, v, causal=case.causal, scale=case.scale, align=align))


@given(data=st.data())
def test_matches_reference(impl, data):
    """Output equals the float64 reference within the earned tolerance of its dtype."""
    case = draw_case(data, impl)
    q, k, v = case.tensors()
    out = call(impl, q, k, v, causal=case.causal, scale=case.scale)
    truth, plain = truth_and_plain(case, q, k, v, impl)
    assert_earned(out, truth, plain, dtype_of(case.dtype), what=f"{impl.name} vs float64 reference")


@given(data=st.data(), more_keys=st.booleans())
def test_causal_alignment_is_the_declared_one(impl, data, more_keys):
    """Causal with Nq != Nk (more keys than queries, as in decoding with a cache, or fewer): the output is the
    reference of the declared alignment (bottom-right j <= i + Nk - Nq, or top-left j <= i), within the earned
    tolerance; the other alignment's reference differs there, so a kernel aligned the other way fails."""
    case = draw_case(data, impl, causal=True, max_len=min(24, impl.caps.max_len or 24))  # small: the mask is the point
    Nq, Nk = sorted((case.Nq, case.Nk + (case.Nq == case.Nk)))[::1 if more_keys else -1]
    case = AttentionCase(**{**case.__dict__, "Nq": Nq, "Nk": Nk})
    q, k, v = case.tensors()
    out = call(impl, q, k, v, causal=True, scale=case.scale)
    truth, plain = truth_and_plain(case, q, k, v, impl)
    assert_earned(out, truth, plain, dtype_of(case.dtype),
                  what=f"{impl.name} causal with Nq={Nq}, Nk={Nk} vs the {impl.caps.causal_align} reference")


@applies(declared_max_len)
@given(data=st.data())
def test_long_keys_and_wide_heads(impl, data):
    """Up to 8 queries against up to 1100 keys (past split-K's 512-key partitions and 128-key tiles) and head
    dims up to 256, some past 4096 keys with rows whose logits climb along the keys next to rows whose do not: the
    float64 reference within the earned tolerance, as everywhere."""
    case = data.draw(long_cases(dtypes=impl.dtypes, devices=available(impl.devices), climbing=True), label="case")
    q, k, v = case.tensors()
    out = call(impl, q, k, v, causal=case.causal, scale=case.scale)
    truth, plain = truth_and_plain(case, q, k, v, impl)
    assert_earned(out, truth, plain, dtype_of(case.dtype), what=f"{impl.name} vs float64 reference")


@applies(lambda impl: None if impl.caps.returns_lse else "does not declare returns_lse (returns o only)")
@given(data=st.data())
def test_returned_lse_is_logsumexp_of_scaled_scores(impl, data):
    """A forward declaring returns_lse returns (o, L) with L = torch.logsumexp of the scaled, masked scores
    (natural log: the backward recomputes P = exp(S - L)); -inf exactly on rows that see no key."""
    case = draw_case(data, impl)
    q, k, v = case.tensors()
    o, lse = guarded_call(impl.fn, q, k, v, causal=case.causal, scale=case.scale, return_lse=True,
                          arg_names=("q", "k", "v"), timeout_s=call_limit(impl))
    align = impl.caps.causal_align
    truth_o, truth = attention_lse64(q, k, v, causal=case.causal, scale=case.scale, align=align)
    assert lse.shape == q.shape[:-1] and lse.dtype in (torch.float32, torch.float64), (
        f"{impl.name}: L of shape {tuple(lse.shape)} and dtype {lse.dtype}, expected {tuple(q.shape[:-1])}, float32/64")
    blind = truth.isinf()
    assert torch.equal(lse.isinf() & (lse < 0), blind), f"{impl.name}: L = -inf exactly on rows that see no key"
    plain = [p.masked_fill(blind, 0)
             for p in attention_lse_plain(q, k, v, causal=case.causal, scale=case.scale, align=align)]
    assert_earned(lse.masked_fill(blind, 0), truth.masked_fill(blind, 0), plain, dtype_of(case.dtype),
                  what=f"{impl.name} L vs float64 logsumexp")
    assert_earned(o, truth_o, attention_plain(q, k, v, causal=case.causal, scale=case.scale, align=align),
                  dtype_of(case.dtype),
                  what=f"{impl.name} o (returned with L) vs float64 reference")


@given(data=st.data())
def test_large_logits_stay_finite_and_correct(impl, data):
    """Scores of magnitude 1e3-1e4 (q scaled up) must not overflow, and scores all 800-3000 below zero (through
    one extra head dim: q -offset/scale, k 1, v 0) must not underflow to a zero row: the max is subtracted first,
    and it starts at -inf, not 0.  In every declared dtype: a half-precision kernel carries scores in float32
    (the contract), and the bound is earned by a plain computation that does so too."""
    far = data.draw(st.booleans(), label="far below zero")
    case = data.draw(attention_cases(dtypes=impl.dtypes, devices=available(impl.devices),
                                     max_len=min(130, impl.caps.max_len or 130),
                                     magnitude=None if far else st.floats(1e3, 1e4),
                                     offset=st.floats(800, 3000) if far else None), label="case")
    q, k, v = case.tensors()
    out = call(impl, q, k, v, causal=case.causal, scale=case.scale)
    truth = attention64(q, k, v, causal=case.causal, scale=case.scale, align=impl.caps.causal_align)
    plain, conditioning = large_logit_yardstick(q, k, v, causal=case.causal, scale=case.scale,
                                                align=impl.caps.causal_align)
    where = f"logits {case.offset:.0f} below 0" if far else f"logits ~{case.magnitude:.0f}"
    assert_earned(out, truth, plain, dtype_of(case.dtype), what=f"{impl.name} at {where}", kind="large_logits",
                  conditioning=conditioning)


def test_scores_1000_999_998_10(impl):
    """One query whose scores are [1000, 999, 998, 10]: naive exp overflows (Milakov & Gimelshein 2018, Sec. 2)."""
    dtype = dtype_of("float32" if "float32" in impl.dtypes else impl.dtypes[0])
    device = available(impl.devices)[0]
    q = torch.ones(1, 1, 1, 1, dtype=dtype, device=device)
    k = torch.tensor([1000.0, 999.0, 998.0, 10.0], dtype=dtype, device=device).reshape(1, 1, 4, 1)  # (B, Hkv, Nk, d)
    v = torch.arange(4, dtype=dtype, device=device).reshape(1, 1, 4, 1)
    out = call(impl, q, k, v, causal=False, scale=1.0)
    # Logits of 1e3, like test_large_logits: a kernel that rescales its scores (base-2 exponentials,
    # as FlashAttention-2's kernels use) rounds them once more than plain softmax does here, where
    # the scores happen to be exact.  Overflow still gives NaN and a wrong shift an O(1) error.
    plain, conditioning = large_logit_yardstick(q, k, v, scale=1.0)
    assert_earned(out, attention64(q, k, v, scale=1.0), plain, dtype,
                  what=f"{impl.name} on scores [1000, 999, 998, 10]", kind="large_logits", conditioning=conditioning)


@given(data=st.data(), perm_seed=st.integers(0, 2**31 - 1))
def test_key_value_permutation_invariance(impl, data, perm_seed):
    """Without a causal mask, permuting keys and values jointly leaves the output unchanged."""
    case = draw_case(data, impl, causal=False)
    q, k, v = case.tensors()
    perm = torch.randperm(case.Nk, generator=torch.Generator().manual_seed(perm_seed)).to(q.device)
    out = call(impl, q, k, v, causal=False, scale=case.scale)
    out_perm = call(impl, q, k[:, :, perm], v[:, :, perm], causal=False, scale=case.scale)
    truth, plain = truth_and_plain(case, q, k, v, impl)
    bound = 2 * earned_bound(truth, plain, dtype_of(case.dtype))  # both within one bound of the truth
    err = (out.double() - out_perm.double()).abs().max().item()
    if not err <= bound:
        raise with_margin(AssertionError(f"{impl.name}: permuting keys/values changed the output by {err:.3g} > "
                                         f"{bound:.3g}"), err, bound)


@given(data=st.data())
def test_rows_are_convex_combinations_of_values(impl, data):
    """Each output row lies in the box spanned by the value rows its query can see."""
    case = draw_case(data, impl)
    q, k, v = case.tensors()
    out = call(impl, q, k, v, causal=case.causal, scale=case.scale).double()  # (B, H, Nq, d)
    truth, plain = truth_and_plain(case, q, k, v, impl)
    slack = earned_bound(truth, plain, dtype_of(case.dtype))
    G = case.H // case.Hkv
    vv = v.double().repeat_interleave(G, dim=1)[:, :, None]  # (B, H, 1, Nk, d)
    seen = torch.ones(case.Nq, case.Nk, dtype=torch.bool, device=q.device)
    if case.causal:
        seen = causal_allowed(case.Nq, case.Nk, device=q.device, align=impl.caps.causal_align)
    seen = seen[None, None, :, :, None]  # (1, 1, Nq, Nk, 1)
    lo = torch.where(seen, vv, float("inf")).amin(dim=3)  # (B, H, Nq, d)
    hi = torch.where(seen, vv, float("-inf")).amax(dim=3)
    visible = seen.any(dim=3)
    inside = ((out >= lo - slack) & (out <= hi + slack)) | ~visible
    assert bool(inside.all()), (f"{impl.name}: output leaves the convex hull of the visible values at "
                                f"{(~inside).nonzero()[0].tolist()} (slack {slack:.3g})")


@applies(lambda impl: impl.caps.nan_caveat and f"{impl.name} declares a NaN caveat: {impl.caps.nan_caveat}")
@given(data=st.data(), where=st.sampled_from(["q", "k", "v"]))
def test_nan_inputs_propagate(impl, data, where):
    """A NaN in q, k or v reaches every output entry that reads it as NaN (or the call is rejected with a
    ValueError naming the argument): never a finite answer.  Masking "rows that see no key" by testing
    l > 0 is the classic way to turn a NaN into a silent 0.  No mask here, so every row reads every key."""
    case = draw_case(data, impl, causal=False)
    q, k, v = case.tensors()
    bad = {"q": q, "k": k, "v": v}[where]
    b, h, n, c = (data.draw(st.integers(0, size - 1), label=f"NaN at dim {i}") for i, size in enumerate(bad.shape))
    bad[b, h, n, c] = float("nan")
    try:
        out = guarded_call(impl.fn, q, k, v, causal=False, scale=case.scale, arg_names=("q", "k", "v"),
                           timeout_s=call_limit(impl))
    except ContractViolation as exc:
        cause = exc.__cause__
        assert isinstance(cause, ValueError) and names_argument(str(cause), where), (
            f"{impl.name}: NaN in {where}: {exc}, not a ValueError naming {where}")
        return
    G = case.H // case.Hkv
    reads = {"q": (b, h, n), "k": (b, slice(h * G, (h + 1) * G)), "v": (b, slice(h * G, (h + 1) * G), slice(None), c)}
    touched = out[reads[where]]
    assert not bool(torch.isfinite(touched).any()), (
        f"{impl.name}: a NaN in {where}[{b}, {h}, {n}, {c}] gave finite output entries "
        f"(e.g. {touched[torch.isfinite(touched)][:3].tolist()}) where every entry reads it")


def test_empty_shapes_give_empty_output(impl):
    """A dimension of size 0 is an answer, not an error: an output of q's shape, zeros where no key is seen."""
    dtype, device = dtype_of(impl.dtypes[0]), available(impl.devices)[0]
    for (name, (q_shape, kv_shape)), causal in itertools.product(EMPTY_SHAPES.items(), (False, True)):
        q, k, v = (torch.randn(shape, dtype=dtype, device=device) for shape in (q_shape, kv_shape, kv_shape))
        try:
            out = call(impl, q, k, v, causal=causal, scale=None)
        except ContractViolation as exc:
            raise AssertionError(f"{impl.name} on {name} (causal={causal}): {exc}") from exc
        assert not bool(out.any()), f"{impl.name} on {name} (causal={causal}): nonzero output with no key to see"


HEADROOM = 2 * MEMORY_BUDGET  # address space a refusing call may still map; an attempt at 14 GB fails at once
BAD_INPUTS = {
    "heads not divisible": ((1, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)),
    "head dim mismatch": ((1, 2, 4, 8), (1, 2, 4, 7), (1, 2, 4, 7)),
    "q not 4-d": ((2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)),
    "k/v shape mismatch": ((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 5, 8)),
    "batch mismatch": ((2, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)),
    "head dim 0": ((1, 2, 4, 0), (1, 2, 4, 0), (1, 2, 4, 0)),
}


def test_rejects_bad_input(impl):
    """Shapes that break the contract raise ValueError/TypeError naming the argument, never a silent answer; so do
    inputs on two devices (a meta k with a CPU q: some kernels return a tensor of the wrong device instead), and,
    from an implementation that materializes the (Nq, Nk) scores (not tiled), a 60,000-token prompt whose 14 GB
    of scores are past the contract's memory budget, and one just past it -- before allocating them (the address
    space is capped)."""
    dtype = dtype_of(impl.dtypes[0])
    for name in sorted(BAD_INPUTS):
        q, k, v = (torch.randn(*shape, dtype=dtype) for shape in BAD_INPUTS[name])
        assert_rejected(impl, name, q, k, v, causal=False, scale=None, names=("q", "k", "v"), arg_names=("q", "k", "v"))
    q = torch.randn(1, 2, 4, 8, dtype=dtype)
    for causal in BAD_CAUSAL:  # each would read as True, or fail deep inside
        assert_rejected(impl, f"causal={causal!r}", q, q, q, causal=causal, scale=None, names=("causal",))
    for name in ("k", "v"):
        args = {"q": q, "k": q.clone(), "v": q.clone()} | {name: q.to("meta")}
        assert_rejected(impl, f"{name} on the meta device", *args.values(), causal=False, scale=None, names=(name,),
                        arg_names=("q", "k", "v"))
    # far past the budget, and just past it: a refusal that counts the scores short refuses only the first
    for n in (PAST_BUDGET_TOKENS, just_past_budget(dtype)) if not impl.caps.tiled else ():
        long = torch.zeros(1, 1, n, 1, dtype=dtype)
        with address_space_headroom(HEADROOM):
            assert_rejected(impl, f"{n} tokens past the memory budget", long, long, long,
                            causal=False, scale=None, names=("Nq", "Nk"), arg_names=("q", "k", "v"))
