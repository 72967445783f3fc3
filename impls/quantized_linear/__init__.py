"""Quantized linear layers (contract: harness/contracts/quantized_linear.py).

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from llm_inference_harness.impls.quantized_linear import (  # noqa: F401 - imported to register
    batch_invariant,
    llm_int8,
    mutants,
    mutants_batch,
    smoothquant,
    w8a8,
    w8a8_emulated,
    weight_only,
)
