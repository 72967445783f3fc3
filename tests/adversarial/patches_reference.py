"""Patches the float64 reference at import: the module that defines it and every module holding a copy taken
with ``from llm_inference_harness.references.attention import ...``, so the judge's truth equals the wrong answer.

    harness check attention --plugin tests/adversarial/patches_reference.py:attention
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # wrong_attention.py beside this file

import sys

from wrong_attention import wrong

import llm_inference_harness.references.attention as reference

originals = {name: getattr(reference, name) for name in ("attention64", "attention_plain")}
for module in list(sys.modules.values()):
    for name, original in originals.items():
        if getattr(module, name, None) is original:
            setattr(module, name, lambda q, k, v, causal=False, scale=None, **kw: wrong(q, k, v).double())

attention = wrong
