"""Attention implementations (contract: harness/contracts/attention.py).

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from llm_inference_harness.impls.attention import (  # noqa: F401 - imported to register
    batch_invariant,
    fa1,
    fa2,
    fa2_lazy,
    fa2_optimistic,
    flex,
    mutants,
    mutants_batch,
    mutants_splitk,
    naive,
    reference,
    sdpa,
    splitk_decode,
    tiled,
    triton_fa2,
)
