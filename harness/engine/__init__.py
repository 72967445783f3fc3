"""The checking engine: how the work of a check is cut into units (technique x implementation x property, and
mutants), where the units run (this machine's forked children, a shard of a CI matrix, a Ray cluster), how
their verdicts come back together, and the example database Hypothesis shares between runs."""
