"""Known-wrong speculative samplers, each modelled on a real bug.  The properties must kill every one.

Each is the correct sampler of impls/speculative/standard.py (or multidraft.py) with one step of its
round replaced -- a subclass overriding the method the bug lives in -- so it differs from a correct sampler by
exactly the bug it is named after.  `NoBonus` is correct but slow: its distribution is exact and only the
tokens-per-call property may catch it.
"""

import torch

from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.speculative.multidraft import WIDTH, TreeSpeculative
from llm_inference_harness.impls.speculative.standard import Processed, SpeculativeSampling, acceptance

EXACT = ("matches_target_distribution",)
PROCESSED = ("matches_processed_target_distribution",)


class ResampleFromP(SpeculativeSampling):
    """On rejection the replacement is drawn from p instead of norm(max(0, p - q))."""

    def residual(self, p, q):
        return p


class GreedyDraftSampledRatio(SpeculativeSampling):
    """The draft token is q's argmax but q is still used in the ratio."""

    def draft_token(self, rng, q):
        return int(q.argmax())


class TruncatedDraftRawQ(SpeculativeSampling):
    """The draft samples from its top-2 (renormalized) but raw q enters the ratio."""

    def draft_token(self, rng, q):
        top = torch.zeros_like(q).scatter(0, q.topk(min(2, len(q))).indices, 1.0) * q  # (V,): q's top-2
        return int(rng.categorical(top / top.sum()))


class RatioInverted(SpeculativeSampling):
    """Accept with min(1, q/p) instead of min(1, p/q)."""

    def ratio(self, p, qs, xs, i):
        return float((qs[i][xs[i]] / p[i, xs[i]]).nan_to_num(1.0).clamp(max=1.0))


class ResidualUnnormalized(SpeculativeSampling):
    """The residual max(0, p - q) is sampled by inverse CDF without normalizing: the last token takes the mass the
    others leave, right for a normalized vector, wrong for this one."""

    def replacement(self, rng, p, q):
        weights, left = (p - q).clamp(min=0), 1.0
        for i, w in enumerate(weights[:-1].tolist()):
            if left <= 0 or bool(rng.bernoulli(min(1.0, w / left))):
                return i
            left -= w
        return len(weights) - 1


class BonusFromQ(SpeculativeSampling):
    """The bonus token after k accepted drafts is drawn from the draft's q."""

    def bonus(self, rng, p, draft, ctx, xs):
        return [int(rng.categorical(draft([ctx + xs])[0, -1]))]


class WrongPosition(SpeculativeSampling):
    """Draft token i is judged with the target's distribution for position i + 1."""

    def verify(self, target, ctx, xs, memo):
        p = super().verify(target, ctx, xs, memo)
        return torch.cat([p[1:], p[-1:]])  # (k + 1, V): row i now holds p_{i+1}


class AlwaysAccept(SpeculativeSampling):
    """Every draft token is accepted (the output is the draft's distribution)."""

    def ratio(self, p, qs, xs, i):
        return 1.0


class NoBonus(SpeculativeSampling):
    """No bonus token when all drafts are accepted (correct, but fewer tokens per call): the round drafts up to
    what is left instead."""

    def budget(self, gamma, left):
        return min(gamma, left)

    def bonus(self, rng, p, draft, ctx, xs):
        return []


class RowsCachedAcrossRounds(SpeculativeSampling):
    """Target rows cached by position and reused in later rounds, also after a rejection changed the context they
    were computed from."""

    def verify(self, target, ctx, xs, memo):
        p = super().verify(target, ctx, xs, memo)
        return torch.stack([memo.setdefault(len(ctx) + i, p[i]) for i in range(len(xs) + 1)])  # (k + 1, V)


class AcceptedCountsReplacement(SpeculativeSampling):
    """A round's accepted count includes the token resampled after a rejection (the output is exact; the
    acceptance statistics are not)."""

    def accepted_count(self, n, k):
        return n + (n < k)


# Modelled on rejection-sampler bugs reported against vLLM, transformers and FlashInfer:
class QOfFirstPosition(SpeculativeSampling):
    """The draft's probabilities read at the first draft position for every draft token (draft_probs[:, 0]), in the
    ratio and the residual."""

    def q_at(self, qs, i):
        return qs[0]


class ResidualFromNextQ(SpeculativeSampling):
    """The residual after rejecting x_i is built from q_{i+1} (an off-by-one in the draft-probability index)."""

    def residual_q(self, qs, n):
        return qs[n + 1] if n + 1 < len(qs) else qs[n]


class SharedUniform(SpeculativeSampling):
    """One uniform draw reused for every acceptance test of a round instead of one per draft position: x_i is
    accepted iff u < rho_i for the round's one u, drawn exactly as P(u < rho_i | u < every rho before)."""

    def accepted(self, rng, p, qs, xs, eos):
        n, below = 0, 1.0  # u is known to lie below `below`
        while n < len(xs):
            rho = self.ratio(p, qs, xs, n)
            if not bool(rng.bernoulli(min(1.0, rho / below))):
                break
            below = min(below, rho)
            n += 1
        return n


class EosNotStopping(SpeculativeSampling):
    """An eos accepted inside the drafts does not stop the output: the tokens after it in the round are emitted
    too."""

    def at_eos(self, new, eos):
        return new


class RecoveredArgmax(SpeculativeSampling):
    """The token that replaces a rejected draft is the argmax of max(0, p - q), not a sample of it."""

    def replacement(self, rng, p, q):
        return int((p - q).clamp(min=0).argmax())


class ResidualAbs(SpeculativeSampling):
    """The residual is norm(|p - q|) instead of norm(max(0, p - q))."""

    def residual(self, p, q):
        d = (p - q).abs()
        return d / d.sum()


class EmitsRejectedDraft(SpeculativeSampling):
    """The rejected draft token is emitted before its replacement (the accepted count off by one)."""

    def kept(self, xs, n):
        return xs[: n + 1]


class BonusFromLastDraftRow(SpeculativeSampling):
    """The bonus token is drawn from the target row of the last draft, p_k, instead of p_{k+1}."""

    def bonus(self, rng, p, draft, ctx, xs):
        return [int(rng.categorical(p[max(len(xs) - 1, 0)]))]


class RatioReadsPreviousToken(SpeculativeSampling):
    """The acceptance ratio reads q at the previous draft token, q_i(x_{i-1})."""

    def ratio(self, p, qs, xs, i):
        return acceptance(float(p[i, xs[i]]), float(qs[i][xs[i - 1] if i else xs[i]]))


class UnverifiedDraftEos(SpeculativeSampling):
    """A drafted eos ends the drafts and is emitted without its acceptance test."""

    def draft(self, draft, ctx, k, rng, eos):
        xs, qs = [], []
        while len(xs) < k and (not xs or xs[-1] != eos):
            qs.append(draft([ctx + xs])[0, -1])  # (V,)
            xs.append(self.draft_token(rng, qs[-1]))
        return xs, qs

    def accepted(self, rng, p, qs, xs, eos):
        if not xs or xs[-1] != eos:
            return super().accepted(rng, p, qs, xs, eos)
        n = super().accepted(rng, p, qs, xs[:-1], eos)
        return len(xs) if n == len(xs) - 1 else n  # the rest passed: the eos is taken as it is


class GlobalTorchRng:
    """Draws from torch's global generator: what a sampler that "just calls torch.multinomial" does."""

    def categorical(self, probs):
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(probs.shape[:-1])  # (...,)

    def bernoulli(self, probs):
        probs = torch.as_tensor(probs, dtype=torch.float64)
        return torch.rand(probs.shape, dtype=torch.float64) < probs


class OwnRngResampleFromP(ResampleFromP):
    """Resample from p instead of the residual, in a sampler using torch's own RNG (not enumerable)."""

    def __call__(self, target, draft, prompt, *, gamma, max_new_tokens, rng=None, eos=None):
        return super().__call__(target, draft, prompt, gamma=gamma, max_new_tokens=max_new_tokens,
                                rng=GlobalTorchRng(), eos=eos)


class MultidraftStaleP(TreeSpeculative):
    """Multi-draft: after a rejected candidate the next is judged against the old p, not norm(max(0, p - q))."""

    def next_p(self, p, q):
        return p


# Speculative decoding on processed distributions (the standard sampler given sampling parameters):
class TargetUnprocessed(SpeculativeSampling):
    """Only the draft's distribution is processed: the target's rows in the acceptance test, the residual and the
    bonus are its raw ones, so the output follows the unprocessed target (vLLM issue #9834, fixed by PR #10198:
    target probabilities computed with default sampling parameters)."""

    def target_model(self, target, target_params):
        return target


class DraftWithTargetParams(SpeculativeSampling):
    """Drafts are drawn from the draft processed with its own parameters, but the q entering the ratio and the
    residual is the draft processed with the target's (the drafter's sampling parameters are not the ones the
    verifier assumes: z-lab/dflash issue #74)."""

    def draft(self, draft, ctx, k, rng, eos):
        xs, _ = super().draft(draft, ctx, k, rng, eos)
        as_target = Processed(self.raw[1], self.run_params[0])  # this call's raw draft, with the target's parameters
        return xs, [as_target([ctx + xs[:i]])[0, -1] for i in range(len(xs))]


def _register(cls: type, killed_by: tuple[str, ...], **caps) -> None:
    name = "".join(f"_{c.lower()}" if c.isupper() else c for c in cls.__name__).lstrip("_")
    register("speculative", f"mutant_{name}", dtypes=("float64",), mutant=True, bug=" ".join(cls.__doc__.split()),
             killed_by=killed_by, caps=caps)(cls())


for _cls in (ResampleFromP, GreedyDraftSampledRatio, TruncatedDraftRawQ, RatioInverted, ResidualUnnormalized,
             BonusFromQ, WrongPosition, AlwaysAccept, QOfFirstPosition, ResidualFromNextQ, SharedUniform,
             EosNotStopping, RecoveredArgmax, ResidualAbs, EmitsRejectedDraft, BonusFromLastDraftRow,
             RatioReadsPreviousToken, UnverifiedDraftEos):
    _register(_cls, EXACT)
_register(NoBonus, ("tokens_per_call_matches_formula",))
_register(RowsCachedAcrossRounds, ("matches_target_distribution_run_by_run",))
_register(AcceptedCountsReplacement, ("round_records_add_up",))
_register(OwnRngResampleFromP, ("goodness_of_fit",), rng="own")
_register(MultidraftStaleP, EXACT, draft_width=WIDTH)
_register(TargetUnprocessed, PROCESSED, processes=True)
_register(DraftWithTargetParams, PROCESSED, processes=True)
