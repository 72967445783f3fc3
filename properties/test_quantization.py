"""Properties of quantizers (contract: harness/contracts/quantization.py).

Quantization is approximate: nothing is compared with a float64 answer to rounding.  What holds
exactly, and is tested here, is the error bound of rounding to a grid (|w - w_hat| <= s/2), the code
range, the exact round trip of the absmax element, idempotence, scale equivariance, the nesting of
the bounds across granularities and the all-zero case.  Float rounding of the arithmetic is the
("quantize", dtype) row of harness/tolerance.py.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.contracts.quantization import call, code_range, dequantize, qmax, scale_shape, step_per_element
from harness.devices import available
from harness.guard import assert_rejected
from harness.references.quantization import quantize64, zero_point_quantize64
from harness.runner import applies
from harness.strategies.quantization import QuantCase, quant_cases
from harness.tolerance import FLOAT64_IDENTITY, TOLERANCES, dtype_of

TECHNIQUE = "quantization"


def symmetric(impl) -> str | None:
    return None if impl.caps.symmetric else f"{impl.name} is asymmetric (zero point): no absmax round trip"


def asymmetric(impl) -> str | None:
    return None if not impl.caps.symmetric else f"{impl.name} is symmetric (absmax_round_trips checks it)"


def scale_rtol(dtype: torch.dtype) -> float:
    """Relative error allowed in a scale computed in dtype: a few roundings (the table's "quantize" floor)."""
    return TOLERANCES[("quantize", dtype)].floor


def draw_case(data, impl, **kw) -> QuantCase:
    return data.draw(quant_cases(dtypes=impl.dtypes, devices=available(impl.devices), **kw), label="case")


def quantize_case(impl, case: QuantCase, w=None, granularity=None, group_size=None):
    w = case.tensor() if w is None else w
    gran = granularity or case.granularity
    return call(impl, w, bits=case.bits, granularity=gran, group_size=group_size if granularity else case.group_size)


def slack(w: torch.Tensor, w_hat: torch.Tensor) -> torch.Tensor:
    """Rounding of the arithmetic in w's dtype, element-wise (the tolerance table's floor)."""
    return TOLERANCES[("quantize", w.dtype)].floor * (w.double().abs() + w_hat.double().abs())


@given(data=st.data())
def test_error_within_half_step(impl, data):
    """Every element: |w - dq(q(w))| <= s/2 for its own step s, at every granularity and bit width."""
    case = draw_case(data, impl)
    w = case.tensor()
    assert_within_half_step(impl, w, quantize_case(impl, case, w))


def assert_within_half_step(impl, w, qt):
    w_hat = dequantize(qt)
    err = (w.double() - w_hat.double()).abs()
    bound = TOLERANCES[("quantize", w.dtype)].k * step_per_element(qt).double() + slack(w, w_hat)
    bad = err > bound
    assert not bool(bad.any()), (f"{impl.name}: |w - dq(q(w))| = {err[bad][0].item():.4g} exceeds s/2 = "
                                 f"{bound[bad][0].item():.4g} at {bad.nonzero()[0].tolist()}")


@applies(symmetric)
def test_worked_example_4bit(impl):
    """A worked exercise: 4 bits per tensor, max|w| = 0.323, so the step is 0.323 / 7 and each code is
    w / step rounded: 0.323 -> 7, -0.2 -> -4.33 -> -4, 0.1 -> 2.17 -> 2, -0.05 -> -1.08 -> -1, 0.03 -> 0.65 -> 1."""
    dtype = dtype_of("float32" if "float32" in impl.dtypes else impl.dtypes[0])
    w = torch.tensor([[0.323, -0.2, 0.1, -0.05, 0.03]], dtype=dtype)
    qt = call(impl, w, bits=4, granularity="tensor")
    assert abs(qt.scale.item() - 0.323 / 7) <= scale_rtol(dtype), f"{impl.name}: step {qt.scale.item()}"
    assert qt.codes.tolist() == [[7, -4, 2, -1, 1]], f"{impl.name}: codes {qt.codes.tolist()}"


@given(data=st.data())
def test_codes_in_range(impl, data):
    """Symmetric codes lie in [-(2^(b-1) - 1), 2^(b-1) - 1]; asymmetric codes and zero points in [0, 2^b - 1]."""
    case = draw_case(data, impl)
    qt = quantize_case(impl, case)
    lo, hi = code_range(case.bits, impl.caps.symmetric)
    codes = qt.codes.to(torch.int64)
    assert int(codes.min()) >= lo and int(codes.max()) <= hi, (
        f"{impl.name}: {case.bits}-bit codes span [{int(codes.min())}, {int(codes.max())}], outside [{lo}, {hi}]")
    if qt.zero is not None:
        zero = qt.zero.to(torch.int64)
        assert int(zero.min()) >= lo and int(zero.max()) <= hi, f"{impl.name}: zero points outside [{lo}, {hi}]"


@applies(symmetric)
@given(data=st.data())
def test_absmax_round_trips(impl, data):
    """The scale is max|w| / (2^(b-1) - 1) of its group, and the largest-magnitude element of every group
    gets code +-(2^(b-1) - 1) and dequantizes to itself (up to the rounding of s * q)."""
    case = draw_case(data, impl)
    w = case.tensor()
    qt = quantize_case(impl, case, w)
    truth = quantize64(w, case.bits, case.granularity, case.group_size)
    scale_err = (qt.scale.double() - truth.scale).abs().max().item()
    assert scale_err <= scale_rtol(w.dtype) * truth.scale.abs().max().item(), (
        f"{impl.name}: scales differ from max|w| / {qmax(case.bits)} by {scale_err:.3g}")
    group_max = step_per_element(quantize64(w, 2, case.granularity, case.group_size))  # qmax(2) = 1: s = max|w|
    at_peak = (w.double().abs() == group_max) & (group_max > 0)  # (rows, cols): each group's absmax element(s)
    codes = qt.codes.to(torch.int64)
    assert torch.equal(codes[at_peak], truth.codes[at_peak]), (
        f"{impl.name}: an absmax element did not get code +-{qmax(case.bits)}: got "
        f"{codes[at_peak][codes[at_peak] != truth.codes[at_peak]][:4].tolist()}")
    w_hat = dequantize(qt)
    err = (w_hat.double() - w.double()).abs()[at_peak]
    assert bool((err <= slack(w, w_hat)[at_peak]).all()), f"{impl.name}: absmax element off by {err.max().item():.3g}"


@applies(asymmetric)
@given(data=st.data())
def test_zero_point_scales_match_reference(impl, data):
    """Asymmetric: every group's scale is (max(w, 0) - min(w, 0)) / (2^b - 1) and its zero point
    round(-min(w, 0) / s), as the contract defines them (float64 reference).  The half-step error bound
    alone cannot see a wrong scale: it is measured against the implementation's own step.  A zero point
    may differ by one only where -min(w, 0) / s lies within the scale's rounding of a tie."""
    case = draw_case(data, impl)
    w = case.tensor()
    qt = quantize_case(impl, case, w)
    truth = zero_point_quantize64(w, case.bits, case.granularity, case.group_size)
    used = truth.scale > 0  # all-zero groups may carry any finite scale (test_all_zero_groups_give_zeros)
    rtol = scale_rtol(w.dtype)
    assert_scales_match(impl, qt, truth, rtol, f"(max(w, 0) - min(w, 0)) / {2**case.bits - 1}")
    assert qt.zero is not None, f"{impl.name} declares symmetric=False but returns no zero point"
    lo = w.double().reshape(*scale_shape(w, case.granularity, case.group_size), -1).amin(dim=-1).clamp(max=0)
    raw = -lo / truth.scale.clamp(min=1e-300)  # (R, G): the zero point before rounding
    near_tie = ((raw - raw.floor() - 0.5).abs() <= rtol * (raw + 1)) & used
    off = (qt.zero.to(torch.int64) - truth.zero).abs()
    bad = used & ((off > 1) | ((off == 1) & ~near_tie))
    assert not bool(bad.any()), (
        f"{impl.name}: zero point {qt.zero[bad][0].item()} where round(-min(w, 0) / s) = {truth.zero[bad][0].item()} "
        f"at group {bad.nonzero()[0].tolist()}")


def assert_scales_match(impl, qt, truth, rtol: float, formula: str) -> None:
    """Every group's scale within rtol (relative) of the reference's; all-zero groups may carry any scale."""
    used = truth.scale > 0
    scale_err = ((qt.scale.double() - truth.scale).abs() / truth.scale.clamp(min=1e-300))[used]
    assert not bool((scale_err > rtol).any()), (
        f"{impl.name}: a scale differs from {formula} by {scale_err.max().item():.3g} (relative) at group "
        f"{used.nonzero()[int(scale_err.argmax())].tolist()}")


@given(data=st.data(), extreme=st.sampled_from(["huge", "tiny"]))
def test_extreme_magnitudes(impl, data, extreme):
    """Weights whose largest element is 0.9x the dtype's largest finite value, or so small that their
    squares underflow: every scale is still the reference's (finite, nonzero) and every element within
    half a step.  Catches (max - min) / (2^b - 1) overflowing, sqrt(max w^2), a scale built from squares."""
    case = draw_case(data, impl)
    dtype = dtype_of(case.dtype)
    info = torch.finfo(dtype)
    if extreme == "tiny" and dtype == torch.float16:
        extreme = "huge"  # float16's squares underflow only where its scales would be subnormal too
    w64 = case.tensor().double()
    target = 0.9 * info.max if extreme == "huge" else info.tiny**0.5 / 10
    w = (w64 / w64.abs().max() * target).to(dtype)  # (rows, cols): the largest |w| is the target
    qt = quantize_case(impl, case, w)
    reference = quantize64 if impl.caps.symmetric else zero_point_quantize64
    truth = reference(w, case.bits, case.granularity, case.group_size)
    assert_scales_match(impl, qt, truth, scale_rtol(w.dtype), f"the reference's at |w| up to {target:.3g}")
    assert_within_half_step(impl, w, qt)


@given(data=st.data())
def test_requantize_is_identity(impl, data):
    """q(dq(q(w))) = q(w): the dequantized tensor is already on the grid, with the same scales."""
    case = draw_case(data, impl)
    qt = quantize_case(impl, case)
    again = quantize_case(impl, case, dequantize(qt))
    assert torch.equal(again.codes.to(torch.int64), qt.codes.to(torch.int64)), (
        f"{impl.name}: requantizing changed {(again.codes != qt.codes).sum().item()} codes")
    rel = ((again.scale.double() - qt.scale.double()).abs() / qt.scale.double().clamp(min=1e-300)).max().item()
    assert rel <= scale_rtol(qt.scale.dtype), f"{impl.name}: requantizing changed scales by {rel:.3g}"


@given(data=st.data(), power=st.integers(-8, 8), factor=st.floats(1e-3, 1e3))
def test_positive_rescaling(impl, data, power, factor):
    """q(c w) has the same codes and c times the scales: exactly for c = 2^k (any dtype), and for any
    c > 0 in float64 (a code can flip only at an exact tie, probability ~1e-13 per element)."""
    case = draw_case(data, impl)
    w = case.tensor()
    qt = quantize_case(impl, case, w)
    c = factor if w.dtype == torch.float64 else 2.0**power
    scaled = quantize_case(impl, case, w * c)
    assert torch.equal(scaled.codes.to(torch.int64), qt.codes.to(torch.int64)), (
        f"{impl.name}: scaling w by {c:g} changed {(scaled.codes != qt.codes).sum().item()} codes")
    err = (scaled.scale.double() - c * qt.scale.double()).abs().max().item()
    assert err <= scale_rtol(w.dtype) * c * qt.scale.double().abs().max().item(), (
        f"{impl.name}: scales of c*w differ from c * scales by {err:.3g} (c = {c:g})")


@given(data=st.data())
def test_granularity_bounds_nest(impl, data):
    """For every element: step(group) <= step(channel) <= step(tensor), so the error bound only tightens."""
    case = draw_case(data, impl, granularity="group")
    w = case.tensor()
    steps = {gran: step_per_element(quantize_case(impl, case, w, granularity=gran,
                                                  group_size=case.group_size if gran == "group" else None)).double()
             for gran in ("group", "channel", "tensor")}
    tol = 1 + scale_rtol(w.dtype)
    for fine, coarse in (("group", "channel"), ("channel", "tensor")):
        bad = steps[fine] > steps[coarse] * tol
        assert not bool(bad.any()), (f"{impl.name}: {fine} step {steps[fine][bad][0].item():.4g} exceeds the "
                                     f"{coarse} step {steps[coarse][bad][0].item():.4g} at {bad.nonzero()[0].tolist()}")


@given(data=st.data())
def test_all_zero_groups_give_zeros(impl, data):
    """All-zero tensors, rows and groups give codes that dequantize to exactly 0, finite scales, no NaN."""
    case = draw_case(data, impl, zeros=True)
    w = case.tensor()
    for tensor in (w, torch.zeros_like(w)):
        qt = quantize_case(impl, case, tensor)  # `call` already rejects NaN/inf scales
        w_hat = dequantize(qt)
        zero = tensor == 0
        assert bool(torch.isfinite(w_hat).all()), f"{impl.name}: dequantized a zero group to NaN/inf"
        assert bool((w_hat[zero] == 0).all()), f"{impl.name}: zeros dequantize to {w_hat[zero].abs().max().item():.3g}"


BAD_INPUTS = {  # name -> (w, kwargs, argument the message must name)
    "bits 1": (lambda: torch.randn(4, 8), {"bits": 1, "granularity": "channel"}, "bits"),
    "bits 9": (lambda: torch.randn(4, 8), {"bits": 9, "granularity": "channel"}, "bits"),
    "group 3 of 8": (lambda: torch.randn(4, 8), {"bits": 4, "granularity": "group", "group_size": 3}, "group_size"),
    "NaN weight": (lambda: torch.tensor([[1.0, float("nan")]]), {"bits": 8, "granularity": "tensor"}, "w"),
    "unknown granularity": (lambda: torch.randn(4, 8), {"bits": 8, "granularity": "row"}, "granularity"),
}


def test_rejects_bad_input(impl):
    """Bits outside 2..8, a group size that does not divide the columns, NaN weights: a ValueError naming it."""
    dtype = dtype_of("float32" if "float32" in impl.dtypes else impl.dtypes[0])
    for name, (make, kwargs, arg) in sorted(BAD_INPUTS.items()):
        assert_rejected(impl, name, make().to(dtype), **{"group_size": None, **kwargs}, names=(arg,), arg_names=("w",))


# ---------------------------------------------------------------------------------------------
# outlier injection (harness/quant_experiments.py)
@pytest.mark.parametrize(("seed", "channel", "factor"), [(0, 0, 10.0), (1, 17, 100.0), (2, 31, 1000.0)])
def test_outlier_injection_preserves_the_function(seed, channel, factor):
    """Scaling a LayerNorm channel by c and the next Linear's input column by 1/c leaves the logits
    unchanged (float64), while that Linear's input gets a channel c times larger than before."""
    from harness.models.gpt import GPT, GPTConfig
    from harness.quant_experiments import block_linears, inject_outlier, input_absmax

    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_kv_head=2, n_embd=32)).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # LayerNorms start at (1, 0): make the injected bias matter too
            p.add_(0.1 * torch.randn_like(p))
    injected, _ = inject_outlier(model, layer=1, factor=factor, channel=channel)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        before, after = model(idx), injected(idx)
    err = (after - before).abs().max().item()
    assert err <= FLOAT64_IDENTITY * max(1.0, before.abs().max().item()), f"injection changed the logits by {err:.3g}"
    docs = idx.tolist()
    ffn_in = next(i for i, (parent, name) in enumerate(block_linears(injected))
                  if parent is injected.blocks[1].mlp and name == "0")
    grown = input_absmax(injected, docs)[ffn_in][channel] / input_absmax(model, docs)[ffn_in][channel]
    assert abs(grown.item() - factor) <= FLOAT64_IDENTITY * factor, \
        f"the channel grew by {grown.item():.6g}, not {factor:g}"


def test_outlier_injection_keeps_the_target_nll():
    """SmoothQuant's equivalence (Xiao et al. 2023, Sec. 3) on the trained target: LayerNorm channel x100, FFN
    column / 100, same NLL."""
    from harness.models.zoo import WEIGHTS, load, nll_per_token, test_corpus
    from harness.quant_experiments import inject_outlier

    if not (WEIGHTS / "target.safetensors").exists():
        pytest.skip("the target model's weights are not built (python -m harness.models.train)")
    target, docs = load("target").double(), test_corpus(20)
    injected, _ = inject_outlier(target)
    before, after = nll_per_token(target, docs), nll_per_token(injected, docs)
    assert abs(after - before) <= FLOAT64_IDENTITY * before, f"NLL moved from {before!r} to {after!r}"
