"""The checking engine: the registry and capabilities, the runner, the isolation of children, the boundary
between the judge and the implementation's process (boundary, confine, callserver, wire, zygote), the guard around
calls;
where results go (outputs: every result file checked before the work starts and written whole; inputs: every
file the harness reads back, validated, each error naming the file and what is wrong with it; environment: the
HARNESS_* variables, one table, each validated before work starts) and where they come from (provenance: machine,
commit, output folder); how the work of a check is cut into units (technique x
implementation x property, and mutants), where the units run (this machine's forked children, a shard of a CI
matrix, a Ray cluster), how their verdicts come back together, and the example database Hypothesis shares between
runs; and runs built from many checks (mutation: machine-made mutants of impls/ and the README's example plugins,
each judged by its technique's check, scored per technique and per implementation).

Layers, bottom first (tests/test_structure.py holds the exact table; a module imports its own layer and those
below, never above):
  core -- capabilities, devices, tolerance, isolation, guard (with the proxies of objects in an implementation's
      process, which it calls), profiles, progress, memory, provenance, inputs, outputs, environment, exampledb, wire,
      confine (the implementation's process confined before it loads anything): imports numerics only.
  boundary -- above models and sampling (a call may carry the harness's generator); the child it forks runs what
      its caller hands in (the call server, the registry's probe): no import points up.
  registry, plugins -- above contracts: the registry validates a declaration against its technique's
      capabilities, so it imports the contracts; the contracts name `Impl` for type checking only.
  batch_invariance -- above strategies and references: the batch-invariance properties' shared comparisons.
  runner, laws, terminal, pytest_plugin, callserver, zygote -- above the properties, which they import by the module
      names each technique lists (the call server loads an implementation in its own process as the runner does;
      laws executes a property module afresh where a run needs its tests unshrunk or replaying a failure).
  units, executors, scale, merge, measure, enumeration_pool, mutation -- runs built from many checks, above the
      runner.
"""
