"""Attention backward implementations (contract: harness/contracts/attention_backward.py).

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from llm_inference_harness.impls.attention_backward import (  # noqa: F401 - imported to register
    fa2,
    fa2_forward_lse,
    mutants,
    naive,
    reference,
    triton_fa2,
)
