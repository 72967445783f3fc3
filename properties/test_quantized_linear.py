"""Properties of quantized linear layers (contract: harness/contracts/quantized_linear.py).

Two kinds of claims: (1) exactness of the arithmetic -- an implementation computes its declared
scheme's dequantized product, `quantized_linear64`, up to float rounding (integer accumulation is
exact); (2) the scheme's approximation -- |y - x @ w.T| stays inside the bound derived from its scales,
`quantized_linear_error_bound`.  The SmoothQuant transform's laws (function preserved, channel
ratio reduced) are tested on its building block at the end.
"""

import torch
from hypothesis import given
from hypothesis import strategies as st

from llm_inference_harness.contracts.quantized_linear import Scheme, call
from llm_inference_harness.engine.capabilities import applies, needs_cap, needs_dtype
from llm_inference_harness.engine.devices import available
from llm_inference_harness.engine.guard import ContractViolation, assert_rejected
from llm_inference_harness.engine.tolerance import TOLERANCES, assert_earned
from llm_inference_harness.references.quantized_linear import (
    quantized_linear64,
    quantized_linear_error_bound,
    quantized_linear_plain,
    quantized_linear_tie_bound,
)
from llm_inference_harness.strategies.quantized_linear import (
    LinearCase,
    linear_cases,
    outlier_batch_pairs,
)

TECHNIQUE = "quantized_linear"


def draw_case(data, impl, dtypes=None, **kw) -> LinearCase:
    dtypes = tuple(d for d in impl.dtypes if d in (dtypes or ("float64", "float32"))) or impl.dtypes[:1]
    return data.draw(linear_cases(dtypes=dtypes, devices=available(impl.devices),
                                  multiple_of=impl.caps.group_size or 1, bits=impl.caps.bits, **kw), label="case")


def assert_matches_scheme(impl, case: LinearCase, what: str) -> torch.Tensor:
    x, w, calib = case.tensors()
    out = call(impl, x, w, bits=case.bits, calib=calib)
    scheme = Scheme.of(impl)
    truth = quantized_linear64(x, w, bits=case.bits, scheme=scheme, calib=calib)
    plain = quantized_linear_plain(x, w, bits=case.bits, scheme=scheme, calib=calib)
    assert_earned(out, truth, plain, torch.float64, what=f"{impl.name} {what}")
    return out


@needs_dtype("float64")
@given(data=st.data())
def test_matches_scheme_reference(impl, data):
    """In float64 the output is the declared scheme's dequantized float computation, up to rounding:
    integer accumulation (or its float64 emulation) loses nothing.  x is (..., in): one token, a matrix
    of tokens, or (batch, tokens, in)."""
    case = draw_case(data, impl, dtypes=("float64",), leading_dims=True)
    assert_matches_scheme(impl, case, f"on x of shape {(*case.lead, case.d_in)} vs its scheme's float64 reference")


@applies(lambda impl: None if set(impl.dtypes) - {"float64"} else
         f"{impl.name} declares float64 only (matches_scheme_reference checks it)")
@given(data=st.data())
def test_matches_scheme_in_low_precision(impl, data):
    """In float32 (or lower) the output is still the declared scheme's, computed in float64 from the same
    inputs: within the matmul's rounding, plus one step at each code whose value lies within rounding of a
    tie.  A layer that skips a quantization, ignores calib or multiplies in plain float is off by far more."""
    dtypes = tuple(d for d in impl.dtypes if d != "float64")
    case = draw_case(data, impl, dtypes=dtypes, leading_dims=True)
    x, w, calib = case.tensors()
    assert_scheme_in_low_precision(impl, x, w, case.bits, calib, f"in {case.dtype}")


def assert_scheme_in_low_precision(impl, x, w, bits, calib, what: str) -> None:
    """Within the rounding of the scheme's working dtype (x's, or a declared narrower compute dtype) of the
    scheme's float64 reference, which rounds the inputs to that dtype first."""
    out = call(impl, x, w, bits=bits, calib=calib).double()
    scheme = Scheme.of(impl)
    work = scheme.working_dtype(x.dtype)
    truth = quantized_linear64(x, w, bits=bits, scheme=scheme, calib=calib)
    ties = quantized_linear_tie_bound(x, w, bits=bits, scheme=scheme, calib=calib, rel=16 * torch.finfo(work).eps)
    bound = TOLERANCES[("quantized_matmul", work)].floor * (x.double().abs() @ w.double().abs().T) + ties
    err = (out - truth).abs()
    bad = err > bound
    assert not bool(bad.any()), (
        f"{impl.name} {what}: {err[bad][0].item():.4g} from its scheme's float64 reference, beyond the "
        f"rounding allowance {bound[bad][0].item():.4g} at {bad.nonzero()[0].tolist()}")


@given(data=st.data())
def test_any_leading_dims(impl, data):
    """x is (..., in): one token as a 1-d x, and the tokens as a 4-d (2, 2, n / 4, in) x, each give the declared
    scheme's output of that shape (a kernel that flattens only 3-d inputs, or reads dim 1 as the features,
    fails here on every example)."""
    case = draw_case(data, impl)
    x, w, calib = case.tensors()
    tokens = x.reshape(-1, case.d_in)
    shapes = [tokens[0]] + ([tokens[: 4 * (case.n // 4)].reshape(2, 2, case.n // 4, case.d_in)] if case.n >= 4 else [])
    for xs in shapes:
        if x.dtype == torch.float64:
            truth = quantized_linear64(xs, w, bits=case.bits, scheme=Scheme.of(impl), calib=calib)
            plain = quantized_linear_plain(xs, w, bits=case.bits, scheme=Scheme.of(impl), calib=calib)
            assert_earned(call(impl, xs, w, bits=case.bits, calib=calib), truth, plain, torch.float64,
                          what=f"{impl.name} on x of shape {tuple(xs.shape)}")
        else:
            assert_scheme_in_low_precision(impl, xs, w, case.bits, calib, f"on x of shape {tuple(xs.shape)}")


@given(data=st.data())
def test_error_within_derived_bound(impl, data):
    """|y - x @ w.T| <= sum_k |x_k| dw_k + dx_k |w_k| + dx_k dw_k, with d = step / 2 of the scheme's own
    scales (outlier columns contribute nothing), plus the matmul's rounding in the input dtype."""
    case = draw_case(data, impl, leading_dims=True)
    x, w, calib = case.tensors()
    out = call(impl, x, w, bits=case.bits, calib=calib).double()
    exact = x.double() @ w.double().T  # (n, out)
    tol = TOLERANCES[("quantized_matmul", Scheme.of(impl).working_dtype(x.dtype))]
    bound = (tol.k * quantized_linear_error_bound(x, w, bits=case.bits, scheme=Scheme.of(impl), calib=calib)
             + tol.floor * (x.double().abs() @ w.double().abs().T))
    err = (out - exact).abs()
    bad = err > bound
    assert not bool(bad.any()), (f"{impl.name}: error {err[bad][0].item():.4g} exceeds the derived bound "
                                 f"{bound[bad][0].item():.4g} at {bad.nonzero()[0].tolist()}")


@needs_cap("outlier_threshold", "only LLM.int8()-style decompositions keep outlier columns in floating point")
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_outlier_columns_exact(impl, data, seed):
    """Changing the values in the outlier columns (keeping them outliers) changes the output by exactly
    delta_x[:, O] @ w[:, O].T: those columns never pass through int8.  In float64 to its rounding; an
    implementation without float64 in its working dtype's, with the outlier columns' weights a sixteenth of
    their rows' (rounded to the int8 grid of the row, such a weight would be off by up to a third of itself,
    far past that rounding)."""
    low = "float64" not in impl.dtypes
    case = draw_case(data, impl, dtypes=impl.dtypes if low else ("float64",), min_outliers=1)
    x, w, calib = case.tensors()
    cols = list(case.outliers)
    if low:
        w[:, cols] /= 16
    x2 = x.clone()
    x2[:, cols] = x[:, cols] * (1 + torch.rand(len(cols), generator=torch.Generator().manual_seed(seed),
                                               dtype=torch.float64).to(x.device)).to(x.dtype)  # still outliers
    y1, y2 = (call(impl, t, w, bits=case.bits, calib=calib).double() for t in (x, x2))
    expected = (x2 - x).double()[:, cols] @ w.double()[:, cols].T  # (n, out)
    work = Scheme.of(impl).working_dtype(x.dtype)
    err = ((y2 - y1) - expected).abs()
    bound = TOLERANCES[("forward", work)].floor * torch.maximum(y1.abs() + y2.abs() + expected.abs(),
                                                                torch.ones_like(y1))
    bad = err > bound
    assert not bool(bad.any()), (f"{impl.name}: outlier columns are not computed exactly: off by "
                                 f"{err[bad][0].item():.3g} > {bound[bad][0].item():.3g} at "
                                 f"{bad.nonzero()[0].tolist()}")


def computes_narrower(impl) -> str | None:
    """Skip reason unless the implementation declares a compute dtype narrower than one of its I/O dtypes."""
    scheme = Scheme.of(impl)
    if scheme.compute_dtype is None:
        return "declares no compute_dtype: it computes in x's own dtype"
    if not wider_dtypes(impl):
        return f"declares compute_dtype={scheme.compute_dtype} and no wider I/O dtype"
    return None


def wider_dtypes(impl) -> tuple[str, ...]:
    scheme = Scheme.of(impl)
    return tuple(d for d in impl.dtypes if scheme.working_dtype(getattr(torch, d)) != getattr(torch, d))


@applies(computes_narrower)
@given(data=st.data())
def test_computes_in_the_declared_dtype(impl, data):
    """A layer declaring a compute dtype narrower than x's (bitsandbytes: float16 for float32 x) gives, on inputs
    off that dtype's grid, the scheme's output of the inputs rounded to it, within that dtype's rounding: not
    another precision's (bfloat16's rounding is 8x float16's), and the output still in x's dtype (`call`)."""
    case = draw_case(data, impl, dtypes=wider_dtypes(impl), leading_dims=True)
    x, w, calib = case.tensors()
    assert_scheme_in_low_precision(impl, x, w, case.bits, calib,
                                   f"in {case.dtype}, declaring compute_dtype={impl.caps.compute_dtype}")


@needs_cap("outlier_threshold", "only LLM.int8()-style decompositions compare activations with a threshold")
@needs_cap("act", "weight-only: the activations' rounding, which shows the comparison here, is not there")
@given(data=st.data(), sign=st.sampled_from([1.0, -1.0]))
def test_outlier_threshold_comparison(impl, data, sign):
    """A column whose largest |x| is exactly the threshold is an outlier under a declared ``>=`` and not under
    ``>``.  The two readings differ by far more than rounding here: the other columns hold +-threshold / 300, so
    when the threshold column stays in the int8 product (row scale threshold / 127) they all round to code 0,
    and when it leaves they keep their values.  The output must be nearer its declared reading than the other one,
    by the margin between them."""
    case = draw_case(data, impl)
    d_in = case.d_in * -(-16 // case.d_in)  # at least 16 columns (a multiple of the declared group size)
    t = impl.caps.outlier_threshold
    dtype, device = getattr(torch, case.dtype), case.device
    w = torch.rand(case.d_out, d_in, generator=torch.Generator().manual_seed(case.seed), dtype=torch.float64) + 0.5
    w[:, 0] = w.amax(dim=1)  # (out, in): positive, so the small columns' loss adds up; column 0 on the int8 grid
    x = torch.full((case.n, d_in), t / 300, dtype=torch.float64)  # (n, in): tiny, every column
    x[:, 0] = sign * t  # exactly the threshold, in every row (t is a float16 value: exact in every dtype)
    x, w = x.to(dtype).to(device), w.to(dtype).to(device)
    out = call(impl, x, w, bits=case.bits).double()
    scheme = Scheme.of(impl)
    other = Scheme(**{**scheme.__dict__, "outlier_compare": ">" if scheme.outlier_compare == ">=" else ">="})
    declared, undeclared = (quantized_linear64(x, w, bits=case.bits, scheme=s) for s in (scheme, other))
    gap = (declared - undeclared).abs().max().item()
    err = (out - declared).abs().max().item()
    assert err < gap / 2, (f"{impl.name}: with |x| = threshold {t} in column 0, the output is {err:.4g} from its "
                           f"declared outlier_compare={scheme.outlier_compare!r} reading, and the two readings are "
                           f"{gap:.4g} apart: it compares the other way")


@needs_cap("act", "weight-only layers compute no statistics of the activations that could go stale")
@needs_dtype("float64")
@given(data=st.data())
def test_outliers_follow_each_batch(impl, data):
    """Two batches whose outlier columns differ: each result is its own batch's scheme reference (no state,
    such as outlier columns or scales, carries over from one call to the next)."""
    first, second = data.draw(outlier_batch_pairs(dtypes=("float64",), devices=available(impl.devices),
                                                  multiple_of=impl.caps.group_size or 1, bits=impl.caps.bits),
                              label="batches")
    assert_matches_scheme(impl, first, "on the first batch")
    assert_matches_scheme(impl, second, f"on a second batch (outliers {second.outliers}, first {first.outliers})")


@given(data=st.data())
def test_all_zero_tokens_give_zeros(impl, data):
    """All-zero tokens (padding) give exactly zero outputs, never NaN (`call` rejects non-finite outputs); so do
    all-zero weight rows (pruned output channels, whose scale is 0), in every token's output."""
    case = draw_case(data, impl, zero_tokens=True)
    x, w, calib = case.tensors()
    out = call(impl, x, w, bits=case.bits, calib=calib)
    rows = out[: case.zero_tokens]
    assert bool((rows == 0).all()), f"{impl.name}: zero tokens gave outputs up to {rows.abs().max().item():.3g}"
    columns = out[:, : case.zero_channels]
    assert bool((columns == 0).all()), (f"{impl.name}: {case.zero_channels} all-zero weight rows gave outputs up to "
                                        f"{columns.abs().max().item():.3g}")


BAD_INPUTS = {  # name -> (x, w, bits, argument the message must name)
    "bits 1": (lambda: torch.randn(3, 8), lambda: torch.randn(4, 8), 1, "bits"),
    "bits 9": (lambda: torch.randn(3, 8), lambda: torch.randn(4, 8), 9, "bits"),
    "NaN weight": (lambda: torch.randn(3, 8), lambda: torch.full((4, 8), float("nan")), 8, "w"),
    "NaN activation": (lambda: torch.full((3, 8), float("nan")), lambda: torch.randn(4, 8), 8, "x"),
    "in-features mismatch": (lambda: torch.randn(3, 7), lambda: torch.randn(4, 8), 8, "x"),
    "w not 2-d": (lambda: torch.randn(3, 8), lambda: torch.randn(8), 8, "w"),
    "empty 0 x 8 weight": (lambda: torch.randn(3, 8), lambda: torch.randn(0, 8), 8, "w"),
    "float32 x, float64 w": (lambda: torch.randn(3, 8), lambda: torch.randn(4, 8, dtype=torch.float64), 8, "w"),
    "float64 x, float32 w": (lambda: torch.randn(3, 8, dtype=torch.float64), lambda: torch.randn(4, 8), 8, "w"),
    "w on another device": (lambda: torch.randn(3, 8), lambda: torch.empty(4, 8, device="meta"), 8, "w"),
}


def test_rejects_bad_input(impl):
    """Bad bits, NaN weights or activations, mismatched shapes, an empty w, x and w of different dtypes or
    devices, and a bit width it does not declare: a ValueError/TypeError naming the argument."""
    cases = dict(BAD_INPUTS)
    for bits in sorted(set(range(2, 9)) - set(impl.caps.bits))[:1]:
        cases[f"undeclared {bits}-bit codes"] = (lambda: torch.randn(3, 8), lambda: torch.randn(4, 8), bits, "bits")
    for name, (make_x, make_w, bits, arg) in sorted(cases.items()):
        assert_rejected(impl, name, make_x(), make_w(), bits=bits, calib=None, names=(arg,), arg_names=("x", "w"))


@given(data=st.data(), lead=st.sampled_from([(0,), (2, 0), (0, 3)]))
def test_no_tokens_give_an_empty_output(impl, data, lead):
    """x with no tokens, (0, in), (2, 0, in) or (0, 3, in), gives an empty (..., out) output: an empty batch is
    not an error (its per-tensor scale is that of nothing, never computed)."""
    case = draw_case(data, impl)
    _, w, _ = case.tensors()
    x = torch.zeros(*lead, case.d_in, dtype=w.dtype, device=w.device)
    try:
        out = call(impl, x, w, bits=case.bits)
    except ContractViolation as exc:  # the law is that it answers: a raise is the failure, said as one
        raise AssertionError(f"{impl.name}: an empty batch x {tuple(x.shape)} got no answer: {exc}") from exc
    assert out.numel() == 0, f"{impl.name}: an empty batch gave {tuple(out.shape)}"
