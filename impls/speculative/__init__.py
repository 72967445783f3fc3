"""speculative implementations.

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from impls.speculative import (  # noqa: F401 - imported to register
    adaptive,
    autoregressive,
    batched,
    cached,
    greedy,
    multidraft,
    mutants,
    own_rng,
    standard,
)
