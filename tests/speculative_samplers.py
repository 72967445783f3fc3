"""Correct speculative samplers at the edges of the contract (harness/contracts/speculative.py), each with
the verdict its text predicts (tests/test_speculative_verdicts.py checks them; `harness check
speculative --plugin tests/speculative_samplers.py:NAME` gives the same).

* list_sampler: returns a plain list of tokens -- declared with rounds=False, round_records_add_up skips;
  undeclared, round_records_add_up fails naming the capability (the others pass).
* coin_residual: draws every replacement and bonus token as a chain of coins, so each round ends with a
  Bernoulli draw -- round ends are read off the target calls: every property passes.
* coin_residual_spare_draw: the same, each round's last token drawn again from a one-hot row (a categorical
  with one outcome) -- the same verdicts (before round ends were read off the target calls, only this one
  passed).
* kept_drafts: drafts up to max_new_tokens, so the last round may end with a kept draft and no draw after
  its coin -- every property passes.
* exact_no_bonus: never takes the bonus token -- exact, but breaks the bonus rule, which the properties that
  reject it name.
* past_budget: drafts gamma tokens every round, also past max_new_tokens, and cuts the output there -- exact,
  but every draft that can never be emitted multiplies the enumeration by V: the verdict says so at once.
"""

import torch

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated
from llm_inference_harness.impls.speculative.standard import residual, speculative


def list_sampler(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    return speculative(target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens, rng=rng, eos=eos).tokens



def coin_draw(rng, probs) -> int:
    """A token from probs (V,) as a chain of coins: token i with probability probs[i] / (the mass left)."""
    weights = probs.tolist()
    support = [i for i, w in enumerate(weights) if w > 0]
    left = 1.0
    for i in support[:-1]:
        if bool(rng.bernoulli(min(1.0, weights[i] / left))):
            return i
        left -= weights[i]
    return support[-1]


def rounds_of(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None, draw=None, spare=False,
              to_budget=False, bonus=True, past_budget=False):
    """Leviathan et al. 2023, Algorithm 1, with its variations: ``draw(rng, probs)`` draws the replacement and
    bonus tokens, ``spare`` draws each round's last token again from a one-hot row, ``to_budget`` drafts up to
    max_new_tokens (a round that reaches it with its drafts ends with no draw), ``bonus=False`` never takes
    the bonus, ``past_budget`` drafts gamma whatever is left and cuts the output at max_new_tokens."""
    check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
    target, draft = validated(target, "target"), validated(draft, "draft")
    draw = draw or (lambda rng, probs: int(rng.categorical(probs)))
    out, rounds = [], []
    while len(out) < max_new_tokens and (not out or out[-1] != eos):
        ctx = [*prompt, *out]
        left = max_new_tokens - len(out)
        k = gamma if past_budget else min(gamma, left if to_budget or not bonus else left - 1)
        xs, qs = [], []
        for _ in range(k):
            q = draft([ctx + xs])[0, -1]  # (V,)
            xs.append(int(rng.categorical(q)))
            qs.append(q)
        p = target([ctx + xs], k + 1)[0]  # (k + 1, V)
        n = 0
        while n < k and bool(rng.bernoulli(min(1.0, float(p[n, xs[n]]) / float(qs[n][xs[n]])))):
            n += 1
        new = xs[:n]
        if n < k:
            new.append(draw(rng, residual(p[n], qs[n])))
        elif bonus and n < left:
            new.append(draw(rng, p[k]))
        if spare:  # the round's last token drawn again from a one-hot row: one outcome, no probability changed
            rng.categorical(torch.nn.functional.one_hot(torch.tensor(new[-1]), p.shape[-1]).double())
        if eos in new:
            new = new[: new.index(eos) + 1]
        out += new[:left]
        rounds.append(Round(drafted=k, accepted=n, target_calls=1))
    return Generation(out, rounds)


def coin_residual(target, draft, prompt, **kw):
    return rounds_of(target, draft, prompt, draw=coin_draw, **kw)


def coin_residual_spare_draw(target, draft, prompt, **kw):
    return rounds_of(target, draft, prompt, draw=coin_draw, spare=True, **kw)


def kept_drafts(target, draft, prompt, **kw):
    return rounds_of(target, draft, prompt, to_budget=True, **kw)


def exact_no_bonus(target, draft, prompt, **kw):
    return rounds_of(target, draft, prompt, bonus=False, **kw)


def past_budget(target, draft, prompt, **kw):
    return rounds_of(target, draft, prompt, past_budget=True, **kw)
