"""transformers' speculative accept/reject step, `transformers.generation.utils._speculative_sampling`, in a
drafting loop like its assisted decoding's, with its random draws routed through the harness's rng.

Each round the draft proposes k = min(gamma, tokens left - 1) tokens (x_i ~ q, drawn by the harness's rng),
the target scores k + 1 positions, and `_speculative_sampling` gets the candidates, log q and log p as
logits.  It draws r = torch.rand_like(p_i / q_i) and accepts the leading r_i <= p_i / q_i, then samples
the replacement or bonus token with torch.multinomial.  Inside the call only, torch.rand_like returns for
each i the event itself -- 0 (accept) with probability min(1, p_i / q_i), drawn as rng.bernoulli, else inf
(reject), none after the first rejection, which the routine ignores -- and torch.multinomial is
rng.categorical: the same distribution, so the enumeration's verdict is exact.  With k = 0 the last token
is drawn from p, as assisted decoding does when its assistant proposes nothing.
Leviathan et al. 2023, Algorithm 1; transformers, generation/utils.py.
"""

import contextlib
import math

import torch

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.external.common import FIRST_CALL_IMPORTS_S, Library

TRANSFORMERS = Library("transformers", "transformers")


@contextlib.contextmanager
def draws_through(rng):
    """torch.rand_like and torch.multinomial answered by ``rng`` while the routine runs, restored after."""
    rand_like, multinomial = torch.rand_like, torch.multinomial

    def accept_events(ratio, **_):  # ratio (gamma,) = p_i / q_i: r_i = 0 accepts, inf rejects
        r = torch.full_like(ratio, math.inf)
        for i, a in enumerate(ratio.tolist()):
            if not bool(rng.bernoulli(min(1.0, a))):
                break
            r[i] = 0.0
        return r

    def categorical(probs, num_samples=1, **_):  # probs (1, V) -> (1, 1)
        if num_samples != 1:
            raise NotImplementedError(f"the enumerated torch.multinomial draws one sample per row, not {num_samples}")
        return rng.categorical(probs[0]).reshape(1, 1)

    torch.rand_like, torch.multinomial = accept_events, categorical
    try:
        yield
    finally:
        torch.rand_like, torch.multinomial = rand_like, multinomial


@register("speculative", "transformers_speculative_sampling", dtypes=("float64",),
          unavailable=TRANSFORMERS.unavailable, caps={"call_limit_s": FIRST_CALL_IMPORTS_S},
          cite="transformers generation/utils.py _speculative_sampling (Leviathan et al. 2023, Algorithm 1)")
def transformers_speculative_sampling(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
    utils = TRANSFORMERS.load("transformers.generation.utils")
    target, draft = validated(target, "target"), validated(draft, "draft")
    out, rounds = [], []
    while len(out) < max_new_tokens and (not out or out[-1] != eos):
        ctx = [*prompt, *out]
        xs, qs = [], []
        for _ in range(min(gamma, max_new_tokens - len(out) - 1)):
            qs.append(draft([ctx + xs])[0, -1])  # (V,)
            xs.append(int(rng.categorical(qs[-1])))
        k = len(xs)
        p = target([ctx + xs], k + 1)[0]  # (k + 1, V)
        if k == 0:
            new, n = [int(rng.categorical(p[0]))], 0
        else:
            ids = torch.tensor([ctx + xs])  # (1, len(ctx) + k)
            with draws_through(rng):
                tokens, n = utils._speculative_sampling(ids, torch.stack(qs).log()[None], k, p.log()[None])
            new, n = tokens[0].tolist(), int(n)
        if eos in new:
            new = new[: new.index(eos) + 1]
        out += new
        rounds.append(Round(drafted=k, accepted=n, target_calls=1))
    return Generation(out, rounds)
