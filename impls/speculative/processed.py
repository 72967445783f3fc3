"""Speculative sampling on processed distributions, as a serving engine runs it: the request's sampling parameters
(temperature, top-k, top-p, min-p) turn the target's rows into the distribution the output must follow, and the
draft proposes from its own rows processed with its own parameters.  Both sides are processed here by the sort-based
logits processing of impls/sampling/sort_based.py applied to log p, and the accept/reject rule is the standard one
(impls/speculative/standard.py).

Invariant: speculative sampling is exact for any proposal, so the output follows the processed target whatever the
draft's parameters are -- provided the q in the ratio and the residual is the one the drafts were drawn from, and
the p is the processed target's.  Leviathan et al. 2023, Algorithm 1; vLLM's rejection sampler on processed target
probabilities (vLLM PR #15063).
"""

import copy

import torch

from harness.contracts.speculative import check_processing
from harness.registry import register
from impls.sampling.sort_based import SortBased
from impls.speculative.standard import SpeculativeSampling

SORT = SortBased()


class Processed:
    """An LM whose every row is processed with one row of sampling parameters."""

    def __init__(self, lm, params) -> None:
        self.lm, self.params, self.vocab_size = lm, params, lm.vocab_size

    def __call__(self, prefixes, n=1):
        p = self.lm(prefixes, n)  # (B, n, V)
        rows = p.reshape(-1, p.shape[-1]).log()  # (B n, V): log 0 = -inf, a token the model never gives
        return torch.stack([SORT.row(z, self.params, 0) for z in rows]).reshape(p.shape)


class ProcessedSpeculative(SpeculativeSampling):
    """The standard round on processed models; ``target_model`` and ``draft_model`` say how each side is processed."""

    def __call__(self, target, draft, prompt, *, gamma, max_new_tokens, rng, eos=None, target_params,
                 draft_params):
        check_processing(target_params, "target_params", target.vocab_size)
        check_processing(draft_params, "draft_params", target.vocab_size)
        run = copy.copy(self)  # the registered object is shared: this call's models and parameters go on a copy
        run.raw, run.run_params = (target, draft), (target_params, draft_params)
        return SpeculativeSampling.__call__(run, run.target_model(target, target_params),
                                            run.draft_model(draft, draft_params), prompt, gamma=gamma,
                                            max_new_tokens=max_new_tokens, rng=rng, eos=eos)

    def target_model(self, target, target_params):
        return Processed(target, target_params)

    def draft_model(self, draft, draft_params):
        return Processed(draft, draft_params)


processed_speculative = register(
    "speculative", "processed", dtypes=("float64",), caps={"processes": True},
    cite="Leviathan et al. 2023, Algorithm 1, on processed target and draft distributions (vLLM PR #15063)",
)(ProcessedSpeculative())
