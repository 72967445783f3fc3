"""Laws of the exact enumerator (harness/sampling/enumeration.py) and of the randomness protocol
(harness/sampling/lm.py).

The enumerator is the judge of every exactness property, so it is tested on its own: against hand-computed
distributions, merged rounds against run-by-run enumeration, and on the batched sampler's joint output.
"""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY
from llm_inference_harness.impls.speculative.batched import speculative_batched
from llm_inference_harness.impls.speculative.standard import SpeculativeSampling, speculative
from llm_inference_harness.references.speculative import autoregressive_distribution
from llm_inference_harness.sampling.enumeration import (
    ReplayRng,
    exact_distribution,
    explore,
    first_round,
    max_difference,
)
from llm_inference_harness.sampling.lm import Counted, TableLM, Tempered, TorchRng
from llm_inference_harness.strategies.speculative import probability_table, speculative_cases


@given(seed=st.integers(0, 2**31 - 1), V=st.integers(2, 5))
def test_explore_visits_every_branch_once_with_its_probability(seed, V):
    """Two categorical draws and a Bernoulli: every branch once, P = p(x) q_x(y) b(x, y)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(V, generator=g, dtype=torch.float64)
    p[0] = 0.0  # a zero-probability branch must never be visited
    p /= p.sum()
    q = torch.rand(V, V, generator=g, dtype=torch.float64)
    q /= q.sum(-1, keepdim=True)
    b = torch.rand(V, V, generator=g, dtype=torch.float64)

    def run(rng):
        x = int(rng.categorical(p))
        y = int(rng.categorical(q[x]))
        return x, y, bool(rng.bernoulli(b[x, y]))

    seen = list(explore(run))
    outcomes = [o for o, _ in seen]
    assert len(outcomes) == len(set(outcomes)) == (V - 1) * V * 2, "a branch was visited twice or missed"
    for (x, y, z), prob in seen:
        expected = p[x] * q[x, y] * (b[x, y] if z else 1 - b[x, y])
        assert abs(prob - float(expected)) <= FLOAT64_IDENTITY
    assert abs(sum(prob for _, prob in seen) - 1) <= FLOAT64_IDENTITY


@given(case=speculative_cases(max_T=3))
def test_merged_rounds_equal_run_by_run_enumeration(case):
    """Cutting runs at round boundaries and memoizing the rest changes nothing (standard sampler)."""
    target, draft = case.models()
    kw = dict(gamma=case.gamma, T=case.T, eos=case.eos)
    merged = exact_distribution(speculative, target, draft, list(case.prompt), merge=True, **kw)
    whole = exact_distribution(speculative, target, draft, list(case.prompt), merge=False, **kw)
    err, where = max_difference(merged.dist, whole.dist)
    assert err <= FLOAT64_IDENTITY, f"merged and run-by-run enumerations differ at {where} by {err:.3g}"
    assert merged.mass_error <= FLOAT64_IDENTITY and whole.mass_error <= FLOAT64_IDENTITY


class CatchingUp:
    """The target as a sampler with a cached draft sees it: after each verify call the draft catches up on
    the drafted tokens, before the round's last draw."""

    def __init__(self, target, draft) -> None:
        self.target, self.draft, self.vocab_size = target, draft, target.vocab_size

    def __call__(self, prefixes, n=1):
        rows = self.target(prefixes, n)
        self.draft(prefixes)  # its rows are not used: a cache warm-up
        return rows


def catching_up(target, draft, prompt, **kw):
    return speculative(CatchingUp(target, draft), draft, prompt, **kw)


@given(case=speculative_cases(max_T=3))
def test_catch_up_calls_are_part_of_their_round(case):
    """A sampler calling its draft between the verify call and the round's last draw, undeclared: its rounds
    end where the next target call says (merged equals run by run), and the first round makes one target call."""
    target, draft = case.models()
    kw = dict(gamma=case.gamma, T=case.T, eos=case.eos)
    whole = exact_distribution(catching_up, target, draft, list(case.prompt), merge=False, **kw).dist
    merged = exact_distribution(catching_up, target, draft, list(case.prompt), **kw)
    err, where = max_difference(merged.dist, whole)
    assert err <= FLOAT64_IDENTITY, f"merged and run-by-run differ at {where} by {err:.3g}"
    rounds = first_round(catching_up, target, draft, list(case.prompt), gamma=case.gamma, budget=case.gamma + 1,
                         eos=case.eos)
    assert {calls for (_, calls), prob in rounds.items() if prob > 0} == {1}, f"first round: {rounds}"


@given(case=speculative_cases(max_gamma=2, max_T=2), other=st.lists(st.integers(0, 1), min_size=1, max_size=2))
def test_batched_rows_are_independent_and_exact(case, other):
    """Two sequences with different prompts in one batch: the joint output is the product of the targets'."""
    target, draft = case.models()
    prompts = [list(case.prompt), other]

    def run(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
        outs = speculative_batched(target, draft, prompts, gamma=gamma, max_new_tokens=max_new_tokens, rng=rng,
                                   eos=eos)
        return [a * target.vocab_size + b for a, b in itertools.zip_longest(
            outs[0].tokens, outs[1].tokens, fillvalue=target.vocab_size)]  # one id per pair, readable by the check

    V = case.V
    wide = TableLM(torch.zeros(V * (V + 1)))  # only its vocabulary size is read by the output check
    got = exact_distribution(lambda t, d, p, **kw: run(target, draft, p, **kw), wide, None, prompts[0],
                             gamma=case.gamma, T=case.T, eos=case.eos, merge=False).dist
    first = autoregressive_distribution(target, prompts[0], case.T, case.eos)
    second = autoregressive_distribution(target, prompts[1], case.T, case.eos)
    for (a, pa), (b, pb) in itertools.product(first.items(), second.items()):
        key = tuple(x * V + y for x, y in itertools.zip_longest(a, b, fillvalue=V))
        assert abs(got.get(key, 0.0) - pa * pb) <= FLOAT64_IDENTITY, f"P(row 0 = {a}, row 1 = {b}) is wrong"
    assert abs(sum(got.values()) - 1) <= FLOAT64_IDENTITY


@given(seed=st.integers(0, 2**31 - 1), positions=st.sampled_from(["rotary", "learned"]), head=st.integers(1, 4),
       data=st.data())
def test_siblings_are_scored_as_by_the_full_forward(seed, positions, head, data):
    """Prefixes that differ in their last token only (the enumerator's batched misses) run their shared head
    once and one cached position each: every row n back is the full forward's (a float64 model)."""
    from llm_inference_harness.models.gpt import GPT, GPTConfig
    from llm_inference_harness.sampling.lm import GPTLM, shared_head

    torch.manual_seed(seed % 1000)
    model = GPT(GPTConfig(vocab_size=7, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=8,
                          positions=positions)).double().eval()
    first = data.draw(st.lists(st.integers(0, 6), min_size=head, max_size=head), label="head")
    lasts = data.draw(st.lists(st.integers(0, 6), min_size=2, max_size=7), label="last tokens")
    n = data.draw(st.integers(1, head + 1), label="n")
    prefixes = [[*first, t] for t in lasts]
    assert shared_head(prefixes, n) == tuple(first), "siblings not recognized: the full forward ran"
    with torch.no_grad():
        full = torch.softmax(model(torch.tensor(prefixes))[:, head + 1 - n :].double(), dim=-1)  # (B, n, V)
    got = GPTLM(model)(prefixes, n)
    assert got.shape == full.shape and (got - full).abs().max() <= FLOAT64_IDENTITY
    assert shared_head([*prefixes, [*first, 0, 0]], 1) is None, "prefixes of other lengths are no siblings"


@pytest.mark.parametrize("rng", [TorchRng(0), ReplayRng([])], ids=["torch", "replay"])
def test_rng_rejects_bad_probabilities(rng):
    for bad in ([0.5, 0.6], [-0.5, 1.5], [float("nan"), 1.0]):
        with pytest.raises(ValueError, match="rng.categorical"):
            rng.categorical(torch.tensor(bad, dtype=torch.float64))
    with pytest.raises(ValueError, match="rng.bernoulli"):
        rng.bernoulli(torch.tensor(1.5, dtype=torch.float64))


@given(case=speculative_cases(max_T=3), temperature=st.sampled_from([0.5, 1.0, 2.0]))
def test_temperature_is_applied_before_the_sampler(case, temperature):
    """Sampling from Tempered models gives the tempered target's distribution; each distinct prefix reaches
    the models once (the memo), and Counted sees exactly those calls."""
    target, draft = case.models()
    hot_target, hot_draft = Counted(Tempered(target, temperature)), Counted(Tempered(draft, temperature))
    got = exact_distribution(speculative, hot_target, hot_draft, list(case.prompt), gamma=case.gamma, T=case.T,
                             eos=case.eos)
    truth = autoregressive_distribution(Tempered(target, temperature), case.prompt, case.T, case.eos)
    assert max_difference(got.dist, truth)[0] <= FLOAT64_IDENTITY
    assert hot_target.calls + hot_draft.calls == got.model_calls, "memoized calls miscounted"


@settings(max_examples=10)  # each example is a test at false-alarm rate 1e-3: ten keep `thorough` quiet
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(2, 8), zeros=st.sampled_from([0.0, 0.3, 0.6]))
def test_torch_rng_draws_follow_the_probabilities(seed, V, zeros):
    """TorchRng's one-row draws (inversion in numpy) pass a chi-square test against the probabilities at
    the statistical tier's power, and never draw a token of probability 0."""
    from llm_inference_harness.sampling.statistical import goodness_of_fit, sample_size
    from llm_inference_harness.strategies.speculative import probability_table

    p = probability_table(V, 0, zeros, torch.Generator().manual_seed(seed))  # (V,), with zeros
    exact = {i: float(x) for i, x in enumerate(p) if x > 0}
    rng = TorchRng(seed)
    fit = goodness_of_fit([int(rng.categorical(p)) for _ in range(sample_size(len(exact)))], exact)
    assert not fit.rejected, f"TorchRng({seed}).categorical({p.tolist()}): {fit.describe()}"


def overdraft(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    """Drafts gamma tokens whatever the budget (the tokens past it are cut off): exact, slow to enumerate."""
    tokens = speculative(target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens + gamma, rng=rng,
                         eos=eos).tokens
    return tokens[:max_new_tokens]


def test_a_slow_enumeration_says_where_its_time_went(monkeypatch, capsys):
    """Past NOTE_AFTER_S a note on stderr splits the time (sampler, models, enumerator) and names drafts past the
    budget; past the deadline the same text stops the enumeration as EnumerationTooSlow."""
    import llm_inference_harness.sampling.enumeration as enumeration

    target, draft = (TableLM(probability_table(4, 1, 0.0, torch.Generator().manual_seed(s))) for s in (0, 1))
    monkeypatch.setattr(enumeration, "NOTE_AFTER_S", 0.0)
    with pytest.raises(enumeration.EnumerationTooSlow, match="stopped at its deadline") as raised:
        exact_distribution(overdraft, target, draft, [0], gamma=3, T=2, workers=1, deadline_s=0.0,
                           budget_rule=False)
    for says in ("the sampler's own code", "model calls", "the enumerator", "a round drafted 3 token(s) with",
                 "draft at most max_new_tokens - len(out) - 1"):
        assert says in str(raised.value), f"{says!r} missing from: {raised.value}"
    assert "enumeration note: overdraft" in capsys.readouterr().err


def test_drafting_past_the_budget_stops_at_once_naming_the_rule():
    """A round that verifies more drafts than it may emit breaks the contract's budget rule: the enumeration
    stops at that round's target call (its first run), not at a deadline; drafting exactly up to the budget
    is allowed."""
    from llm_inference_harness.sampling.enumeration import DraftsPastBudget

    target, draft = (TableLM(probability_table(4, 1, 0.0, torch.Generator().manual_seed(s))) for s in (0, 1))
    with pytest.raises(DraftsPastBudget, match="budget rule: a round drafted 3 token.s. with 1 left") as raised:
        exact_distribution(overdraft, target, draft, [0], gamma=3, T=2, workers=1)
    assert "min(gamma, max_new_tokens - len(out) - 1)" in str(raised.value)
    to_budget = exact_distribution(overdraft, target, draft, [0], gamma=1, T=2, workers=1)  # k = min(1, budget)
    err, where = max_difference(to_budget.dist, autoregressive_distribution(target, [0], 2))
    assert err <= FLOAT64_IDENTITY, f"drafts up to the budget: P{where} off by {err:.3g}"


class LaterRoundsOverdraft(SpeculativeSampling):
    """Keeps the budget rule in a run's first round and drafts gamma in the later ones (state carried between rounds:
    restarted after round one, as merged enumeration and the budget probe restart it, it never overdrafts)."""

    def __call__(self, target, draft, prompt, *, max_new_tokens, **kwargs):
        self.first = max_new_tokens
        return super().__call__(target, draft, prompt, max_new_tokens=max_new_tokens, **kwargs)

    def budget(self, gamma, left):
        return min(gamma, left - 1) if left == self.first else gamma


def test_every_rounds_drafts_are_checked_against_the_tokens_left():
    """Run by run (merge=False, what a sampler that declares markov=False gets), a round after the first that verifies
    more drafts than the tokens left stops the enumeration naming the budget rule (it used to be played out:
    exact, V times the branches per draft past the budget); a sampler that drafts exactly up to the tokens left in
    every round (tests/speculative_samplers.py kept_drafts) is exact and allowed."""
    from llm_inference_harness.sampling.enumeration import DraftsPastBudget
    from tests.speculative_samplers import kept_drafts

    target, draft = (TableLM(probability_table(4, 1, 0.0, torch.Generator().manual_seed(s))) for s in (0, 1))
    with pytest.raises(DraftsPastBudget, match="budget rule: a round drafted 2 token.s. with 1 left"):
        exact_distribution(LaterRoundsOverdraft(), target, draft, [0], gamma=2, T=3, workers=1, merge=False)
    reference = autoregressive_distribution(target, [0], 3)
    for sampler, rule in ((LaterRoundsOverdraft(), False), (kept_drafts, True)):
        got = exact_distribution(sampler, target, draft, [0], gamma=2, T=3, workers=1, merge=False, budget_rule=rule)
        err, where = max_difference(got.dist, reference)
        assert err <= FLOAT64_IDENTITY, f"{sampler}: P{where} off by {err:.3g}"


@pytest.mark.parametrize("caller_froze", [False, True])
def test_an_enumeration_leaves_the_heap_as_it_found_it(caller_froze):
    """The enumerator keeps the objects that existed before it out of full collections while it runs (`heap_frozen`):
    the runs see the heap frozen; afterwards the caller's process is as it was, a freeze of its own included."""
    import gc

    target, draft = (TableLM(probability_table(4, 1, 0.0, torch.Generator().manual_seed(s))) for s in (0, 1))
    counts = []

    def counting(*args, **kwargs):
        counts.append(gc.get_freeze_count())
        return speculative(*args, **kwargs)

    if caller_froze:
        gc.freeze()
    before = gc.get_freeze_count()
    try:
        exact_distribution(counting, target, draft, [0], gamma=2, T=2, workers=1)
        after = gc.get_freeze_count()
    finally:
        if caller_froze:
            gc.unfreeze()
    assert counts and min(counts) > 0, f"a run saw the heap unfrozen (freeze counts {counts[:8]})"
    assert after == before, f"the freeze count was {before} before the enumeration and {after} after"
