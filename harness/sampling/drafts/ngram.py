"""n-gram drafts: next-token tables counted on the grammar's training corpus, with add-k smoothing so
that no token has probability zero (a zero where the target has mass is allowed -- exactness does not
need it -- but it would cost acceptance).  Order 2 is a bigram (one token of context), order 3 a trigram.
"""

from functools import cache

import torch

from llm_inference_harness.models.world import TOKENIZER, TRAIN_SEED, corpus
from llm_inference_harness.sampling.lm import TableLM


@cache
def ngram(order: int, n_docs: int = 2000, k: float = 0.01) -> TableLM:
    if order not in (1, 2, 3):
        raise ValueError(f"ngram: order must be 1, 2 or 3, got {order}")
    V = TOKENIZER.vocab_size
    shape = (*(V + 1,) * (order - 1), V)  # context index V: before the start
    grams = [padded[i : i + order] for doc in corpus(n_docs, TRAIN_SEED + 1)
             for padded in [[V] * (order - 1) + doc] for i in range(len(doc))]
    flat = torch.tensor(grams) @ torch.tensor([(V + 1) ** (order - 1 - j) for j in range(order)])  # (N,) ids
    flat = flat // (V + 1) * V + flat % (V + 1)  # last digit counts in base V, not V + 1
    counts = torch.bincount(flat, minlength=torch.Size(shape).numel()).double().reshape(shape) + k
    return TableLM(counts / counts.sum(-1, keepdim=True))


def uniform(V: int = TOKENIZER.vocab_size) -> TableLM:
    return TableLM(torch.full((V,), 1.0 / V, dtype=torch.float64))
