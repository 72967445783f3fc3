"""Benchmark plumbing: what times code and what stores or reads the timings.

``results`` is the one definition of where benchmark results live (the committed results/<machine>/, this
machine's ignored folder, the dashboard's and the report's folders) and of what a result file holds; ``steps``
finds where the committed history moves and has the A/B comparison (llm_inference_harness.bench.compare) check each step.  Modules
here may import llm_inference_harness.engine.provenance, the benchmark plumbing beside them (llm_inference_harness.bench.asvrun, llm_inference_harness.bench.compare) and
the standard library; nothing of the checking engine.
"""
