"""A benchmark and property-testing harness for efficient LLM inference.

Users run the property tests, plug in their own implementation of a technique's contract, and
view asv dashboards.  See README.md.
"""

from llm_inference_harness.engine.plugins import declare
from llm_inference_harness.engine.registry import Impl, register

__all__ = ["Impl", "declare", "register"]
