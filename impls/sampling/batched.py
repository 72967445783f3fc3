"""Batched sampling with per-row parameters, vectorized over the batch as vLLM's v1 Sampler is: each step is one
tensor op over (B, V) with the parameters as (B,) tensors -- penalties from each row's history as a mask and a
bincount, temperature, min-p, then top-k and top-p by thresholds read off one ascending sort per row (the
k-th largest value; the mass above each value), and one categorical draw per row.

Invariant: row b's distribution is a function of row b's logits, parameters and history alone; tokens tied at a
boundary share its fate (ties="keep").  vLLM: v1/sample/sampler.py, v1/sample/ops/penalties.py,
v1/sample/ops/topk_topp_sampler.py (apply_top_k_top_p); Holtzman et al. 2020 (top-p).
"""

import torch

from llm_inference_harness.contracts.sampling import ORDERS, check_inputs, draw
from llm_inference_harness.engine.registry import register


class Batched:
    """A sampler object: called like a function; each step is a method, so that a variation replaces one."""

    stages = ORDERS["vllm"]

    def __call__(self, logits, params, *, rng):
        check_inputs(logits, params)
        return self.draw(rng, self.probs(logits, params))

    def probs(self, logits, params):
        """(B, V) in the logits' dtype: the processed distribution of every row."""
        rows = self.parameters(params, logits)
        z = self.penalize(logits, params, rows)  # (B, V)
        x = z
        for stage in self.stages:
            x = getattr(self, stage)(x, rows)  # (B, V): filters set dropped tokens to -inf
        greedy = self.greedy(rows)[:, None]  # (B, 1)
        first = torch.nn.functional.one_hot(z.argmax(-1), z.shape[1]).to(z.dtype)  # (B, V): ties to the lowest id
        return torch.where(greedy, first, torch.softmax(x, -1))

    def parameters(self, params, logits):
        """name -> (B,) tensor in the logits' dtype (top_k as int64)."""
        rows = {name: torch.tensor(getattr(params, name), dtype=logits.dtype, device=logits.device)
                for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                             "frequency_penalty")}
        rows["top_k"] = torch.tensor(params.top_k, dtype=torch.int64, device=logits.device)
        return rows

    def penalize(self, logits, params, rows):
        B, V = logits.shape
        counts = self.output_counts(params, B, V).to(logits.device, logits.dtype)  # (B, V)
        seen = self.history_mask(params, B, V).to(logits.device) | (counts > 0)  # (B, V)
        z = self.repetition(logits, seen, rows["repetition_penalty"][:, None])
        return z - rows["frequency_penalty"][:, None] * counts - rows["presence_penalty"][:, None] * (counts > 0)

    def history_mask(self, params, B, V):
        """(B, V) bool: the ids of each row's prompt."""
        mask = torch.zeros(B, V, dtype=torch.bool)
        for b, ids in enumerate(params.prompt_tokens):
            mask[b, list(ids)] = True
        return mask

    def output_counts(self, params, B, V):
        """(B, V): how often each id occurs in each row's output tokens."""
        return torch.stack([torch.bincount(torch.tensor(ids, dtype=torch.int64), minlength=V)
                            for ids in params.output_tokens]) if B else torch.zeros(0, V)

    def repetition(self, z, seen, r):
        """CTRL's penalty: divide a seen positive logit by r, multiply a seen negative one."""
        return torch.where(seen, torch.where(z > 0, z / r, z * r), z)

    def greedy(self, rows):
        return rows["temperature"] == 0

    def temperature(self, x, rows):
        T = rows["temperature"][:, None]  # (B, 1); greedy rows are replaced by their argmax after the stages
        return x / torch.where(T > 0, T, 1)

    def min_p(self, x, rows):
        p = torch.softmax(x, -1)  # (B, V)
        return x.masked_fill(p < rows["min_p"][:, None] * p.amax(-1, keepdim=True), -torch.inf)

    def top_k(self, x, rows):
        k = rows["top_k"]
        V = x.shape[1]
        k = torch.where(k > 0, k, V)  # (B,): 0 is off
        kth = x.sort(-1, descending=True).values.gather(1, (k - 1)[:, None])  # (B, 1): the k-th largest value
        return x.masked_fill(x < kth, -torch.inf)

    def top_p(self, x, rows):
        values, order = x.sort(-1)  # (B, V) ascending
        cum = torch.softmax(values, -1).cumsum(-1)  # (B, V)
        last = torch.searchsorted(values, x, right=True) - 1  # (B, V): the last sorted position of each value
        above = cum[:, -1:] - cum.gather(1, last)  # (B, V): mass strictly more probable than each token
        p = rows["top_p"][:, None]  # (B, 1); 1 is off (a tiny token's mass above it may round to 1)
        return x.masked_fill((above >= p) & (p < 1), -torch.inf)

    def draw(self, rng, probs):
        return draw(rng, probs)


batched = register("sampling", "batched", dtypes=("float32", "float64"),
                   cite="vLLM v1 Sampler: apply_penalties, min-p, apply_top_k_top_p (Holtzman et al. 2020, top-p)",
                   caps={"order": "vllm", "ties": "keep"})(Batched())


class BatchedProbs(Batched):
    """The same computation at the processing level: the (B, V) processed distribution, nothing drawn."""

    def __call__(self, logits, params):
        check_inputs(logits, params)
        return self.probs(logits, params)


batched_probs = register("sampling", "batched_probs", dtypes=("float32", "float64"),
                         cite="vLLM v1 Sampler's processing (apply_penalties, min-p, apply_top_k_top_p)",
                         caps={"returns": "probs", "order": "vllm", "ties": "keep", "batch_invariant": True,
                               "deterministic": True})(BatchedProbs())
