"""Prompt-lookup drafting (Saxena 2023, "Prompt Lookup Decoding"): find the last earlier occurrence of
the context's final n tokens and propose, with certainty, the token that followed it; with no match,
fall back to uniform.  A draft need not be a good model: speculative sampling stays exact, the match
rate only decides the speed.
"""

import torch


class PromptLookup:
    def __init__(self, vocab_size: int, n: int = 2) -> None:
        self.vocab_size, self.n = vocab_size, n

    def row(self, x) -> torch.Tensor:
        x = list(x)
        for n in range(min(self.n, len(x) - 1), 0, -1):  # longest suffix first
            tail = x[-n:]
            for start in range(len(x) - n - 1, -1, -1):
                if x[start : start + n] == tail:
                    return torch.nn.functional.one_hot(torch.tensor(x[start + n]), self.vocab_size).double()
        return torch.full((self.vocab_size,), 1.0 / self.vocab_size, dtype=torch.float64)

    def __call__(self, prefixes, n=1):
        return torch.stack([torch.stack([self.row(x[: len(x) - n + 1 + i]) for i in range(n)]) for x in prefixes])
