"""Train the zoo's models on the farm world, deterministically: ``python -m llm_inference_harness.models.train [--model
NAME|all]``.

Each step draws a fresh batch of documents from the seeded generator (an endless stream, so
nothing is memorized), pads it, and takes one AdamW step on next-token cross-entropy with a
linear warmup and cosine decay.  A recipe with a teacher is distilled instead: the cross-entropy is
taken against the teacher's next-token distribution, not the sampled token (DistillSpec, Zhou et al.
2023: a draft whose q moves toward the target's p raises the acceptance rate sum(min(p, q))).
Seeds, the thread count and deterministic algorithms are fixed, so a rerun on the same machine
writes the same weights.  Writes ``weights/<name>.safetensors`` and ``weights/<name>.json`` (config,
recipe, test NLL per token, grammatical fraction of samples).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass

import torch
from safetensors.torch import save_file

from llm_inference_harness.engine.progress import progress
from llm_inference_harness.models import zoo
from llm_inference_harness.models.gpt import GPT, GPTConfig, nll_loss
from llm_inference_harness.models.world import TOKENIZER, TRAIN_SEED, generate_document

TARGET = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_layer=4, n_head=4, n_kv_head=4, n_embd=128, positions="rotary")
DRAFT_SMALL = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_layer=1, n_head=2, n_kv_head=1, n_embd=32,
                        positions="learned")
# One layer at the target's width, EAGLE's draft shape (Li et al. 2024): on a CPU where a decode step costs
# by its op count, width is nearly free and depth is not; learned positions cost fewer ops than rotary.
DRAFT_WIDE = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_layer=1, n_head=4, n_kv_head=4, n_embd=128,
                       positions="learned")


@dataclass(frozen=True)
class Recipe:
    config: GPTConfig
    steps: int
    lr: float
    batch_docs: int = 64
    warmup: int = 50
    seed: int = 0
    teacher: str | None = None  # a zoo model whose distributions are the labels (distillation)


RECIPES = {
    "target": Recipe(TARGET, steps=800, lr=3e-3, batch_docs=32),
    "draft_good": Recipe(DRAFT_WIDE, steps=1600, lr=3e-3, teacher="target"),
    "draft_bad": Recipe(DRAFT_SMALL, steps=60, lr=1e-2, warmup=10),
}
THREADS = 1  # the machine is shared; one thread also fixes the reduction order
SAMPLED_DOCS, SAMPLE_SEED = 500, 0


def learning_rate(recipe: Recipe, step: int) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    done = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * done)))  # cosine from lr down to lr / 10


def corpus_loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of logits (B, T-1, V) against the sampled tokens idx[:, 1:]."""
    return nll_loss(logits, idx[:, 1:], TOKENIZER.pad)


def distillation_loss(teacher: GPT):
    """Cross-entropy of the student's logits (B, T-1, V) against the teacher's distribution over the
    positions of idx (B, T) whose next token is not PAD: KL(teacher || student) plus a constant."""
    def loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            p = torch.softmax(teacher(idx[:, :-1]), dim=-1)  # (B, T-1, V)
        per_position = -(p * torch.log_softmax(logits, dim=-1)).sum(-1)  # (B, T-1)
        return per_position[idx[:, 1:] != TOKENIZER.pad].mean()
    return loss


def train(name: str) -> dict:
    recipe = RECIPES[name]
    torch.manual_seed(recipe.seed)
    model = GPT(recipe.config)
    loss_fn = distillation_loss(zoo.load(recipe.teacher)) if recipe.teacher else corpus_loss
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = random.Random(TRAIN_SEED + recipe.seed)
    start = time.perf_counter()
    bar = progress(range(recipe.steps), desc=f"training {name}", unit="steps", mininterval=5)
    for step in bar:
        idx = zoo.pad_batch([generate_document(rng) for _ in range(recipe.batch_docs)])  # (B, T)
        loss = loss_fn(model(idx[:, :-1]), idx)
        for group in opt.param_groups:
            group["lr"] = learning_rate(recipe, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    meta = {
        "name": name, "config": asdict(recipe.config), "params": model.num_params(),
        "recipe": {k: v for k, v in asdict(recipe).items() if k != "config"},
        "train_seconds": round(time.perf_counter() - start, 1), "threads": THREADS,
        "test_docs": zoo.TEST_DOCS, "test_nll_per_token": zoo.nll_per_token(model, zoo.test_corpus()),
        "sampled_docs": SAMPLED_DOCS, "sample_seed": SAMPLE_SEED,
        "grammatical_fraction": zoo.grammatical_fraction(zoo.sample(model, SAMPLED_DOCS, SAMPLE_SEED)),
    }
    zoo.WEIGHTS.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, zoo.WEIGHTS / f"{name}.safetensors")
    (zoo.WEIGHTS / f"{name}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*RECIPES, "all"], default="all")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    for name in RECIPES if args.model == "all" else [args.model]:
        meta = train(name)
        print(f"{name}: {meta['params']} params, test NLL {meta['test_nll_per_token']:.4f} nats/token, "
              f"grammatical {meta['grammatical_fraction']:.3f}, {meta['train_seconds']} s")


if __name__ == "__main__":
    main()
