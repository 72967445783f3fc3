"""Speculative sampling with KV caches kept across rounds (Leviathan et al. 2023, Algorithm 1).

The target and the draft each keep one session (`llm_inference_harness.sampling.lm.session`: a KV cache for real
models). Verifying k draft tokens is one cached target step over the tokens it has not seen (the last emitted
token and the k drafts); rejected positions are rolled back by truncating the caches, never recomputed.
Drafting stops at a drafted end token (k < gamma): what would follow it is never emitted.
Invariant: the same accept/resample rule as `standard`, so the output distribution is the target's.
"""

import torch

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, checked_rows
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.speculative.standard import residual
from llm_inference_harness.sampling.lm import session


@register("speculative", "cached", dtypes=("float64",),
          cite="Leviathan et al. 2023, Algorithm 1, with KV caches rolled back")
def cached(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None):
    check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
    ts, ds, V = session(target), session(draft), target.vocab_size
    out, rounds = [], []
    while len(out) < max_new_tokens and (not out or out[-1] != eos):
        ctx = [*prompt, *out]
        k = min(gamma, max_new_tokens - len(out) - 1)
        xs, qs = [], []
        if k:
            q = checked_rows(ds.extend(ctx[ds.length :])[-1], "draft", V)  # (V,)
        for i in range(k):
            xs.append(int(rng.categorical(q)))
            qs.append(q)
            if i == k - 1 or xs[-1] == eos:  # nothing after a drafted end token is ever emitted
                break
            q = checked_rows(ds.extend(xs[-1:])[-1], "draft", V)
        k = len(xs)  # fewer than gamma when the draft ended the document
        p = checked_rows(ts.extend(ctx[ts.length :] + xs)[-(k + 1) :], "target", V)  # (k + 1, V), one cached step
        rows = torch.arange(k)
        ratios = (p[rows, xs] / torch.stack(qs)[rows, xs]).tolist() if k else []  # p_i(x_i) / q_i(x_i), (k,)
        n = 0  # x_n is accepted with probability min(1, p_n(x_n) / q_n(x_n))
        while n < k and bool(rng.bernoulli(min(1.0, ratios[n]))):
            n += 1
        last = int(rng.categorical(residual(p[n], qs[n]) if n < k else p[k]))
        ts.rollback(len(ctx) + n)  # keep the context and the accepted drafts; `last` is fed next round
        ds.rollback(min(ds.length, len(ctx) + n))
        new = [*xs[:n], last]
        if eos in new:
            new = new[: new.index(eos) + 1]
        out += new
        rounds.append(Round(drafted=k, accepted=n, target_calls=1))
    return Generation(out, rounds)
