"""Paged attention implementations (contract: harness/contracts/paged_attention.py).

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from llm_inference_harness.impls.paged_attention import (  # noqa: F401 - imported to register
    batch_invariant,
    blockwise,
    compiled,
    gather,
    mutants,
    mutants_batch,
)
