"""Properties of logits processing and samplers (contract: harness/contracts/sampling.py).

The central one: what an implementation makes of each row -- its processed distribution, or a sampler's output
distribution computed exactly by visiting every branch of its draws (harness/sampling/enumeration.py) -- equals the
float64 reference (harness/references/sampling.py) in the order and tie rule it declares, within the earned
bound of its dtype, where a token whose keep-or-drop comparison sits within rounding of its threshold may go
either way (`threshold_slack`).  The drawn cases count what they reach with `hypothesis.event` (`pytest
--hypothesis-show-statistics`).  Samplers that draw from their own generator (caps rng="own") cannot be
enumerated: the exact properties skip them, saying so, and a chi-square test with a stated power judges them,
and every other sampler, on a vocabulary of 256 too large to enumerate.
"""

import itertools

import torch
from hypothesis import event, given
from hypothesis import strategies as st

from llm_inference_harness.contracts.sampling import (
    OFF,
    call,
    distribution_of,
    enumerated,
    sampling_params,
)
from llm_inference_harness.engine.capabilities import applies
from llm_inference_harness.engine.guard import assert_rejected
from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY, assert_earned, earned_bound
from llm_inference_harness.references.sampling import distribution, kept, penalized, plain, processed, threshold_slack
from llm_inference_harness.sampling.lm import TorchRng
from llm_inference_harness.sampling.statistical import DELTA, POWER, goodness_of_fit, sample_size
from llm_inference_harness.strategies.sampling import (
    companion_cases,
    parameter_grid,
    sampling_cases,
    without_repetition_penalty,
)

TECHNIQUE = "sampling"


def own_rng(impl):
    return "draws from its own generator (caps rng='own'): not enumerable, judged by statistical_fit_large_vocabulary" \
        if impl.caps.rng == "own" else None


def processor(impl):
    return "returns its distribution (caps returns='probs'): compared exactly, nothing is sampled" \
        if impl.caps.returns == "probs" else None


def cases(impl, **kwargs):
    dtypes = tuple(d for d in impl.dtypes if d in ("float32", "float64"))
    return sampling_cases(dtypes, supported=impl.caps.params, max_vocab=impl.caps.max_vocab, **kwargs)


def enumeration_rounding(impl) -> float:
    """A sampler's enumerated probabilities are sums of products of float64 draw weights: FLOAT64_IDENTITY more."""
    return 0.0 if impl.caps.returns == "probs" else FLOAT64_IDENTITY


def assert_matches_reference(impl, logits, params, got, what: str) -> None:
    """``got`` (B, V) is the reference's distribution over a kept set the contract allows: every token it must keep
    and none it must drop, the values within the earned bound of the logits' dtype."""
    dtype = logits.dtype
    order, ties = impl.caps.order, impl.caps.ties
    slack = threshold_slack(logits, params, dtype)
    must, may = (kept(logits, params, order=order, ties=ties, slack=s) for s in (-slack, slack))
    extra = (got > 0) & ~may
    if extra.any():
        b, j = (int(i) for i in extra.nonzero()[0])
        raise AssertionError(f"{what}: row {b} gives token {j} probability {float(got[b, j]):.6g}, but the contract "
                             f"({order} order, ties {ties!r}) drops it; the reference keeps "
                             f"{may[b].nonzero().flatten().tolist()}")
    keep = ((got > 0) | must) & may
    assert_earned(got, distribution(logits, params, keep), plain(logits, params, keep, dtype), dtype, what=what,
                  conditioning=enumeration_rounding(impl))


def note_situations(logits, params, order: str) -> None:
    """Count what a case reaches (`pytest --hypothesis-show-statistics` prints the share of each)."""
    z = penalized(logits, params)
    for b in range(len(params.temperature)):
        row = z[b][z[b] > -torch.inf]
        if params.temperature[b] == 0:
            event("a greedy row" + (" beside a sampled row" if any(params.temperature) else ""))
        elif 0 < params.top_k[b] < len(row) and int((row == row.sort(descending=True).values[params.top_k[b] - 1])
                                                   .sum()) > 1:
            event("tokens tied at the top-k boundary")
        if len(row) < z.shape[1]:
            event("a -inf token")
        seen = set(params.prompt_tokens[b]) | set(params.output_tokens[b])
        if params.repetition_penalty[b] != 1 and any(float(logits[b, t]) < 0 for t in seen):
            event("a repetition penalty on a negative logit")
    filtered = kept(logits, params, order=order, ties="keep").sum(-1) < (z > -torch.inf).sum(-1)
    if bool(filtered.any()):
        event("a filter drops a token")


@applies(own_rng)
@given(data=st.data())
def test_distribution_matches_reference(impl, data):
    """Each row's distribution (a sampler's, enumerated exactly) is the reference's in the declared order and tie
    rule, within the earned bound."""
    case = data.draw(cases(impl), label="case")
    logits = case.logits()
    note_situations(logits, case.params, impl.caps.order)
    got = distribution_of(impl, logits, case.params)
    assert_matches_reference(impl, logits, case.params, got, f"{impl.name} on {case.B} rows of V={case.V}")


@applies(own_rng)
@given(data=st.data())
def test_greedy_rows_take_the_first_argmax(impl, data):
    """A temperature-0 row -- every other row of the batch, beside rows that sample -- is one-hot at its largest
    penalized logit, ties to the lowest id."""
    case = data.draw(cases(impl, greedy=True), label="case")
    logits = case.logits()
    got = distribution_of(impl, logits, case.params)
    greedy = [b for b in range(case.B) if case.params.temperature[b] == 0]
    want = penalized(logits, case.params)[greedy].argmax(-1)
    for b, token in zip(greedy, want.tolist(), strict=True):
        assert float(got[b, token]) >= 1 - enumeration_rounding(impl), (
            f"{impl.name}: greedy row {b} of {case.B} gives its first argmax (token {token}) probability "
            f"{float(got[b, token])!r}, not 1")


@applies(own_rng)
@given(data=st.data())
def test_shift_invariance(impl, data):
    """Adding a constant to every logit of a row leaves its distribution unchanged (the repetition penalty off:
    it is the one transform that reads a logit's sign)."""
    case = without_repetition_penalty(data.draw(cases(impl, shift=True), label="case"))
    logits = case.logits()
    got = distribution_of(impl, logits, case.params)
    assert_matches_reference(impl, logits, case.params, got, f"{impl.name} with every logit shifted by {case.shift}")


@applies(own_rng)
@given(data=st.data())
def test_rows_are_independent(impl, data):
    """A row's distribution is the same alone as beside a companion row whose parameters are all at an extreme
    (none of its parameters, history or maxima reaches the other row), and a sampler's two rows draw
    independently: P(t_0, t_1) = P_0(t_0) P_1(t_1)."""
    dtypes = tuple(d for d in impl.dtypes if d in ("float32", "float64"))
    case = data.draw(companion_cases(dtypes, impl.caps.params, impl.caps.max_vocab), label="case")
    logits = case.logits()
    joint = enumerated(impl, logits, case.params) if impl.caps.returns == "tokens" else None
    batch = joint.marginals if joint else distribution_of(impl, logits, case.params)
    for b in range(case.B):
        row = case.rows([b])
        alone = distribution_of(impl, row.logits(), row.params)
        truth = processed(row.logits(), row.params, order=impl.caps.order, ties=impl.caps.ties)
        bound = 2 * earned_bound(truth, plain(row.logits(), row.params, truth > 0, logits.dtype), logits.dtype) + \
            enumeration_rounding(impl)
        err = float((alone[0] - batch[b]).abs().max())
        assert err <= bound, (f"{impl.name}: row {b} of {case.B} differs from the same row alone by {err:.3g} "
                              f"(> {bound:.3g}): in the batch {batch[b].tolist()}, alone {alone[0].tolist()}")
    for tokens in itertools.product(*(row.nonzero().flatten().tolist() for row in batch)) if joint else ():
        independent = float(torch.prod(batch[torch.arange(case.B), torch.tensor(tokens)]))
        assert abs(joint.joint.get(tokens, 0.0) - independent) <= FLOAT64_IDENTITY, (
            f"{impl.name}: P{tokens} = {joint.joint.get(tokens, 0.0)!r} but the rows' own distributions give "
            f"{independent!r}: the rows' draws are not independent")


@applies(own_rng)
def test_parameter_grid_exactly(impl):
    """Every point of GRID at V = 8 (192), a sampler's output distribution enumerated exactly point by point, is
    the reference's."""
    dtype = torch.float64 if "float64" in impl.dtypes else torch.float32
    logits, params = parameter_grid(impl.caps.params)
    logits = logits.to(dtype)
    if impl.caps.returns == "probs":
        got = distribution_of(impl, logits, params)
    else:
        got = torch.cat([enumerated(impl, logits[b : b + 1], params.select([b])).marginals
                         for b in range(len(logits))])
    assert_matches_reference(impl, logits, params, got, f"{impl.name} on the V = 8 grid")


@applies(processor)
def test_statistical_fit_large_vocabulary(impl):
    """Chi-square of one token from each of n identical rows (V = 256) against the reference: detects a
    total-variation distance of DELTA with probability >= POWER (llm_inference_harness.sampling.statistical); the
    tokens the reference gives fewer than 5 expected draws are pooled into one cell.  Two rows: every filter and
    penalty at work on distinct logits; and eight tokens tied at the top, cut by top-k = 3, where the declared tie
    rule decides which are kept (torch's CPU sort keeps ties in index order below 17 elements even unstable, so the
    exact laws' small vocabularies cannot show a sort that loses it)."""
    V = min(256, impl.caps.max_vocab or 256)
    g = torch.Generator().manual_seed(11)
    row = torch.randn(1, V, generator=g) * 3  # (1, V)
    history = {"prompt_tokens": [tuple(range(0, 40, 3))], "output_tokens": [(1, 1, 5, 9)]}
    _fits(impl, row, {"temperature": 0.8, "top_k": 12, "top_p": 0.9, "min_p": 0.02, "repetition_penalty": 1.3,
                      "presence_penalty": 0.5, "frequency_penalty": 0.25}, history, "distinct logits")
    tied = row.clone()
    tied[0, torch.randperm(V, generator=g)[:8]] = row.max() + 1  # eight tokens tied at the top, scattered ids
    _fits(impl, tied, {"temperature": 1.0, "top_k": 3}, {"prompt_tokens": [()], "output_tokens": [()]},
          "eight tokens tied at the top, top_k = 3")


def _fits(impl, row: torch.Tensor, values: dict, history: dict, what: str) -> None:
    values = {k: values.get(k, OFF[k]) if k in impl.caps.params else OFF[k] for k in OFF}
    exact = processed(row.double(), sampling_params(1, **values, **history), order=impl.caps.order,
                      ties=impl.caps.ties)[0]
    cells = {t: p for t, p in enumerate(exact.tolist()) if p > 0}
    n = sample_size(len(cells))
    rare = {t for t, p in cells.items() if p * n < 5}
    binned = {t: p for t, p in cells.items() if t not in rare} | ({"rare": sum(cells[t] for t in rare)} if rare else {})
    n = sample_size(len(binned))
    params = sampling_params(n, **values, prompt_tokens=history["prompt_tokens"] * n,
                             output_tokens=history["output_tokens"] * n)
    V = row.shape[1]
    tokens = call(impl, row.expand(n, V).contiguous(), params, 12345 if impl.caps.rng == "own" else TorchRng(12345))
    fit = goodness_of_fit(["rare" if t in rare else t for t in tokens.tolist()], binned)
    assert not fit.rejected, (f"{impl.name} ({what}): statistical verdict -- its tokens do not follow the processed "
                              f"distribution: {fit.describe()}; this test detects TV {DELTA} with power {POWER}")


GOOD = [[1.0, 2.0, 0.5]]
BAD = {  # name -> (logits, parameter overrides, the argument or field the message must name)
    "top_p 0": (GOOD, {"top_p": 0.0}, "top_p"),
    "top_p above 1": (GOOD, {"top_p": 1.5}, "top_p"),
    "negative temperature": (GOOD, {"temperature": -0.5}, "temperature"),
    "top_k above V": (GOOD, {"top_k": 4}, "top_k"),
    "negative top_k": (GOOD, {"top_k": -1}, "top_k"),
    "min_p above 1": (GOOD, {"min_p": 1.5}, "min_p"),
    "repetition penalty 0": (GOOD, {"repetition_penalty": 0.0}, "repetition_penalty"),
    "history id past V": (GOOD, {"output_tokens": [(3,)]}, "output_tokens"),
    "NaN logit": ([[1.0, float("nan"), 0.5]], {}, "logits"),
    "a row of -inf": ([[-torch.inf] * 3], {}, "logits"),
    "one row of parameters for two rows of logits": (GOOD * 2, {"rows": 1}, "params"),
}


def test_rejects_bad_input(impl):
    """Bad parameters and logits raise ValueError/TypeError naming the argument or field."""
    kwargs = {} if impl.caps.returns == "probs" else {"rng": 0 if impl.caps.rng == "own" else TorchRng(0)}
    for name, (rows, overrides, field) in BAD.items():
        overrides = dict(overrides)
        params = sampling_params(overrides.pop("rows", len(rows)), **overrides)
        assert_rejected(impl, name, torch.tensor(rows), params, names=(field,), **kwargs)


def test_empty_batch(impl):
    """A batch of no rows is an answer: (0,) tokens or (0, V) probabilities."""
    rng = 0 if impl.caps.rng == "own" else TorchRng(0)
    call(impl, torch.zeros(0, 5), sampling_params(0), rng)
