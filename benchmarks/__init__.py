"""The asv suite, one bench_<technique>.py per technique.  asv and `harness compare` run it against older
commits too; before the import name llm_inference_harness, old_layout answers its names with the old modules."""

from benchmarks import old_layout

old_layout.install()
