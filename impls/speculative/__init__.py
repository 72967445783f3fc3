"""speculative implementations.

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from llm_inference_harness.impls.speculative import (  # noqa: F401 - imported to register
    adaptive,
    autoregressive,
    batch_invariant,
    batched,
    cached,
    greedy,
    multidraft,
    mutants,
    mutants_batch,
    own_rng,
    standard,
)
