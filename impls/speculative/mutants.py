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
    # Modelled on rejection-sampler bugs reported against vLLM, transformers and FlashInfer:
    "q_of_first_position": ("the draft's probabilities read at the first draft position for every draft token "
                            "(draft_probs[:, 0]), in the ratio and the residual", EXACT),
    "residual_from_next_q": ("the residual after rejecting x_i is built from q_{i+1} (an off-by-one in the "
                             "draft-probability index)", EXACT),
    "shared_uniform": ("one uniform draw reused for every acceptance test of a round instead of one per "
                       "draft position", EXACT),
    "eos_not_stopping": ("an eos accepted inside the drafts does not stop the output: the tokens after it "
                         "in the round are emitted too", EXACT),
    "recovered_argmax": ("the token that replaces a rejected draft is the argmax of max(0, p - q), not a "
                         "sample of it", EXACT),
    "residual_abs": ("the residual is norm(|p - q|) instead of norm(max(0, p - q))", EXACT),
    "emits_rejected_draft": ("the rejected draft token is emitted before its replacement (the accepted count "
                             "off by one)", EXACT),
    "bonus_from_last_draft_row": ("the bonus token is drawn from the target row of the last draft, p_k, "
                                  "instead of p_{k+1}", EXACT),
    "ratio_reads_previous_token": ("the acceptance ratio reads q at the previous draft token, q_i(x_{i-1})",
                                   EXACT),
    "unverified_draft_eos": ("a drafted eos ends the drafts and is emitted without its acceptance test",
                             EXACT),
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
            if bug == "unverified_draft_eos" and x == eos:
                break
        k = len(xs)
        p = target([ctx + xs], k + 1)[0]  # (k + 1, V)
        if bug == "rows_cached_across_rounds":  # row i is position len(ctx) + i, whatever came before it
            p = torch.stack([rows.setdefault(len(ctx) + i, p[i]) for i in range(k + 1)])  # (k + 1, V)
        if bug == "wrong_position":
            p = torch.cat([p[1:], p[-1:]])  # (k + 1, V): row i now holds p_{i+1}
        if bug == "q_of_first_position" and qs:  # the draft's probabilities read as draft_probs[:, 0] at every position
            qs = [qs[0]] * k
        n = accepted(rng, p, qs, xs, bug, eos)
        eos_taken = bug == "unverified_draft_eos" and bool(xs) and xs[-1] == eos and n == k - 1  # the rest passed
        if n < k and not eos_taken:
            q_n = qs[n + 1] if bug == "residual_from_next_q" and n + 1 < k else qs[n]
            r = (p[n] - q_n).clamp(min=0)
            if bug == "residual_unnormalized":
                last = inverse_cdf(rng, r)
            elif bug == "recovered_argmax":
                last = int(r.argmax())
            elif bug == "residual_abs":
                d = (p[n] - q_n).abs()
                last = int(rng.categorical(d / d.sum()))
            else:
                last = int(rng.categorical(p[n] if bug == "resample_from_p" else residual(p[n], q_n)))
            new = [*xs[: n + 1 if bug == "emits_rejected_draft" else n], last]
        elif bug == "no_bonus" or eos_taken:
            new = list(xs)
        else:
            bonus = draft([ctx + xs])[0, -1] if bug == "bonus_from_q" else p[max(k - 1, 0)] if (
                bug == "bonus_from_last_draft_row") else p[k]
            new = [*xs, int(rng.categorical(bonus))]
        if eos in new and bug != "eos_not_stopping":
            new = new[: new.index(eos) + 1]
        out += new[: max_new_tokens - len(out)]
        counted = n + (bug == "accepted_counts_replacement" and n < k)
        rounds.append(Round(drafted=k, accepted=counted, target_calls=1))
    return Generation(out, rounds)


def accepted(rng, p: torch.Tensor, qs: list, xs: list[int], bug: str, eos: int | None) -> int:
    """How many drafts pass their acceptance tests, in order (min(1, p_i(x_i) / q_i(x_i)) each, but for the bug)."""
    n, u_below = 0, 1.0  # shared_uniform: the one uniform u is known to lie below u_below
    k = len(xs)
    if bug == "unverified_draft_eos" and xs and xs[-1] == eos:
        k -= 1  # the drafted eos is taken as it is
    while n < k:
        q_x = qs[n][xs[n - 1]] if bug == "ratio_reads_previous_token" and n else qs[n][xs[n]]
        ratio = q_x / p[n, xs[n]] if bug == "ratio_inverted" else p[n, xs[n]] / q_x
        rho = float(ratio.nan_to_num(1.0).clamp(max=1.0))
        if bug == "shared_uniform":  # accept x_n iff u < rho_n, one u for the whole round: P(u < rho | u < below)
            if not bool(rng.bernoulli(min(1.0, rho / u_below))):
                break
            u_below = min(u_below, rho)
        elif bug != "always_accept" and not bool(rng.bernoulli(rho)):
            break
        n += 1
    return n


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
