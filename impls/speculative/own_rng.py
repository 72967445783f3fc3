"""Speculative sampling drawing from torch's global RNG instead of an `Rng` (Leviathan et al. 2023,
Algorithm 1).  It cannot be enumerated, so it declares caps={"rng": "own"}: the exact properties skip it
and the goodness-of-fit property checks its samples against the target's exact distribution.
"""

import torch

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.speculative.standard import residual


@register("speculative", "own_rng", dtypes=("float64",),
          cite="Leviathan et al. 2023, Algorithm 1", caps={"rng": "own"})
def own_rng(target, draft, prompt, *, gamma, max_new_tokens, rng=None, eos=None):
    check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
    target, draft = validated(target, "target"), validated(draft, "draft")
    out, rounds = [], []
    while len(out) < max_new_tokens and (not out or out[-1] != eos):
        ctx = [*prompt, *out]
        k = min(gamma, max_new_tokens - len(out) - 1)
        xs, qs = [], []
        for _ in range(k):
            q = draft([ctx + xs])[0, -1]  # (V,)
            xs.append(int(torch.multinomial(q, 1)))
            qs.append(q)
        p = target([ctx + xs], k + 1)[0]  # (k + 1, V)
        n = 0
        while n < k and torch.rand(()).item() < min(1.0, (p[n, xs[n]] / qs[n][xs[n]]).item()):
            n += 1
        new = [*xs[:n], int(torch.multinomial(residual(p[n], qs[n]) if n < k else p[k], 1))]
        if eos in new:
            new = new[: new.index(eos) + 1]
        out += new
        rounds.append(Round(drafted=k, accepted=n, target_calls=1))
    return Generation(out, rounds)
