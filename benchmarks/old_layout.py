"""Benchmarks of commits from before the import name llm_inference_harness: their code is the package ``harness``
(and ``impls``).  asv and the benchmark worker run *this* suite against every commit, so where
``llm_inference_harness`` is not installed, its names resolve to the old modules, e.g.
``llm_inference_harness.engine.registry`` to ``harness.registry``.  Standard library only."""

import importlib
import importlib.abc
import importlib.util
import sys

TOP = "llm_inference_harness"
# new name -> old name, for every module that moved in the restructure (a wing maps to the old flat package)
OLD_NAMES = {
    'llm_inference_harness': 'harness',
    'llm_inference_harness.__main__': 'harness.__main__',
    'llm_inference_harness.analytic': 'harness',
    'llm_inference_harness.analytic.checkpointing': 'harness.checkpointing',
    'llm_inference_harness.analytic.iomodel': 'harness.iomodel',
    'llm_inference_harness.analytic.kvsize': 'harness.kvsize',
    'llm_inference_harness.analytic.quant_experiments': 'harness.quant_experiments',
    'llm_inference_harness.analytic.roofline': 'harness.roofline',
    'llm_inference_harness.analytic.simulator': 'harness.simulator',
    'llm_inference_harness.bench': 'harness',
    'llm_inference_harness.bench.asvrun': 'harness.asvrun',
    'llm_inference_harness.bench.benchworker': 'harness.benchworker',
    'llm_inference_harness.bench.calibrated': 'harness.calibrated',
    'llm_inference_harness.bench.compare': 'harness.compare',
    'llm_inference_harness.bench.dashboard': 'harness.dashboard',
    'llm_inference_harness.bench.design': 'harness.bench.design',
    'llm_inference_harness.bench.history': 'harness.history',
    'llm_inference_harness.bench.quickbench': 'harness.quickbench',
    'llm_inference_harness.bench.report': 'harness.report',
    'llm_inference_harness.bench.results': 'harness.bench.results',
    'llm_inference_harness.bench.steps': 'harness.bench.steps',
    'llm_inference_harness.cli': 'harness.cli',
    'llm_inference_harness.contracts': 'harness.contracts',
    'llm_inference_harness.engine': 'harness',
    'llm_inference_harness.engine.batch_invariance': 'harness.batch_invariance',
    'llm_inference_harness.engine.boundary': 'harness.engine.boundary',
    'llm_inference_harness.engine.callserver': 'harness.engine.callserver',
    'llm_inference_harness.engine.capabilities': 'harness.capabilities',
    'llm_inference_harness.engine.devices': 'harness.devices',
    'llm_inference_harness.engine.enumeration_pool': 'harness.engine.enumeration_pool',
    'llm_inference_harness.engine.exampledb': 'harness.engine.exampledb',
    'llm_inference_harness.engine.executors': 'harness.engine.executors',
    'llm_inference_harness.engine.guard': 'harness.guard',
    'llm_inference_harness.engine.inputs': 'harness.engine.inputs',
    'llm_inference_harness.engine.isolation': 'harness.isolation',
    'llm_inference_harness.engine.measure': 'harness.engine.measure',
    'llm_inference_harness.engine.memory': 'harness.memory',
    'llm_inference_harness.engine.merge': 'harness.engine.merge',
    'llm_inference_harness.engine.mutation': 'harness.engine.mutation',
    'llm_inference_harness.engine.outputs': 'harness.engine.outputs',
    'llm_inference_harness.engine.plugins': 'harness.plugins',
    'llm_inference_harness.engine.profiles': 'harness.profiles',
    'llm_inference_harness.engine.progress': 'harness.progress',
    'llm_inference_harness.engine.provenance': 'harness.provenance',
    'llm_inference_harness.engine.pytest_plugin': 'harness.pytest_plugin',
    'llm_inference_harness.engine.registry': 'harness.registry',
    'llm_inference_harness.engine.runner': 'harness.runner',
    'llm_inference_harness.engine.scale': 'harness.engine.scale',
    'llm_inference_harness.engine.tolerance': 'harness.tolerance',
    'llm_inference_harness.engine.units': 'harness.engine.units',
    'llm_inference_harness.engine.wire': 'harness.engine.wire',
    'llm_inference_harness.engine.zygote': 'harness.engine.zygote',
    'llm_inference_harness.impls': 'impls',
    'llm_inference_harness.impls.external.hf_models': 'harness.models.hf',
    'llm_inference_harness.models': 'harness.models',
    'llm_inference_harness.numerics': 'harness',
    'llm_inference_harness.numerics.fixed_order': 'harness.fixed_order',
    'llm_inference_harness.numerics.online_softmax': 'harness.online_softmax',
    'llm_inference_harness.properties': 'properties',
    'llm_inference_harness.references': 'harness.references',
    'llm_inference_harness.sampling': 'harness',
    'llm_inference_harness.sampling.drafts': 'harness.drafts',
    'llm_inference_harness.sampling.enumeration': 'harness.enumeration',
    'llm_inference_harness.sampling.lm': 'harness.lm',
    'llm_inference_harness.sampling.measure': 'harness.sampling',
    'llm_inference_harness.sampling.replay': 'harness.replay',
    'llm_inference_harness.sampling.speedup': 'harness.speedup',
    'llm_inference_harness.sampling.statistical': 'harness.statistical',
    'llm_inference_harness.strategies': 'harness.strategies',
}


def old_name(name: str) -> str | None:
    """The pre-restructure module that ``name`` (under llm_inference_harness) was, by its longest known prefix."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in OLD_NAMES:
            return ".".join([OLD_NAMES[prefix], *parts[i:]])
    return None


class OldLayout(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers for llm_inference_harness.* with the old module: the alias and the old name are one module."""

    def find_spec(self, fullname, path=None, target=None):
        old = old_name(fullname) if fullname == TOP or fullname.startswith(TOP + ".") else None
        if old == "harness" and fullname != TOP:  # a wing: a package of its own, its modules found here
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        try:
            found = old is not None and importlib.util.find_spec(old) is not None
        except ImportError:
            found = False
        return importlib.util.spec_from_loader(fullname, self) if found else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if old_name(module.__name__) != "harness" or module.__name__ == TOP:
            # the import system returns whatever sys.modules holds under the name once this returns
            sys.modules[module.__name__] = importlib.import_module(old_name(module.__name__))


def install() -> None:
    """Resolve the new names to the old modules, where the new ones are not installed (an old commit)."""
    if importlib.util.find_spec(TOP) is None and not any(isinstance(f, OldLayout) for f in sys.meta_path):
        sys.meta_path.insert(0, OldLayout())  # first: the path finder would load a second copy from the old folder
