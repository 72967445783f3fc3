"""A complete speculative sampler written against the contract (harness/contracts/speculative.py), as a plugin.

    harness check speculative --plugin docs/examples/speculative_sampler.py:speculative_sampler

Leviathan et al. 2023, Algorithm 1: each round the draft proposes x_1..x_k ~ q, the target scores the k + 1
positions in one call, x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)); the first rejected one is
replaced by a draw from norm(max(0, p_i - q_i)), and when all k are kept a bonus token comes from p_{k+1}.
Invariant: every emitted token is distributed as the target's p given the tokens before it.
"""

from llm_inference_harness import declare
from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated


@declare(dtypes=("float64",), cite="Leviathan et al. 2023, Algorithm 1")
def speculative_sampler(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)  # ValueError naming the argument
    target, draft = validated(target, "target"), validated(draft, "draft")  # every row checked once
    out, rounds = [], []  # out: the tokens emitted so far (prompt is never modified)
    while len(out) < max_new_tokens and (not out or out[-1] != eos):
        ctx = prompt + out  # a new list: a round starts with a call on prompt + out
        k = min(gamma, max_new_tokens - len(out) - 1)  # never draft past what can be emitted
        xs, qs = [], []
        for _ in range(k):
            q = draft([ctx + xs])[0, -1]  # (V,): the draft's next-token distribution
            xs.append(int(rng.categorical(q)))
            qs.append(q)
        p = target([ctx + xs], k + 1)[0]  # (k + 1, V): p_1 .. p_{k+1} in one call
        n = 0  # x_n is kept with probability min(1, p_n(x_n) / q_n(x_n))
        while n < k and bool(rng.bernoulli(min(1.0, float(p[n, xs[n]]) / float(qs[n][xs[n]])))):
            n += 1
        if n < k:
            r = (p[n] - qs[n]).clamp(min=0)  # (V,): the residual, where p exceeds q
            last = int(rng.categorical(r / r.sum()))
        else:
            last = int(rng.categorical(p[k]))  # the bonus token (the contract's bonus rule)
        new = [*xs[:n], last]
        if eos in new:
            new = new[: new.index(eos) + 1]  # the output ends at eos, which it includes
        out += new
        rounds.append(Round(drafted=k, accepted=n, target_calls=1))
    return Generation(out, rounds)
