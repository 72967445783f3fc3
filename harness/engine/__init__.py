"""The checking engine: the registry and capabilities, the runner, the isolation of children, the boundary
between the judge and the implementation's process (boundary, callserver, wire), the guard around calls, where
results go (outputs: every result file checked before the work starts and written whole; inputs: every file the
harness reads back, validated, each error naming the file and what is wrong with it), and runs built from many
checks (mutation: machine-made mutants of impls/ and the README's example plugins, each judged by its technique's
check, scored per technique and per implementation)."""
