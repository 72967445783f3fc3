"""The checking engine's wider uses: runs built from many `harness.runner.check` calls.  Today that is mutation
testing (`harness.engine.mutation`: machine-made mutants of impls/ and the README's example plugins, each judged
by its technique's check, scored per technique and per implementation).  Modules here may import the engine
(harness.runner, harness.isolation, harness.registry, harness.contracts, harness.profiles) and the standard
library; nothing under harness/ imports them, and they import nothing of impls/, properties/ or tests/ (they
read impls/ and docs/examples/ as source text)."""
