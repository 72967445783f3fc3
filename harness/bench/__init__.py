"""Everything that times, stores or shows timings: the asv runs (asvrun, quickbench), A/B comparisons and their
benchmark worker (compare, benchworker) and how the comparison's design was chosen (design), the backfilled
history and the steps in it the comparison checks (history, steps), where benchmark results live and what a
result file holds (results), the calibrated workload, the offline dashboard (dashboard, dashboard_assets/) and
the report (report/).

The top wing below the command line: it may import every other wing (where results come from is
llm_inference_harness.engine.provenance); none of them imports it.
"""
