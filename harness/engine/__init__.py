"""The checking engine: the registry and capabilities, the runner, the isolation of children, the boundary
between the judge and the implementation's process (boundary, callserver, wire), the guard around calls; where
results go (outputs: every result file checked before the work starts and written whole; inputs: every file the
harness reads back, validated, each error naming the file and what is wrong with it); how the work of a check is
cut into units (technique x implementation x property, and mutants), where the units run (this machine's forked
children, a shard of a CI matrix, a Ray cluster), how their verdicts come back together, and the example database
Hypothesis shares between runs; and runs built from many checks (mutation: machine-made mutants of impls/ and the
README's example plugins, each judged by its technique's check, scored per technique and per implementation)."""
