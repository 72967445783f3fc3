"""The shipped models of the farm world, and how to measure them.

    load(name) -> GPT                  "target", "draft_good", "draft_bad"; eval mode, float32
    metadata(name) -> dict             config, training recipe, and the test NLL recorded at training
    tokenizer() / vocab()              the word-level tokenizer / its words (ids are list indices)
    test_corpus(n_docs=...) -> docs    the held-out seeded test documents (token id lists)
    nll_per_token(model, docs) -> float         mean -log p(token | prefix) in nats over BOS-less tokens
    sample(model, n_docs, seed) -> docs         ancestral sampling from BOS until EOS (or the context ends)
    grammatical_fraction(docs) -> float         share of documents the exact parser accepts

Weights are safetensors files next to a JSON of metadata; `python -m llm_inference_harness.models.train`
reproduces both.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from llm_inference_harness.models.gpt import GPT, ConcatCache, GPTConfig, nll_loss
from llm_inference_harness.models.world import TEST_SEED, TOKENIZER, Tokenizer, corpus, is_grammatical

WEIGHTS = Path(__file__).parent / "weights"
MODELS = ("target", "draft_good", "draft_bad")
TEST_DOCS = 500


def tokenizer() -> Tokenizer:
    return TOKENIZER


def vocab() -> list[str]:
    return list(TOKENIZER.words)


def metadata(name: str) -> dict:
    if name not in MODELS:
        raise ValueError(f"zoo: name must be one of {MODELS}, got {name!r}")
    path = WEIGHTS / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"zoo: {path} is missing; run "
                                f"`python -m llm_inference_harness.models.train --model {name}`")
    return json.loads(path.read_text())


def load(name: str) -> GPT:
    model = GPT(GPTConfig(**metadata(name)["config"]))
    model.load_state_dict(load_file(WEIGHTS / f"{name}.safetensors"))
    return model.float().eval()


def test_corpus(n_docs: int = TEST_DOCS) -> list[list[int]]:
    return corpus(n_docs, TEST_SEED)


def pad_batch(docs: list[list[int]], pad: int = TOKENIZER.pad) -> torch.Tensor:
    """Right-pad token lists into a (B, T) LongTensor."""
    width = max(len(d) for d in docs)
    return torch.tensor([d + [pad] * (width - len(d)) for d in docs], dtype=torch.long)  # (B, T)


@torch.no_grad()
def nll_per_token(model: GPT, docs: list[list[int]], batch_size: int = 100) -> float:
    """Mean next-token negative log-likelihood (nats) over every token after BOS, EOS included."""
    total, count = 0.0, 0
    for i in range(0, len(docs), batch_size):
        idx = pad_batch(docs[i : i + batch_size])  # (B, T)
        logits = model(idx[:, :-1])  # (B, T-1, V)
        total += nll_loss(logits.double(), idx[:, 1:], TOKENIZER.pad, reduction="sum").item()
        count += int((idx[:, 1:] != TOKENIZER.pad).sum())
    return total / count


@torch.no_grad()
def sample(model: GPT, n_docs: int, seed: int, temperature: float = 1.0, batch_size: int = 100) -> list[list[int]]:
    """Documents sampled from BOS with a concatenating KV cache; each ends at its first EOS."""
    gen = torch.Generator().manual_seed(seed)
    docs: list[list[int]] = []
    for start in range(0, n_docs, batch_size):
        B = min(batch_size, n_docs - start)
        tokens = torch.full((B, 1), TOKENIZER.bos, dtype=torch.long)  # (B, 1)
        cache = ConcatCache()
        for t in range(model.cfg.block_size - 1):
            positions = torch.full((B, 1), t, dtype=torch.long)  # (B, 1)
            logits = model.forward_with(tokens[:, -1:], positions, cache.attend)[:, -1]  # (B, V)
            nxt = torch.multinomial(torch.softmax(logits.double() / temperature, -1), 1, generator=gen)  # (B, 1)
            tokens = torch.cat([tokens, nxt], dim=1)
            if bool((tokens == TOKENIZER.eos).any(dim=1).all()):
                break
        for row in tokens.tolist():
            docs.append(row[: row.index(TOKENIZER.eos) + 1] if TOKENIZER.eos in row else row)
    return docs


def grammatical_fraction(docs: list[list[int]]) -> float:
    return sum(is_grammatical(d) for d in docs) / len(docs)
