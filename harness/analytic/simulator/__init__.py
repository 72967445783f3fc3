"""Serving simulator: continuous batching under reserve-max, oracle-contiguous and paged memory policies.

``python -m llm_inference_harness.analytic.simulator`` prints both canned scenarios side by side with the numbers
recorded when they were written.
"""
