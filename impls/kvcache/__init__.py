"""KV-cache decoders (contract: harness/contracts/kvcache.py).

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from impls.kvcache import (  # noqa: F401 - imported to register
    concat,
    int8,
    mutants,
    paged,
    recompute,
    static,
)
