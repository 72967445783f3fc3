"""Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2).

Each round the draft proposes x_1..x_k ~ q autoregressively, the target scores all k + 1 positions in
one call, x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection a token
is drawn from norm(max(0, p_i - q_i)), and when all k are accepted a bonus token from p_{k+1}.
Invariant: every emitted token is distributed as p given the tokens before it, whatever q is.

Given sampling parameters (caps processes: ``target_params``, ``draft_params``), it samples from processed
distributions, as a serving engine does: each side's rows are processed with its own parameters by the sort-based
logits processing of impls/sampling/sort_based.py applied to log p, and the output follows the processed target
whatever the draft's parameters -- provided the q in the ratio and the residual is the one the drafts were drawn
from, and the p is the processed target's (vLLM's rejection sampler on processed probabilities, vLLM PR #15063).

The sampler is an object whose every step of a round is a method, so that a variation replaces exactly one
(the mutants of impls/speculative/mutants.py, the adaptive draft length of impls/speculative/adaptive.py).
"""

import copy

import torch

from llm_inference_harness.contracts.speculative import Generation, Round, check_inputs, check_processing, validated
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.sampling.sort_based import SortBased

SORT = SortBased()


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution of the token that replaces a rejected draft token."""
    r = (p - q).clamp(min=0)
    return r / r.sum()


def acceptance(p_x: float, q_x: float) -> float:
    """min(1, p(x) / q(x)); 1 where q(x) = 0 (a drafted token has q(x) > 0; a q read at the wrong place may not)."""
    return min(1.0, p_x / q_x) if q_x > 0 else 1.0


class Processed:
    """An LM whose every row is processed with one row of sampling parameters."""

    def __init__(self, lm, params) -> None:
        self.lm, self.params, self.vocab_size = lm, params, lm.vocab_size

    def __call__(self, prefixes, n=1):
        p = self.lm(prefixes, n)  # (B, n, V)
        rows = p.reshape(-1, p.shape[-1]).log()  # (B n, V): log 0 = -inf, a token the model never gives
        return torch.stack([SORT.row(z, self.params, 0) for z in rows]).reshape(p.shape)


class SpeculativeSampling:
    """``unsure`` > 0: drafting stops after a token the draft drew with probability below it."""

    def __init__(self, unsure: float = 0.0) -> None:
        self.unsure = unsure

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __call__(self, target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None, target_params=None,
                 draft_params=None):
        if target_params is not None or draft_params is not None:  # processed distributions
            check_processing(target_params, "target_params", target.vocab_size)
            check_processing(draft_params, "draft_params", target.vocab_size)
            run = copy.copy(self)  # the registered object is shared: this call's models and parameters go on a copy
            run.raw, run.run_params = (target, draft), (target_params, draft_params)
            return run(run.target_model(target, target_params), run.draft_model(draft, draft_params), prompt,
                       gamma=gamma, max_new_tokens=max_new_tokens, rng=rng, eos=eos)
        check_inputs(target, draft, prompt, gamma, max_new_tokens, eos)
        target, draft = validated(target, "target"), validated(draft, "draft")
        out, rounds, memo = [], [], {}  # memo: what a round may keep for later ones (nothing, when correct)
        while len(out) < max_new_tokens and (not out or out[-1] != eos):
            ctx = [*prompt, *out]
            xs, qs = self.draft(draft, ctx, self.budget(gamma, max_new_tokens - len(out)), rng, eos)
            p = self.verify(target, ctx, xs, memo)  # (k + 1, V): p_1 .. p_{k+1} in one call
            n = self.accepted(rng, p, qs, xs, eos)
            new = self.emitted(rng, p, qs, xs, n, draft, ctx, eos)
            out += (self.at_eos(new, eos) if eos in new else new)[: max_new_tokens - len(out)]
            rounds.append(Round(drafted=len(xs), accepted=self.accepted_count(n, len(xs)), target_calls=1))
        return Generation(out, rounds)

    def target_model(self, target, target_params):
        return Processed(target, target_params)

    def draft_model(self, draft, draft_params):
        return Processed(draft, draft_params)

    def budget(self, gamma: int, left: int) -> int:
        """Drafts this round: past left - 1 they could never be emitted (the bonus takes the last place)."""
        return min(gamma, left - 1)

    def draft(self, draft, ctx, k: int, rng, eos):
        """(x_1..x_k, q_1..q_k): the drafts and the rows (V,) they were drawn from."""
        xs, qs = [], []
        while len(xs) < k:
            q = draft([ctx + xs])[0, -1]  # (V,)
            xs.append(self.draft_token(rng, q))
            qs.append(q)
            if float(q[xs[-1]]) < self.unsure:
                break
        return xs, qs

    def draft_token(self, rng, q) -> int:
        return int(rng.categorical(q))

    def verify(self, target, ctx, xs, memo):
        return target([ctx + xs], len(xs) + 1)[0]

    def q_at(self, qs, i: int):
        return qs[i]

    def ratio(self, p, qs, xs, i: int) -> float:
        """The probability of accepting x_i: min(1, p_i(x_i) / q_i(x_i)), read as two floats."""
        return acceptance(float(p[i, xs[i]]), float(self.q_at(qs, i)[xs[i]]))

    def accepted(self, rng, p, qs, xs, eos) -> int:
        """How many drafts pass their tests, in order: one coin each, until the first rejection."""
        n = 0
        while n < len(xs) and bool(rng.bernoulli(self.ratio(p, qs, xs, n))):
            n += 1
        return n

    def emitted(self, rng, p, qs, xs, n: int, draft, ctx, eos) -> list[int]:
        """The round's tokens: the accepted drafts and a replacement, or every draft and the bonus token."""
        if n < len(xs):
            return [*self.kept(xs, n), self.replacement(rng, p[n], self.residual_q(qs, n))]
        return [*xs, *self.bonus(rng, p, draft, ctx, xs)]

    def kept(self, xs, n: int) -> list[int]:
        return xs[:n]

    def residual_q(self, qs, n: int):
        return self.q_at(qs, n)

    def residual(self, p, q):
        return residual(p, q)

    def replacement(self, rng, p, q) -> int:
        return int(rng.categorical(self.residual(p, q)))

    def bonus(self, rng, p, draft, ctx, xs) -> list[int]:
        return [int(rng.categorical(p[len(xs)]))]

    def at_eos(self, new: list[int], eos: int) -> list[int]:
        return new[: new.index(eos) + 1]

    def accepted_count(self, n: int, k: int) -> int:
        return n


speculative = register("speculative", "standard", dtypes=("float64",), caps={"processes": True},
                       cite="Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2")(SpeculativeSampling())
