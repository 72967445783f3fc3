"""Adapters of third-party libraries (contracts: harness/contracts/).

The entry point of these adapters (pyproject.toml, group harness.impls): importing the package registers every
module listed below; an adapter whose library is missing registers as unavailable, and every property skips it.
"""

from impls.external import (  # noqa: F401 - imported to register
    transformers_kv,
    transformers_kv_mutants,
)
