"""Properties of quantizers (contract: harness/contracts/quantization.py).

Quantization is approximate: nothing is compared with a float64 answer to rounding.  What holds
exactly, and is tested here, is the error bound of rounding to a grid (|w - w_hat| <= s/2), the code
range, the exact round trip of the absmax element, idempotence, scale equivariance, the nesting of
the bounds across granularities and the all-zero case.  Float rounding of the arithmetic is the
("quantize", dtype) row of harness/engine/tolerance.py.  Every case lies inside the formats the implementation
declares (bit widths, granularities, group sizes, code range, scale dtype and floor: the contract's
QuantizationCaps); a property that needs an undeclared one skips, naming it.
"""

import torch
from hypothesis import event, given
from hypothesis import strategies as st

from llm_inference_harness.contracts.quantization import (
    GRANULARITIES,
    Quantized,
    call,
    code_range,
    dequantize,
    qmax,
    scale_divisor,
    scale_rounding,
    scale_shape,
    step_per_element,
)
from llm_inference_harness.engine.capabilities import applies
from llm_inference_harness.engine.devices import available
from llm_inference_harness.engine.guard import assert_rejected
from llm_inference_harness.engine.tolerance import TOLERANCES, dtype_of
from llm_inference_harness.properties.quantization_checks import (
    asymmetric,
    scale_allowance,
    scale_rtol,
    serves,
    slack,
    symmetric,
)
from llm_inference_harness.references.quantization import (
    declared_quantize64,
    float_zero_point_quantize64,
    quantize64,
    zero_point_quantize64,
)
from llm_inference_harness.strategies.quantization import LONG_ROWS, QuantCase, long_row_cases, quant_cases

TECHNIQUE = "quantization"


def draw_case(data, impl, **kw) -> QuantCase:
    return data.draw(quant_cases(dtypes=impl.dtypes, devices=available(impl.devices), caps=impl.caps, **kw),
                     label="case")


def reference(impl, w, case: QuantCase):
    """The float64 quantization the implementation's declared format defines."""
    if not impl.caps.symmetric:
        if impl.caps.zero_point == "integer":
            return zero_point_quantize64(w, case.bits, case.granularity, case.group_size)
        return float_zero_point_quantize64(w, case.bits, case.granularity, case.group_size,
                                           edge=impl.caps.zero_point == "float_edge", floor=impl.caps.scale_floor)
    return declared_quantize64(w, case.bits, case.granularity, case.group_size, impl.caps)


def quantize_case(impl, case: QuantCase, w=None, granularity=None, group_size=None):
    w = case.tensor() if w is None else w
    gran = "".join(granularity or case.granularity)  # a new str, as a parsed config holds: not the interned literal
    return call(impl, w, bits=case.bits, granularity=gran, group_size=group_size if granularity else case.group_size)


@given(data=st.data())
def test_error_within_half_step(impl, data):
    """Every element: |w - dq(q(w))| <= s/2 for its own step s, at every granularity and bit width."""
    case = draw_case(data, impl)
    w = case.tensor()
    assert_within_half_step(impl, w, quantize_case(impl, case, w), case.bits)


def assert_within_half_step(impl, w, qt, bits: int):
    """|w - w_hat| <= (|s| + r) / 2 + |q - z| r, r the rounding of a declared scale_dtype (0 without one); a
    whole step at the clipped top code of the signed_extreme convention."""
    w_hat = dequantize(qt)
    err = (w.double() - w_hat.double()).abs()
    step = step_per_element(qt).double().abs()  # (rows, cols)
    r = scale_rounding(step, impl.caps.scale_dtype)
    codes = qt.codes.to(torch.float64)
    if qt.zero is not None:
        codes = codes - step_per_element(Quantized(qt.codes, qt.zero.double()))  # q - z, (rows, cols)
    k = torch.full_like(step, TOLERANCES[("quantize", w.dtype)].k)
    if impl.caps.code_range == "signed_extreme":  # past 2^(b-1) - 1/2 steps the top code clips: a whole step
        k[codes == qmax(bits)] *= 2
    if impl.caps.zero_point == "float_edge":  # the end opposite the exact one may clip at code 0 or 2^b - 1
        k[(qt.codes == 0) | (qt.codes == 2**bits - 1)] *= 2
    bound = k * (step + r) + codes.abs() * r + slack(w, w_hat)
    bad = err > bound
    assert not bool(bad.any()), (f"{impl.name}: |w - dq(q(w))| = {err[bad][0].item():.4g} exceeds s/2 = "
                                 f"{bound[bad][0].item():.4g} at {bad.nonzero()[0].tolist()}")


WORKED_4BIT = {  # convention -> (step, codes) of w = [0.323, -0.2, 0.1, -0.05, 0.03] at 4 bits per tensor
    "restricted": (0.323 / 7, [7, -4, 2, -1, 1]),  # 0.323 / step = 7; -0.2 -> -4.33; 0.1 -> 2.17; ...
    "full": (0.323 / 7.5, [7, -5, 2, -1, 1]),  # 0.323 -> 7.5, a tie clamped to 7; -0.2 -> -4.64; 0.1 -> 2.32; ...
    "signed_extreme": (-0.323 / 8, [-8, 5, -2, 1, -1]),  # the extreme -> -8; -0.2 -> 4.95; 0.1 -> -2.48; ...
}


@applies(symmetric)
@applies(serves("tensor", bits=4))
def test_worked_example_4bit(impl):
    """A worked exercise: 4 bits per tensor, max|w| = 0.323, so the step is 0.323 / 7 and each code is
    w / step rounded: 0.323 -> 7, -0.2 -> -4.33 -> -4, 0.1 -> 2.17 -> 2, -0.05 -> -1.08 -> -1, 0.03 -> 0.65 -> 1
    (and the same exercise in the full and signed_extreme conventions, WORKED_4BIT)."""
    dtype = dtype_of("float32" if "float32" in impl.dtypes else impl.dtypes[0])
    w = torch.tensor([[0.323, -0.2, 0.1, -0.05, 0.03]], dtype=dtype)
    step, codes = WORKED_4BIT[impl.caps.code_range]
    qt = call(impl, w, bits=4, granularity="tensor")
    allowed = scale_allowance(impl, torch.tensor(step), dtype).item()
    assert abs(qt.scale.item() - step) <= allowed, f"{impl.name}: step {qt.scale.item()}, expected {step}"
    assert qt.codes.tolist() == [codes], f"{impl.name}: codes {qt.codes.tolist()}, expected {codes}"


@given(data=st.data())
def test_codes_in_range(impl, data):
    """Symmetric codes lie in [-(2^(b-1) - 1), 2^(b-1) - 1] (the declared full and signed_extreme conventions
    add -2^(b-1)); asymmetric codes and zero points in [0, 2^b - 1]."""
    case = draw_case(data, impl)
    qt = quantize_case(impl, case)
    lo, hi = code_range(case.bits, impl.caps.symmetric, impl.caps.code_range)
    codes = qt.codes.to(torch.int64)
    assert int(codes.min()) >= lo and int(codes.max()) <= hi, (
        f"{impl.name}: {case.bits}-bit codes span [{int(codes.min())}, {int(codes.max())}], outside [{lo}, {hi}]")
    if qt.zero is not None and impl.caps.zero_point == "integer":  # a float zero point is -min/s: any real
        zero = qt.zero.to(torch.int64)
        assert int(zero.min()) >= lo and int(zero.max()) <= hi, f"{impl.name}: zero points outside [{lo}, {hi}]"


@applies(symmetric)
@given(data=st.data())
def test_absmax_round_trips(impl, data):
    """The scale is max|w| / (2^(b-1) - 1) of its group (its declared convention's rule: max|w| / (2^(b-1) - 1/2)
    for full, extreme / -2^(b-1) for signed_extreme, never below a declared floor), and the largest-magnitude
    element of every group gets the convention's extreme code: +-(2^(b-1) - 1), dequantizing to itself up to the
    rounding of s * q (restricted); -2^(b-1), exactly, for signed_extreme (where +m and -m tie, the first in the
    row's order: the other gets 2^(b-1) - 1, clipped a whole step short); 2^(b-1) - 1 if positive and -2^(b-1)
    (or, at a rounding tie, -(2^(b-1) - 1)) if negative for full."""
    case = draw_case(data, impl)
    w = case.tensor()
    qt = quantize_case(impl, case, w)
    truth = reference(impl, w, case)
    assert_scales_match(impl, qt, truth, w.dtype, f"the {impl.caps.code_range} rule max|w| / "
                                                  f"{scale_divisor(case.bits, impl.caps.code_range)}")
    group_max = step_per_element(quantize64(w, 2, case.granularity, case.group_size))  # qmax(2) = 1: s = max|w|
    rule = group_max / scale_divisor(case.bits, impl.caps.code_range)
    floored = rule < impl.caps.scale_floor  # (rows, cols): the floor binds, the peak gets a smaller code
    if bool(floored.any()):
        event("absmax round trip: a declared scale floor binds")
    at_peak = (w.double().abs() == group_max) & (group_max > 0) & ~floored  # each group's absmax element(s)
    codes, want = qt.codes.to(torch.int64)[at_peak], truth.codes[at_peak]
    ok = codes == want
    if impl.caps.code_range == "full":  # -(2^(b-1) - 1/2) steps is a tie: rounded in w's dtype, either code
        ok |= (want < 0) & ((codes == -(2 ** (case.bits - 1))) | (codes == -qmax(case.bits)))
    assert bool(ok.all()), (f"{impl.name}: an absmax element got code {codes[~ok][:4].tolist()}, expected "
                            f"{want[~ok][:4].tolist()}")
    if impl.caps.code_range == "full":
        return  # its peak is half a step off by design: test_error_within_half_step bounds it
    if impl.caps.code_range == "signed_extreme":  # where +m and -m tie, the one not chosen as the extreme is clipped
        at_peak &= truth.codes == -(2 ** (case.bits - 1))  # to 2^(b-1) - 1, a whole step off (its code is checked)
        codes = qt.codes.to(torch.int64)[at_peak]
    w_hat = dequantize(qt)
    r = scale_rounding(step_per_element(qt), impl.caps.scale_dtype)[at_peak]
    err = (w_hat.double() - w.double()).abs()[at_peak]
    allowed = slack(w, w_hat)[at_peak] + codes.abs() * r
    assert bool((err <= allowed).all()), f"{impl.name}: absmax element off by {err.max().item():.3g}"


@applies(asymmetric)
@given(data=st.data())
def test_zero_point_scales_match_reference(impl, data):
    """Asymmetric: every group's scale is (max(w, 0) - min(w, 0)) / (2^b - 1) and its zero point
    round(-min(w, 0) / s), as the contract defines them (float64 reference).  The half-step error bound
    alone cannot see a wrong scale: it is measured against the implementation's own step.  A zero point
    may differ by one only where -min(w, 0) / s lies within the scale's rounding of a tie.  A declared
    ``zero_point="float"`` (HQQ, quanto) or ``"float_edge"`` (MLX) is checked in its own convention:
    s = (max(w) - min(w)) / (2^b - 1) and z = -min(w) / s unrounded, within a few roundings of w's dtype (in code
    units: z's own size times them)."""
    case = draw_case(data, impl)
    w = case.tensor()
    qt = quantize_case(impl, case, w)
    assert qt.zero is not None, f"{impl.name} declares symmetric=False but returns no zero point"
    if impl.caps.zero_point != "integer":
        truth = reference(impl, w, case)
        assert_scales_match(impl, qt, truth, w.dtype, f"the {impl.caps.zero_point} rule, (max(w) - min(w)) / "
                                                      f"{2**case.bits - 1} at its heart")
        used = truth.scale != 0
        err = (qt.zero.double() - truth.zero).abs()
        bad = used & (err > 4 * scale_rtol(w.dtype) * (truth.zero.abs() + 2**case.bits))
        assert not bool(bad.any()), (
            f"{impl.name}: zero point {qt.zero[bad][0].item():.6g} where -min(w) / s = {truth.zero[bad][0].item():.6g}"
            f" at group {bad.nonzero()[0].tolist()}")
        return
    truth = zero_point_quantize64(w, case.bits, case.granularity, case.group_size)
    used = truth.scale > 0  # all-zero groups may carry any finite scale (test_all_zero_groups_give_zeros)
    rtol = scale_rtol(w.dtype)
    assert_scales_match(impl, qt, truth, w.dtype, f"(max(w, 0) - min(w, 0)) / {2**case.bits - 1}")
    lo = w.double().reshape(*scale_shape(w, case.granularity, case.group_size), -1).amin(dim=-1).clamp(max=0)
    raw = -lo / truth.scale.clamp(min=1e-300)  # (R, G): the zero point before rounding
    near_tie = ((raw - raw.floor() - 0.5).abs() <= rtol * (raw + 1)) & used
    off = (qt.zero.to(torch.int64) - truth.zero).abs()
    bad = used & ((off > 1) | ((off == 1) & ~near_tie))
    assert not bool(bad.any()), (
        f"{impl.name}: zero point {qt.zero[bad][0].item()} where round(-min(w, 0) / s) = {truth.zero[bad][0].item()} "
        f"at group {bad.nonzero()[0].tolist()}")


def assert_scales_match(impl, qt, truth, dtype: torch.dtype, formula: str) -> None:
    """Every group's scale within a few roundings in ``dtype`` (and of a declared scale_dtype) of the reference's;
    all-zero groups may carry any scale."""
    used = truth.scale != 0
    err = (qt.scale.double() - truth.scale).abs()
    bad = used & (err > scale_allowance(impl, truth.scale, dtype))
    assert not bool(bad.any()), (
        f"{impl.name}: a scale differs from {formula}: {qt.scale[bad][0].item():.6g} where the reference has "
        f"{truth.scale[bad][0].item():.6g}, at group {bad.nonzero()[0].tolist()}")


@given(data=st.data())
def test_long_rows_keep_their_peak(impl, data):
    """Rows past 256, 512, 1024 and 4096 elements whose largest magnitude sits beyond the first block: every
    scale is still its whole group's (the reference's) and every element within its bound.  A row-wise
    reduction that sees only one block of 256 or 1024 elements misses the peak and clamps it."""
    for lo, hi in LONG_ROWS:
        case = data.draw(long_row_cases(lo, hi, dtypes=impl.dtypes, devices=available(impl.devices), caps=impl.caps),
                         label=f"a row past {lo - 1}")
        w = case.tensor()
        qt = quantize_case(impl, case, w)
        assert_scales_match(impl, qt, reference(impl, w, case), w.dtype,
                            f"its group's rule with the peak at column {case.peak_at} of {case.cols}")
        assert_within_half_step(impl, w, qt, case.bits)


@given(data=st.data(), extreme=st.sampled_from(["huge", "tiny"]))
def test_extreme_magnitudes(impl, data, extreme):
    """Weights whose largest element is 0.9x the dtype's largest finite value, or so small that their
    squares underflow: every scale is still the reference's (finite, nonzero) and every element within
    half a step.  Catches (max - min) / (2^b - 1) overflowing, sqrt(max w^2), a scale built from squares."""
    case = draw_case(data, impl)
    dtype = dtype_of(case.dtype)
    info = torch.finfo(dtype)
    largest, tiny = info.max, info.tiny**0.5 / 10
    if impl.caps.scale_dtype is not None:  # the scales must fit the declared scale dtype: so must max|w| / divisor
        stored = torch.finfo(getattr(torch, impl.caps.scale_dtype))
        divisor = scale_divisor(case.bits, impl.caps.code_range) if impl.caps.symmetric else 2**case.bits - 1
        largest = min(largest, stored.max * divisor)
        if tiny / divisor < stored.tiny:
            event(f"extreme magnitudes: no tiny case, its scales would be subnormal in {impl.caps.scale_dtype}")
            extreme = "huge"
    if extreme == "tiny" and dtype == torch.float16:
        extreme = "huge"  # float16's squares underflow only where its scales would be subnormal too
    w64 = case.tensor().double()
    target = 0.9 * largest if extreme == "huge" else tiny
    w = (w64 / w64.abs().max() * target).to(dtype)  # (rows, cols): the largest |w| is the target
    qt = quantize_case(impl, case, w)
    truth = reference(impl, w, case)
    assert_scales_match(impl, qt, truth, w.dtype, f"the reference's at |w| up to {target:.3g}")
    assert_within_half_step(impl, w, qt, case.bits)


@applies(lambda impl: "the full convention's grid is not closed: a positive peak dequantizes to 2^(b-1) - 1 "
         "steps, so its requantized scale shrinks" if impl.caps.code_range == "full" else None)
@applies(lambda impl: "the float_edge grid is not closed: where the codes do not reach the far end, the "
         "dequantized range is narrower and its scale is chosen anew" if impl.caps.zero_point == "float_edge" else None)
@given(data=st.data())
def test_requantize_is_identity(impl, data):
    """q(dq(q(w))) = q(w): the dequantized tensor is already on the grid, with the same scales (up to the rounding
    of dq itself: (q - z) s in w's dtype is off by a few roundings of |q - z| s, which with a float zero point far
    from the codes, a group far from 0, is |z| / (2^b - 1) times the scale's own rounding)."""
    case = draw_case(data, impl)
    qt = quantize_case(impl, case)
    again = quantize_case(impl, case, dequantize(qt))
    assert torch.equal(again.codes.to(torch.int64), qt.codes.to(torch.int64)), (
        f"{impl.name}: requantizing changed {(again.codes != qt.codes).sum().item()} codes")
    err = (again.scale.double() - qt.scale.double()).abs()
    allowed = scale_allowance(impl, qt.scale, qt.scale.dtype)
    if impl.caps.zero_point != "integer":  # both ends of the dequantized range off by up to rtol (|z| + 2^b) |s|
        levels = 2**case.bits - 1
        allowed = allowed + 2 * scale_rtol(qt.scale.dtype) * qt.scale.double().abs() * (
            qt.zero.double().abs() + levels + 1) / levels
    bad = err > allowed
    assert not bool(bad.any()), (f"{impl.name}: requantizing changed a scale from {qt.scale[bad][0].item():.6g} "
                                 f"to {again.scale[bad][0].item():.6g}")


@given(data=st.data(), power=st.integers(-8, 8), factor=st.floats(1e-3, 1e3))
def test_positive_rescaling(impl, data, power, factor):
    """q(c w) has the same codes and c times the scales: exactly for c = 2^k (any dtype), and for any
    c > 0 in float64 (a code can flip only at an exact tie, probability ~1e-13 per element; a mirrored case,
    whose groups are built on ties, QuantCase.mirror, takes c = 2^k).  Above a declared scale floor only (c >= 1
    there), and up to the rounding of a declared scale dtype."""
    case = draw_case(data, impl)
    w = case.tensor()
    qt = quantize_case(impl, case, w)
    if impl.caps.scale_floor > 0 and power < 0:
        event("positive rescaling: upward only, below a declared scale floor codes need not scale")
        power = -power
    if w.dtype == torch.float64 and case.mirror is not None:
        event("positive rescaling: a power of two, the mirrored case's ties kept exact")
    c = factor if w.dtype == torch.float64 and case.mirror is None else 2.0**power
    if impl.caps.scale_floor > 0:
        c = max(c, 1.0)
    scaled = quantize_case(impl, case, w * c)
    assert torch.equal(scaled.codes.to(torch.int64), qt.codes.to(torch.int64)), (
        f"{impl.name}: scaling w by {c:g} changed {(scaled.codes != qt.codes).sum().item()} codes")
    want = c * qt.scale.double()
    err = (scaled.scale.double() - want).abs()
    allowed = scale_rtol(w.dtype) * want.abs().max() + scale_rounding(want, impl.caps.scale_dtype) \
        + c * scale_rounding(qt.scale, impl.caps.scale_dtype)
    used = w.double().reshape(*scale_shape(w, case.granularity, case.group_size), -1).abs().amax(dim=-1) > 0
    bad = used & (err > allowed)
    assert not bool(bad.any()), (f"{impl.name}: scales of c*w differ from c * scales by "
                                 f"{err[bad].max().item():.3g} (c = {c:g})")


@applies(serves(*GRANULARITIES))
@given(data=st.data())
def test_granularity_bounds_nest(impl, data):
    """For every element: step(group) <= step(channel) <= step(tensor), so the error bound only tightens."""
    case = draw_case(data, impl, granularity="group")
    w = case.tensor()
    steps = {gran: step_per_element(quantize_case(impl, case, w, granularity=gran,
                                                  group_size=case.group_size if gran == "group" else None)).double()
             for gran in ("group", "channel", "tensor")}
    tol = 1 + scale_rtol(w.dtype) + (0 if impl.caps.scale_dtype is None else
                                     torch.finfo(getattr(torch, impl.caps.scale_dtype)).eps)
    for fine, coarse in (("group", "channel"), ("channel", "tensor")):
        bad = steps[fine].abs() > steps[coarse].abs() * tol
        assert not bool(bad.any()), (f"{impl.name}: {fine} step {steps[fine][bad][0].item():.4g} exceeds the "
                                     f"{coarse} step {steps[coarse][bad][0].item():.4g} at {bad.nonzero()[0].tolist()}")


@given(data=st.data())
def test_all_zero_groups_give_zeros(impl, data):
    """All-zero tensors, rows and groups give codes that dequantize to exactly 0, finite scales, no NaN (with a
    declared float zero point, the all-zero groups: a zero among other values is off the grid)."""
    case = draw_case(data, impl, zeros=True)
    w = case.tensor()
    for tensor in (w, torch.zeros_like(w)):
        qt = quantize_case(impl, case, tensor)  # `call` already rejects NaN/inf scales
        w_hat = dequantize(qt)
        zero = tensor == 0
        if impl.caps.zero_point != "integer":  # 0 is on the grid of an all-zero group only: a zero in a wider range
            groups = step_per_element(quantize64(tensor, 2, case.granularity, case.group_size))  # its group's max|w|
            zero &= groups == 0  # gets (round(z) - z) s, within half a step (test_error_within_half_step)
        assert bool(torch.isfinite(w_hat).all()), f"{impl.name}: dequantized a zero group to NaN/inf"
        assert bool((w_hat[zero] == 0).all()), f"{impl.name}: zeros dequantize to {w_hat[zero].abs().max().item():.3g}"


BAD_INPUTS = {  # name -> (w, kwargs, argument the message must name)
    "empty 0 x 8 weight": (lambda: torch.randn(0, 8), {"bits": 8, "granularity": "channel"}, "w"),
    "empty 4 x 0 weight": (lambda: torch.randn(4, 0), {"bits": 8, "granularity": "tensor"}, "w"),
    "1-d weight": (lambda: torch.randn(8), {"bits": 8, "granularity": "tensor"}, "w"),
    "integer weight": (lambda: torch.ones(4, 8, dtype=torch.int32), {"bits": 8, "granularity": "tensor"}, "w"),
    "bits 1": (lambda: torch.randn(4, 8), {"bits": 1, "granularity": "channel"}, "bits"),
    "bits 9": (lambda: torch.randn(4, 8), {"bits": 9, "granularity": "channel"}, "bits"),
    "group 3 of 8": (lambda: torch.randn(4, 8), {"bits": 4, "granularity": "group", "group_size": 3}, "group_size"),
    "NaN weight": (lambda: torch.tensor([[1.0, float("nan")]]), {"bits": 8, "granularity": "tensor"}, "w"),
    "unknown granularity": (lambda: torch.randn(4, 8), {"bits": 8, "granularity": "row"}, "granularity"),
}


def test_rejects_bad_input(impl):
    """Bits outside 2..8, a group size that does not divide the columns, NaN weights, an empty, 1-d or integer w,
    and a valid format the implementation does not declare: a ValueError/TypeError naming the argument."""
    dtype = dtype_of("float32" if "float32" in impl.dtypes else impl.dtypes[0])
    for name, (make, kwargs, arg) in sorted({**BAD_INPUTS, **undeclared_formats(impl)}.items()):
        w = make()
        assert_rejected(impl, name, w.to(dtype) if w.is_floating_point() else w, **{"group_size": None, **kwargs},
                        names=(arg,), arg_names=("w",))


def undeclared_formats(impl) -> dict:
    """Valid calls outside the declared formats (a bit width, granularity or group size it does not serve or
    excludes): the implementation must refuse them, naming the argument, rather than answer in another format."""
    caps, cases = impl.caps, {}
    gran = caps.granularities[0]
    size = caps.group_sizes[0] if gran == "group" and caps.group_sizes else (2 if gran == "group" else None)
    cols = 4 * (size or 1)
    for bits in sorted(set(range(2, 9)) - set(caps.bits))[:1]:
        cases[f"undeclared {bits}-bit codes"] = (lambda: torch.randn(4, cols), {
            "bits": bits, "granularity": gran, "group_size": size}, "bits")
    for other in sorted(set(GRANULARITIES) - set(caps.granularities))[:1]:
        cases[f"undeclared granularity {other}"] = (lambda: torch.randn(4, 8), {
            "bits": caps.bits[0], "granularity": other, "group_size": 2 if other == "group" else None}, "granularity")
    if caps.group_sizes is not None and "group" in caps.granularities:
        other = next(g for g in range(2, 1000) if g not in caps.group_sizes)
        cases[f"undeclared group size {other}"] = (lambda: torch.randn(4, 4 * other), {
            "bits": caps.bits[0], "granularity": "group", "group_size": other}, "group_size")
    if caps.excluded_group_sizes and "group" in caps.granularities:
        excluded = caps.excluded_group_sizes[0]
        cases[f"excluded group size {excluded}"] = (lambda: torch.randn(4, 4 * excluded), {
            "bits": caps.bits[0], "granularity": "group", "group_size": excluded}, "group_size")
    return cases
