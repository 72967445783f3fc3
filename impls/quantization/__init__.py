"""Quantizers (contract: harness/contracts/quantization.py).

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from llm_inference_harness.impls.quantization import (  # noqa: F401 - imported to register
    absmax,
    fake_quant,
    mutants,
    zeropoint,
)
