"""sampling implementations.

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from llm_inference_harness.impls.sampling import (  # noqa: F401 - imported to register
    batched,
    gumbel_max,
    mutants,
    reference,
    rejection,
    sort_based,
    triton_fused,
)
