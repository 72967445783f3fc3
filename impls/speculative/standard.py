"""Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2).

Each round the draft proposes x_1..x_k ~ q autoregressively, the target scores all k + 1 positions in
one call, x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection a token
is drawn from norm(max(0, p_i - q_i)), and when all k are accepted a bonus token from p_{k+1}.
Invariant: every emitted token is distributed as p given the tokens before it, whatever q is.
"""

import torch

from harness.contracts.speculative import Generation, Round, check_inputs, validated
from harness.registry import register


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution of the token that replaces a rejected draft token."""
    r = (p - q).clamp(min=0)
    return r / r.sum()


@register("speculative", "standard", dtypes=("float64",),
          cite="Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2")
def speculative(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    return speculate(target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens, rng=rng, eos=eos)


def speculate(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None, unsure=0.0):
    """The algorithm; drafting stops early after a token the draft drew with probability below ``unsure``."""
    check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
    target, draft = validated(target, "target"), validated(draft, "draft")
    out, rounds = [], []
    while len(out) < max_new_tokens and (not out or out[-1] != eos):
        ctx = [*prompt, *out]
        xs, qs, q_xs = [], [], []  # the drafts x_i, their rows q_i (V,) and q_i(x_i)
        while len(xs) < min(gamma, max_new_tokens - len(out) - 1):  # drafts past the budget could never be emitted
            q = draft([ctx + xs])[0, -1]  # (V,)
            xs.append(int(rng.categorical(q)))
            qs.append(q)
            q_xs.append(float(q[xs[-1]]))
            if q_xs[-1] < unsure:
                break
        k = len(xs)
        p = target([ctx + xs], k + 1)[0]  # (k + 1, V): p_1 .. p_{k+1} in one call
        n = 0  # x_n is accepted with probability min(1, p_n(x_n) / q_n(x_n)), read as two floats
        while n < k and bool(rng.bernoulli(min(1.0, float(p[n, xs[n]]) / q_xs[n]))):
            n += 1
        last = rng.categorical(residual(p[n], qs[n]) if n < k else p[k])  # replacement, or bonus token
        new = [*xs[:n], int(last)]
        if eos in new:
            new = new[: new.index(eos) + 1]
        out += new
        rounds.append(Round(drafted=k, accepted=n, target_calls=1))
    return Generation(out, rounds)
