"""Tiny language models on a synthetic farm world: grammar, tokenizer, GPT, training, and the zoo."""
