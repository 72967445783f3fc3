"""Sort-based sampling, one row at a time, in transformers' order: penalties, temperature, then top-k, top-p and
min-p on the row sorted once in descending order (stable, so tokens tied at a boundary are taken lowest id
first: ties="index"), softmax over the kept prefix, one categorical draw.

Invariant: after each filter the kept tokens are a prefix of the sorted row, and top-p keeps a token exactly
when the mass before it (renormalized over the prefix kept so far) is below top_p, so the token that crosses
top_p is kept (Holtzman et al. 2020, Eq. 2; llama.cpp PR #1953 fixed the off-by-one that dropped it).
transformers, generation/logits_process.py (the warpers' order: Temperature, TopK, TopP, MinP).
"""

import torch

from llm_inference_harness.contracts.sampling import ORDERS, check_inputs, draw
from llm_inference_harness.engine.registry import register


class SortBased:
    stages = ORDERS["transformers"]

    def __call__(self, logits, params, *, rng):
        check_inputs(logits, params)
        B, V = logits.shape
        probs = torch.stack([self.row(logits[b], params, b) for b in range(B)]) if B else logits.new_zeros(0, V)
        return draw(rng, probs)

    def row(self, z, params, b):
        """(V,): row b's processed distribution."""
        z = self.penalize(z, params, b)
        if params.temperature[b] == 0:
            return torch.nn.functional.one_hot(z.argmax(), len(z)).to(z.dtype)  # ties to the lowest id
        values, order = self.sort(z)  # (V,) descending
        keep = values > -torch.inf  # (V,): a prefix of the sorted row
        x = values
        for stage in self.stages:
            if stage == "temperature":
                x = values / params.temperature[b]
            else:
                keep = getattr(self, stage)(x, keep, params, b)
        p = torch.softmax((values / params.temperature[b]).masked_fill(~keep, -torch.inf), -1)  # (V,)
        return torch.zeros_like(p).scatter(0, order, p)

    def penalize(self, z, params, b):
        seen = sorted(set(params.prompt_tokens[b]) | set(params.output_tokens[b]))
        r, f, a = params.repetition_penalty[b], params.frequency_penalty[b], params.presence_penalty[b]
        if seen and r != 1:
            z = z.clone()
            z[seen] = torch.where(z[seen] > 0, z[seen] / r, z[seen] * r)
        if params.output_tokens[b] and (f or a):
            ids, counts = torch.tensor(params.output_tokens[b]).unique(return_counts=True)
            z = z.index_add(0, ids, -(f * counts.to(z.dtype) + a))
        return z

    def sort(self, z):
        return torch.sort(z, descending=True, stable=True)

    def top_k(self, x, keep, params, b):
        k = params.top_k[b]
        return keep & (torch.arange(len(x)) < k) if k > 0 else keep

    def top_p(self, x, keep, params, b):
        if params.top_p[b] >= 1:
            return keep
        q = torch.softmax(x.masked_fill(~keep, -torch.inf), -1)  # (V,) over the prefix kept so far
        before = q.cumsum(-1) - q  # (V,): the mass ranked before each token
        return keep & ((before < params.top_p[b]) | (torch.arange(len(x)) == 0))

    def min_p(self, x, keep, params, b):
        q = torch.softmax(x.masked_fill(~keep, -torch.inf), -1)  # (V,): q[0] is the largest
        return keep & (q >= params.min_p[b] * q[0])


sort_based = register("sampling", "sort_based", dtypes=("float32", "float64"),
                      cite="transformers warpers' order with a stable sort (Holtzman et al. 2020, Eq. 2)",
                      caps={"order": "transformers", "ties": "index"})(SortBased())
