"""``python -m llm_inference_harness.analytic.simulator [--impl NAME] [--no-progress]``: both scenarios, with their
recorded numbers."""

import argparse

from llm_inference_harness.analytic.simulator.report import block_size_sweep, run_scenario, table

p = argparse.ArgumentParser(prog="python -m llm_inference_harness.analytic.simulator", description=__doc__)
p.add_argument("--impl", default="vllm_style", help="registered block manager behind the paged policies")
p.add_argument("--no-progress", action="store_true")
args = p.parse_args()
for name in ("a", "b"):
    print(table(name, run_scenario(name, progress=not args.no_progress, impl=args.impl)), end="\n\n")
print("block-size sweep, scenario (a): allocated-but-unused slots per running request (expect ~ (block - 1) / 2)")
for bs, waste in block_size_sweep("a", impl=args.impl):
    print(f"  block {bs:>3}: {waste:7.1f} tokens   (block - 1) / 2 = {(bs - 1) / 2:.1f}")
