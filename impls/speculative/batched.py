"""Batched speculative sampling: B sequences share every draft and target call, each with its own
acceptance length (Leviathan et al. 2023, Algorithm 1, one row per sequence).

Per round all unfinished rows draft the same k tokens in B-row calls and are verified in one B-row target
call; row b keeps its first n_b accepted drafts plus one replacement or bonus token.  Invariant: each row
is distributed as the target's autoregressive sampling, independently of the others.
"""

import torch

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, validated
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.speculative.standard import residual


def speculative_batched(target, draft, prompts, *, gamma, max_new_tokens, rng, eos=None) -> list[Generation]:
    for prompt in prompts:
        check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
    target, draft = validated(target, "target"), validated(draft, "draft")
    outs, rounds = [[] for _ in prompts], [[] for _ in prompts]
    while live := [b for b, o in enumerate(outs) if len(o) < max_new_tokens and (not o or o[-1] != eos)]:
        ctxs = [[*prompts[b], *outs[b]] for b in live]
        k = min(gamma, min(max_new_tokens - len(outs[b]) - 1 for b in live))
        xs, qs = [[] for _ in live], []
        for _ in range(k):
            q = draft([c + x for c, x in zip(ctxs, xs, strict=True)])[:, -1]  # (B, V)
            for x, token in zip(xs, rng.categorical(q).tolist(), strict=True):
                x.append(token)
            qs.append(q)
        p = target([c + x for c, x in zip(ctxs, xs, strict=True)], k + 1)  # (B, k + 1, V)
        n = [0] * len(live)
        for i in range(k):
            trying = [j for j in range(len(live)) if n[j] == i]  # rows that accepted every draft so far
            if not trying:
                break
            ratio = torch.stack([p[j, i, xs[j][i]] / qs[i][j, xs[j][i]] for j in trying]).clamp(max=1.0)  # (b,)
            for j, ok in zip(trying, rng.bernoulli(ratio).tolist(), strict=True):
                n[j] += ok
        last = torch.stack([residual(p[j, n[j]], qs[n[j]][j]) if n[j] < k else p[j, k] for j in range(len(live))])
        for j, (b, token) in enumerate(zip(live, rng.categorical(last).tolist(), strict=True)):  # (B, V) -> (B,)
            new = [*xs[j][: n[j]], token]
            outs[b] += new[: new.index(eos) + 1] if eos in new else new
            rounds[b].append(Round(drafted=k, accepted=n[j], target_calls=1))
    return [Generation(o, r) for o, r in zip(outs, rounds, strict=True)]


@register("speculative", "batched", dtypes=("float64",),
          cite="Leviathan et al. 2023, Algorithm 1, batched over sequences")
def batched(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    """The contract's single sequence as a batch of one (tests/test_enumeration.py runs B = 2)."""
    return speculative_batched(target, draft, [prompt], gamma=gamma, max_new_tokens=max_new_tokens, rng=rng,
                               eos=eos)[0]
