"""Known-wrong speculative samplers, each modelled on a real bug.  The properties must kill every one.

All but the last two share the loop of `standard.py` with one bug switched on, so each differs from a correct sampler by
exactly the bug it is named after.  `no_bonus` is correct but slow: its distribution is exact and only
the tokens-per-call property may catch it.
"""

import torch

from harness.contracts.speculative import Generation, Round, check_inputs, validated
from harness.registry import register
from impls.speculative.multidraft import tree_speculative
from impls.speculative.standard import residual

EXACT = ("matches_target_distribution",)
BUGS = {
    "resample_from_p": ("on rejection the replacement is drawn from p instead of norm(max(0, p - q))", EXACT),
    "greedy_draft_sampled_ratio": ("the draft token is q's argmax but q is still used in the ratio", EXACT),
    "truncated_draft_raw_q": ("the draft samples from its top-2 (renormalized) but raw q enters the ratio", EXACT),
    "ratio_inverted": ("accept with min(1, q/p) instead of min(1, p/q)", EXACT),
    "residual_unnormalized": ("the residual max(0, p - q) is sampled by inverse CDF without normalizing", EXACT),
    "bonus_from_q": ("the bonus token after k accepted drafts is drawn from the draft's q", EXACT),
    "wrong_position": ("draft token i is judged with the target's distribution for position i + 1", EXACT),
    "always_accept": ("every draft token is accepted (the output is the draft's distribution)", EXACT),
    "no_bonus": ("no bonus token when all drafts are accepted (correct, but fewer tokens per call)",
                 ("tokens_per_call_matches_formula",)),
    "rows_cached_across_rounds": ("target rows cached by position and reused in later rounds, also after a "
                                  "rejection changed the context they were computed from",
                                  ("matches_target_distribution_run_by_run",)),
    "accepted_counts_replacement": ("a round's accepted count includes the token resampled after a rejection "
                                    "(the output is exact; the acceptance statistics are not)",
                                    ("round_records_add_up",)),
}


def inverse_cdf(rng, weights: torch.Tensor) -> int:
    """Token i with probability weights[i] / (mass left), by a chain of Bernoulli draws; the last token takes
    whatever mass is left -- right for a normalized vector, wrong for an unnormalized one."""
    left = 1.0
    for i, w in enumerate(weights[:-1].tolist()):
        if left <= 0 or bool(rng.bernoulli(torch.tensor(min(1.0, w / left), dtype=torch.float64))):
            return i
        left -= w
    return len(weights) - 1


def buggy_speculative(target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None, bug: str):
    check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
    target, draft = validated(target, "target"), validated(draft, "draft")
    out, rounds, rows = [], [], {}  # rows: position -> target row, kept across rounds by rows_cached_across_rounds
    while len(out) < max_new_tokens and (not out or out[-1] != eos):
        ctx = [*prompt, *out]
        k = min(gamma, max_new_tokens - len(out) - (0 if bug == "no_bonus" else 1))
        xs, qs = [], []
        for _ in range(k):
            q = draft([ctx + xs])[0, -1]  # (V,)
            if bug == "greedy_draft_sampled_ratio":
                x = int(q.argmax())
            elif bug == "truncated_draft_raw_q":
                top = torch.zeros_like(q).scatter(0, q.topk(min(2, len(q))).indices, 1.0) * q  # (V,) top-2 of q
                x = int(rng.categorical(top / top.sum()))
            else:
                x = int(rng.categorical(q))
            xs.append(x)
            qs.append(q)
        p = target([ctx + xs], k + 1)[0]  # (k + 1, V)
        if bug == "rows_cached_across_rounds":  # row i is position len(ctx) + i, whatever came before it
            p = torch.stack([rows.setdefault(len(ctx) + i, p[i]) for i in range(k + 1)])  # (k + 1, V)
        if bug == "wrong_position":
            p = torch.cat([p[1:], p[-1:]])  # (k + 1, V): row i now holds p_{i+1}
        n = 0
        while n < k:
            ratio = qs[n][xs[n]] / p[n, xs[n]] if bug == "ratio_inverted" else p[n, xs[n]] / qs[n][xs[n]]
            if bug != "always_accept" and not bool(rng.bernoulli(ratio.nan_to_num(1.0).clamp(max=1.0))):
                break
            n += 1
        if n < k:
            r = (p[n] - qs[n]).clamp(min=0)
            if bug == "residual_unnormalized":
                last = inverse_cdf(rng, r)
            else:
                last = int(rng.categorical(p[n] if bug == "resample_from_p" else residual(p[n], qs[n])))
            new = [*xs[:n], last]
        elif bug == "no_bonus":
            new = list(xs)
        else:
            bonus = draft([ctx + xs])[0, -1] if bug == "bonus_from_q" else p[k]
            new = [*xs, int(rng.categorical(bonus))]
        if eos in new:
            new = new[: new.index(eos) + 1]
        out += new[: max_new_tokens - len(out)]
        counted = n + (bug == "accepted_counts_replacement" and n < k)
        rounds.append(Round(drafted=k, accepted=counted, target_calls=1))
    return Generation(out, rounds)


for _bug, (_what, _killers) in BUGS.items():
    register("speculative", f"mutant_{_bug}", dtypes=("float64",), mutant=True, bug=_what, killed_by=_killers)(
        lambda target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None, _bug=_bug: buggy_speculative(
            target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens, rng=rng, eos=eos, bug=_bug))


class GlobalTorchRng:
    """Draws from torch's global generator: what a sampler that "just calls torch.multinomial" does."""

    def categorical(self, probs):
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(probs.shape[:-1])  # (...,)

    def bernoulli(self, probs):
        probs = torch.as_tensor(probs, dtype=torch.float64)
        return torch.rand(probs.shape, dtype=torch.float64) < probs


register("speculative", "mutant_own_rng_resample_from_p", dtypes=("float64",), mutant=True, caps={"rng": "own"},
         bug="resample from p instead of the residual, in a sampler using torch's own RNG (not enumerable)",
         killed_by=("goodness_of_fit",))(
    lambda target, draft, prompt, *, gamma, max_new_tokens, rng=None, eos=None: buggy_speculative(
        target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens, rng=GlobalTorchRng(), eos=eos,
        bug="resample_from_p"))


register("speculative", "mutant_multidraft_stale_p", dtypes=("float64",), mutant=True, caps={"draft_width": 2},
         bug="multi-draft: after a rejected candidate the next is judged against the old p, not norm(max(0, p - q))",
         killed_by=EXACT)(
    lambda target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None: tree_speculative(
        target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens, rng=rng, eos=eos, update_p=False))
