"""pytest plugin (entry point ``pytest11``): the harness's properties inside any project's pytest session.

In another project, after ``pip install llm-inference-harness``::

    pytest --pyargs llm_inference_harness.properties.test_attention --harness-impl attention=my_pkg.kernels:attention

runs every attention property against ``my_pkg.kernels.attention`` (a function, optionally marked with
`llm_inference_harness.declare`, or an `Impl` record), with pytest's normal reporting: one test per property, a visible
skip with its reason where the implementation does not declare what a property needs, node ids (and JUnit
classnames) naming the property module, test ids technique/implementation, and a failure naming the contract rule
its property judges and a reproduce line per distinct failure.  ``--harness-impl``
may be repeated (several implementations or techniques); ``--harness-profile dev|ci|thorough`` picks the
Hypothesis profile (default ci).  Without ``--harness-impl`` a property is parametrized over the registered
implementations of its technique (this project's own test suite).

Each implementation runs in a process of its own, as under ``harness check`` (harness/engine/boundary.py): this
pytest process is the judge and never imports the module ``--harness-impl`` names.  The processes are forked by
a zygote this plugin starts at configure time, before any test has computed anything.
``--harness-trusted-in-process`` (or HARNESS_TRUSTED_IN_PROCESS=1) runs them inside the pytest process instead:
for one's own code only, where a crash may take the session down and the code can reach the judge.

The plugin does nothing to a session that collects none of the harness's property modules.  Those are imported by
their package name wherever they are collected from: from a checkout (``pytest properties``), pytest would import
properties/test_attention.py under the top-level name of its folder, a second name (which fails on purpose).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from pathlib import Path

import pytest

from llm_inference_harness.engine.profiles import PROFILES


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "llm-inference-harness properties")
    group.addoption("--harness-impl", action="append", default=[], metavar="TECHNIQUE=MODULE:ATTR",
                    help="check this implementation (a module attribute or FILE.py:ATTR), not the registered ones")
    group.addoption("--harness-profile", choices=PROFILES, default=None,
                    help="Hypothesis profile for the harness's properties (default: ci with --harness-impl)")
    group.addoption("--harness-trusted-in-process", action="store_true",
                    help="run implementations inside this pytest process: only for code you trust (by default each "
                         "runs in a process of its own, which cannot reach the judge)")


@functools.cache
def _properties_folder() -> Path:
    import llm_inference_harness.properties as laws

    return Path(laws.__file__).resolve().parent


def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """properties/ as a plain folder: a package collector would import its __init__ as ``properties``."""
    return pytest.Dir.from_parent(parent, path=path) if path.resolve() == _properties_folder() else None


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path.resolve().parent == _properties_folder():
        return PropertyModule.from_parent(parent, path=module_path, nodeid=_node_id(module_path, parent.config))
    return None


def _node_id(module_path: Path, config: pytest.Config) -> str | None:
    """A module collected from an installed wheel (``--pyargs``) gets its path in the package as node id
    (``llm_inference_harness/properties/test_attention.py``, JUnit classname
    ``llm_inference_harness.properties.test_attention``): outside the rootdir pytest's would be empty -- test ids
    ``::test_x[...]`` and an empty JUnit classname, one undivided list on a CI dashboard --, and in a virtual
    environment inside the project a path through it (``.venv.lib.python3.11.site-packages...``).  In a checkout
    pytest's own id stands."""
    installed = {"site-packages", "dist-packages"} & set(module_path.resolve().parts)
    if not installed and module_path.resolve().is_relative_to(config.rootpath.resolve()):
        return None
    return f"llm_inference_harness/properties/{module_path.name}"


class PropertyModule(pytest.Module):
    """A property module, imported once, by its name in the package (the runner imports the same module)."""

    def _getobj(self):
        return importlib.import_module(f"llm_inference_harness.properties.{self.path.stem}")


def pytest_configure(config: pytest.Config) -> None:
    from llm_inference_harness.engine import environment
    from llm_inference_harness.engine.profiles import load
    from llm_inference_harness.engine.runner import trusted_in_process

    try:
        environment.check()  # a bad HARNESS_* value: pytest's one-line usage error, before any test
    except environment.BadVariable as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.getoption("--harness-impl"):
        _downstream(config)
    if not (config.getoption("--harness-trusted-in-process") or trusted_in_process()):
        config.stash[_ISOLATED] = Isolated()  # the zygote forks now, before this process computes anything
    profile = config.getoption("--harness-profile") or ("ci" if config.getoption("--harness-impl") else None)
    if profile:
        load(profile, prefix="harness-")
    if config.getoption("--harness-impl"):
        config.stash[_CHOSEN] = _chosen(config.getoption("--harness-impl"), config.stash.get(_ISOLATED, None))
        config.stash[_PROFILE] = profile


def _downstream(config: pytest.Config) -> None:
    """Another project's session judging its own implementation: its folder importable as `python -m pytest` makes
    it (the `pytest` script does not put it on sys.path), and one intra-op thread here and in the implementation's
    process -- two processes of torch's default threads spin against each other on the same cores (36 s where
    `harness check` took 4.7 s)."""
    import torch

    here = str(config.invocation_params.dir)
    if here not in sys.path:
        sys.path.insert(0, here)
    torch.set_num_threads(1)


def pytest_unconfigure(config: pytest.Config) -> None:
    isolated = config.stash.get(_ISOLATED, None)
    if isolated is not None:
        isolated.close()


_CHOSEN = pytest.StashKey[dict]()
_PROFILE = pytest.StashKey[str]()
_ISOLATED = pytest.StashKey["Isolated"]()


class Isolated:
    """The implementations' processes of this session, forked by the zygote on first use and kept for the next
    tests (the latest KEPT of them), forked anew after one has died (a crash or a hang ends a test, not the rest)."""

    KEPT = 8  # each holds torch and its implementation: a few hundred MB, mostly shared with the zygote

    def __init__(self) -> None:
        from llm_inference_harness.engine.zygote import Zygote

        self.zygote = Zygote()
        self.impls: dict = {}

    def impl(self, technique: str, *, name: str | None = None, plugin: str | None = None):
        from llm_inference_harness.engine.runner import Target, open_isolated

        key = (technique, name, plugin)
        impl = self.impls.pop(key, None)
        if impl is not None and impl.fn.process.dead:
            impl.fn.process.close()
            impl = None
        if impl is None:
            impl = open_isolated(Target(technique, name=name, plugin=plugin), one_thread=True, spawn=self.zygote.spawn)
        self.impls[key] = impl  # the latest used last
        while len(self.impls) > self.KEPT:
            self.impls.pop(next(iter(self.impls))).fn.process.close()
        return impl

    def close(self) -> None:
        for impl in self.impls.values():
            impl.fn.process.close()
        self.zygote.close()


def _chosen(specs: list[str], isolated: Isolated | None) -> dict:
    """{technique: [Impl]} of the ``--harness-impl`` options (each loaded in its own process, unless trusted); a
    usage error names the bad one."""
    from llm_inference_harness.contracts import load_techniques
    from llm_inference_harness.engine.plugins import load_plugin

    if not os.environ.get("TRITON_INTERPRET"):
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"  # Triton kernels run under its CPU interpreter here
    chosen: dict[str, list] = {}
    for spec in specs:
        technique, sep, where = spec.partition("=")
        if not sep or technique not in load_techniques():
            raise pytest.UsageError(f"--harness-impl must be TECHNIQUE=MODULE:ATTR with TECHNIQUE one of "
                                    f"{', '.join(sorted(load_techniques()))}; got {spec!r}")
        try:
            impl = isolated.impl(technique, plugin=where) if isolated else load_plugin(where, technique)
            chosen.setdefault(technique, []).append((impl, where))
        except Exception as exc:
            raise pytest.UsageError(f"--harness-impl {spec}: {type(exc).__name__}: {exc}") from exc
    return chosen


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" not in metafunc.fixturenames:
        return
    technique = _technique_of(metafunc.function.__module__)
    if technique is None:
        return
    from llm_inference_harness.engine.registry import KNOWN_FAILURES, impls
    from llm_inference_harness.engine.runner import Property

    chosen = metafunc.config.stash.get(_CHOSEN, None)
    candidates = [impl for impl, _ in chosen.get(technique, [])] if chosen is not None else impls(technique)
    prop = Property(metafunc.function.__name__, metafunc.function, metafunc.function.__module__)
    cases = []
    for impl in candidates:
        reason = prop.skip_reason(impl)
        known = KNOWN_FAILURES.get((technique, impl.name, prop.name.removeprefix("test_")))
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        if known and not reason:  # strict: a recorded failure that stops reproducing fails the run, as `stale` does
            marks.append(pytest.mark.xfail(strict=True, reason=f"known upstream failure of {known.library} "
                                                               f"{known.version}: {known.what}"))
        cases.append(pytest.param(impl, id=f"{technique}/{impl.name}", marks=marks))  # node ids name both
    if not cases:
        cases = [pytest.param(None, id="none", marks=[pytest.mark.skip(
            reason=f"no {technique} implementation was given (--harness-impl {technique}=MODULE:ATTR)")])]
    metafunc.parametrize("impl", cases)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A known upstream failure runs without shrinking: the xfail needs one failing example, and shrinking one
    replays hundreds of variations (tens of seconds for a transformers model) to print nothing."""
    from llm_inference_harness.engine.laws import law, shrinking
    from llm_inference_harness.engine.registry import KNOWN_FAILURES
    from llm_inference_harness.engine.runner import Property

    impl = getattr(getattr(item, "callspec", None), "params", {}).get("impl")
    technique = _technique_of(getattr(item, "module", None).__name__) if impl is not None else None
    known = technique and KNOWN_FAILURES.get((technique, impl.name, item.originalname.removeprefix("test_")))
    isolated = item.config.stash.get(_ISOLATED, None)
    spec = next((where for chosen, where in item.config.stash.get(_CHOSEN, {}).get(technique, []) if chosen is impl),
                None)
    if technique and isolated is not None:  # the implementation's process: kept from an earlier test, or new
        item.funcargs["impl"] = isolated.impl(technique, plugin=spec) if spec else isolated.impl(technique,
                                                                                               name=impl.name)
    if known:
        item.obj = law(Property(item.originalname.removeprefix("test_"), item.obj, item.module.__name__),
                       shrink=False, blob=None)
    with shrinking(not known):
        try:
            return (yield)
        except BaseException as exc:
            if technique and isinstance(exc, Exception):  # a failure (not a skip): which promise the property judges
                _cite_the_contract(exc, technique, item.originalname.removeprefix("test_"))
            if spec:
                _advise_the_harness_command(exc, technique, spec, item.originalname.removeprefix("test_"),
                                            item.config.stash[_PROFILE])
            raise


def _cite_the_contract(exc: BaseException, technique: str, prop: str) -> None:
    from llm_inference_harness.engine.runner import contract_rules

    rules = contract_rules(technique, prop)
    if rules:
        exc.add_note(f"Contract: {rules}")


def _advise_the_harness_command(exc: BaseException, technique: str, spec: str, prop: str, profile: str) -> None:
    """Hypothesis ends a failure with "add @reproduce_failure(...) as a decorator on your test function": the
    test function is ours, in site-packages.  A downstream user gets the harness's command that replays the
    example instead (and rerunning the same pytest command finds it again: the ci profile is derandomized)."""
    from llm_inference_harness.engine.runner import reproduce_commands

    lines = reproduce_commands(technique, "", prop, profile, spec, exc).splitlines()  # one per distinct failure
    for sub in exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,):
        notes = getattr(sub, "__notes__", None)
        if notes is not None:
            notes[:] = [n for n in notes if "@reproduce_failure" not in n]
    for i, line in enumerate(lines, 1):
        exc.add_note(f"Reproduce{f' failure {i} of {len(lines)}' if len(lines) > 1 else ''}: {line}")


def _technique_of(module: str) -> str | None:
    """The technique whose property modules include ``module``, or None (not one of ours)."""
    from llm_inference_harness.contracts import load_techniques

    return next((t.name for t in load_techniques().values() if module in t.properties), None)
