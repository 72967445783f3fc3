"""KV-cache decoders (contract: harness/contracts/kvcache.py).

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from llm_inference_harness.impls.kvcache import (  # noqa: F401 - imported to register
    batch_invariant,
    concat,
    int8,
    mutants,
    mutants_batch,
    paged,
    recompute,
    static,
)
