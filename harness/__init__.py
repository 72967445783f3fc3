"""A benchmark and property-testing harness for efficient LLM inference.

Users run the property tests, plug in their own implementation of a technique's contract, and
view asv dashboards.  See README.md.
"""

# The folder harness/ imported under its own name (the repository root on sys.path) would be a second
# copy of every module beside llm_inference_harness's.
if __name__ != "llm_inference_harness":
    raise ImportError(f"import llm_inference_harness, not {__name__} (the folder harness/ is installed as that)")

from llm_inference_harness.engine.plugins import declare
from llm_inference_harness.engine.registry import Impl, register

__all__ = ["Impl", "declare", "register"]
