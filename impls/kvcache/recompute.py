"""No cache: every call runs the full forward pass over each sequence's tokens so far (the oracle).

Invariant: the logits are, by definition, ``model(seq[None])[0, -1]`` through the attention
contract -- O(n^2) work for n tokens, which is what a KV cache avoids.  Vaswani et al. 2017, sec. 3.
"""

import torch

from llm_inference_harness.contracts.kvcache import check_prompts, check_step
from llm_inference_harness.engine.registry import register


class RecomputeDecoder:
    def __init__(self, model, max_len: int) -> None:
        if not isinstance(max_len, int) or not 1 <= max_len <= model.cfg.block_size:
            raise ValueError(f"kvcache: max_len must be an int in [1, block_size={model.cfg.block_size}], "
                             f"got {max_len!r}")
        self.model, self.max_len, self.seqs = model, max_len, None

    @torch.inference_mode()
    def prefill(self, prompts):
        check_prompts(prompts, self.model.cfg.vocab_size, self.max_len)
        self.seqs = [p.clone() for p in prompts]
        return self.last_logits()

    @torch.inference_mode()
    def step(self, tokens):
        lengths = None if self.seqs is None else torch.tensor([len(s) for s in self.seqs])
        check_step(tokens, lengths, self.model.cfg.vocab_size, self.max_len)
        self.seqs = [torch.cat([s, t[None]]) for s, t in zip(self.seqs, tokens, strict=True)]
        return self.last_logits()

    def last_logits(self):
        return torch.stack([self.model(s[None])[0, -1] for s in self.seqs])  # (B, V)


register("kvcache", "recompute", dtypes=("float64", "float32"),
         cite="Vaswani et al. 2017, section 3 (no cache)")(RecomputeDecoder)
