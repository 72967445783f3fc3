"""Block managers (contract: harness/contracts/block_manager.py).

The entry point of this technique (pyproject.toml, group harness.impls): importing the package registers
every implementation and mutant listed below.
"""

from llm_inference_harness.impls.block_manager import (  # noqa: F401 - imported to register
    mutants,
    simple,
    vllm_style,
)
