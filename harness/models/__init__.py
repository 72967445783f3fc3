"""Tiny language models on a synthetic farm world: grammar, tokenizer, GPT, training, and the zoo.

Imports the engine's core only (progress); sampling wraps these models as language models (`sampling.lm.GPTLM`).
Third-party model glue (transformers) lives with the adapters, in impls/external/hf_models.py.
"""
