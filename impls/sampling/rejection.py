"""Sorting-free sampling by rejection, as FlashInfer's top-k / top-p kernels do: draw a token from the candidates,
accept it when it passes every filter, else drop it and every token not ranked above it and draw again.

Each filter is tested on the drawn token alone with reductions over the row (no sort): top-k counts the tokens
ranked before it, top-p sums their mass (over the top-k set, as transformers' order renormalizes), min-p compares
it with the largest probability.  Invariant: the kept set is an upper set of the ranking, so a rejected token's
successors are rejected too and the candidates always contain the kept set; a draw from the candidates that
lands in the kept set is distributed as the processed distribution (rejection sampling), and the first-ranked
token is always accepted, so the loop ends.  ``ties`` picks the ranking: "keep" (equal values rank together)
or "index" (the lower id first).  FlashInfer, include/flashinfer/sampling.cuh (TopKTopPSamplingFromProbKernel);
FlashInfer PR #3774 (ties at the boundary).
"""

import torch

from llm_inference_harness.contracts.sampling import check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.sampling.sort_based import SortBased


class Rejection:
    ties = "keep"

    def __call__(self, logits, params, *, rng):
        check_inputs(logits, params)
        B, V = logits.shape
        if not B:
            return torch.zeros(0, dtype=torch.int64, device=logits.device)
        rows = [self.row(SortBased().penalize(logits[b].double(), params, b), params, b, rng) for b in range(B)]
        return torch.tensor(rows, device=logits.device)

    def row(self, z, params, b, rng) -> int:
        if params.temperature[b] == 0:
            return int(z.argmax())
        x = z / params.temperature[b]  # (V,); transformers' order: temperature first
        p = torch.softmax(x, -1)  # (V,)
        top_k = self.top_k_set(x, params.top_k[b])  # (V,) bool
        top_k_mass = float(p[top_k].sum())
        candidates = p > 0
        while True:
            q = p * candidates  # (V,)
            j = int(rng.categorical(q / q.sum()))
            ahead = self.ahead(x, j)  # (V,) bool
            if self.accepts(p, j, ahead, top_k, top_k_mass, params, b):
                return j
            candidates &= ahead

    def ahead(self, x, j):
        """(V,) bool: the tokens ranked before token j."""
        ahead = x > x[j]
        if self.ties == "index":
            ahead[:j] |= x[:j] == x[j]  # a tie ranks the lower id first
        return ahead

    def top_k_set(self, x, k):
        """(V,) bool: the k first-ranked tokens, by selection (the k-th largest value), not by a sort."""
        if k == 0:
            return torch.ones_like(x, dtype=torch.bool)
        kth = -torch.kthvalue(-x, k).values  # the k-th largest value
        if self.ties == "keep":
            return x >= kth
        tied = x == kth
        return (x > kth) | (tied & (tied.cumsum(0) <= k - int((x > kth).sum())))  # ties: the lowest ids

    def accepts(self, p, j, ahead, top_k, top_k_mass, params, b) -> bool:
        """Token j, with the tokens ranked ahead of it, passes top-k, top-p (its mass over the top-k set) and
        min-p."""
        if not top_k[j]:
            return False
        if params.top_p[b] < 1 and float(p[ahead & top_k].sum()) >= params.top_p[b] * top_k_mass:
            return False
        return float(p[j]) >= params.min_p[b] * float(p.max())


rejection = register("sampling", "rejection", dtypes=("float32", "float64"),
                     cite="FlashInfer sorting-free rejection sampling (TopKTopPSamplingFromProbKernel)",
                     caps={"order": "transformers", "ties": "keep"})(Rejection())


class IndexTies(Rejection):
    ties = "index"


rejection_index_ties = register("sampling", "rejection_index_ties", dtypes=("float32", "float64"),
                                cite="FlashInfer sorting-free rejection sampling, ties to the lower id (PR #3774)",
                                caps={"order": "transformers", "ties": "index"})(IndexTies())
