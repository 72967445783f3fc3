"""The checking engine: run a technique's properties against implementations and turn outcomes into verdicts.

Properties are ordinary Hypothesis tests in the technique's property modules (``Technique.properties``) that
take an ``impl`` argument; pytest parametrizes them over the registry (harness/engine/pytest_plugin.py) and this
engine calls them directly for ``harness check`` / ``mutants`` / ``run`` and the report.  A
property may declare when it applies with `@applies(...)`; an implementation it does not apply to -- one
whose declared devices are all absent here, or that lacks a capability -- gets a skip verdict carrying the
reason.

`check` and `kill_mutants` run each implementation in child processes of its own (harness/engine/isolation.py; `check`
with several workers shares an implementation's properties among a few, `_parts`): a plugin is imported there,
never in the caller, and whatever it does -- raise, hang, exit, crash, print, exhaust memory -- becomes a verdict
while the others go on.  Progress reaches the caller through a callback.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from llm_inference_harness.contracts import technique as get_technique
from llm_inference_harness.engine import environment, isolation
from llm_inference_harness.engine.devices import unavailable_reason
from llm_inference_harness.engine.guard import hang_message
from llm_inference_harness.engine.inputs import UsageError
from llm_inference_harness.engine.laws import law, shrinking
from llm_inference_harness.engine.plugins import LoadFailure, PluginLoadError
from llm_inference_harness.engine.registry import KNOWN_FAILURES, Impl
from llm_inference_harness.engine.registry import info as _info


@dataclass(frozen=True)
class Property:
    name: str  # the test's name without "test_"
    fn: Callable
    module: str

    def skip_reason(self, impl: Impl) -> str | None:
        for predicate in [unavailable_reason, *getattr(self.fn, "harness_applies", [])]:
            reason = predicate(impl)
            if reason:
                return reason
        return None


@dataclass
class Verdict:
    impl: str
    property: str
    status: str  # "pass" | "FAIL" | "skip" | "upstream" (a recorded library bug) | "stale" (its record no longer holds)
    message: str = ""
    counterexample: str = ""
    reproduce: str = ""
    seconds: float = 0.0
    output: str = ""  # what the implementation printed during the property (captured, truncated)
    margin: float | None = None  # for a FAIL of an earned bound: error / bound of the killing case

    def as_dict(self) -> dict:
        return asdict(self)


def properties_of(technique: str) -> list[Property]:
    """Every property of a technique, over all of its property modules, in module then definition order."""
    found = []
    for module_name in get_technique(technique).properties:
        module = importlib.import_module(module_name)
        for name, fn in vars(module).items():
            if name.startswith("test_") and callable(fn) and "impl" in inspect.signature(fn).parameters:
                found.append(Property(name.removeprefix("test_"), fn, module.__name__))
    return found


def select(props: list[Property], names: list[str] | None) -> list[Property]:
    """The properties named (all when ``names`` is empty); ValueError naming the unknown ones."""
    if not names:
        return props
    known = {p.name for p in props}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"--property: unknown {unknown}; known: {', '.join(sorted(known))}")
    return [p for p in props if p.name in names]


# --- one property, in the current process --------------------------------------------------------------------
def run_property(prop: Property, impl: Impl, *, profile: str, plugin: str | None = None,
                 blob: str | None = None, shrink: bool = True) -> Verdict:
    """Run one property against one implementation here; ``blob`` replays a failure Hypothesis printed.
    ``shrink=False`` reports the first failing example as found (a mutant's kill needs no minimal example);
    a known upstream failure is never shrunk: its record carries the minimal reproduction."""
    reason = prop.skip_reason(impl)
    if reason:
        return Verdict(impl.name, prop.name, "skip", message=reason)
    start = time.perf_counter()
    known = KNOWN_FAILURES.get((impl.technique, impl.name, prop.name))
    shrink = shrink and not known
    printed: list[str] = []  # a replayed example is reported, not attached to the exception
    from hypothesis import reporting

    try:
        with shrinking(shrink), reporting.with_reporter(printed.append) if blob else contextlib.nullcontext():
            law(prop, shrink=shrink, blob=blob)(impl=impl)
    except Exception as exc:  # noqa: BLE001 - any failure of the property is a verdict
        verdict = Verdict(
            impl.name, prop.name, "FAIL",
            message=citing_rules(impl.technique, prop.name, hang_message(impl.fn) or first_line(exc)),
            counterexample=counterexample(exc) or "\n".join(map(str, printed)).strip(),
            reproduce=reproduce_commands(impl.technique, impl.name, prop.name, profile, plugin, exc, blob),
            seconds=time.perf_counter() - start, margin=_margin(exc),
        )
        if known:
            verdict.status = "upstream"
            verdict.message = (f"known upstream failure of {known.library} {known.version} "
                               f"({_installed(known.library)} installed): {known.what}; this run: {verdict.message}")
            verdict.counterexample = f"{verdict.counterexample}\n\nminimal reproduction:\n{known.reproduce}".strip()
        return verdict
    finally:
        from llm_inference_harness.engine.boundary import release_cpus

        release_cpus()  # a state machine's batches kept this process and the implementation's on one CPU
    if known:
        return Verdict(impl.name, prop.name, "stale", seconds=time.perf_counter() - start,
                       message=f"the recorded upstream failure of {known.library} {known.version} no longer reproduces "
                               f"with {_installed(known.library)}: {known.what}; update or remove the record")
    return Verdict(impl.name, prop.name, "pass", seconds=time.perf_counter() - start)


def _installed(library: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{library} {version(library)}"
    except PackageNotFoundError:
        return f"{library} (version unknown)"


def contract_rules(technique: str, prop: str) -> str:
    """The clauses of the technique's contract that property ``prop`` judges, in words (harness/contracts: `Rule`)."""
    return "; ".join(r.cite(technique) for r in get_technique(technique).rules_of(prop))


def citing_rules(technique: str, prop: str, message: str) -> str:
    """A failure's message, followed by the contract rules its property judges: which promise broke."""
    rules = contract_rules(technique, prop)
    return f"{message} [{rules}]" if rules else message


def reproduce_command(technique: str, impl: str, prop: str, profile: str, plugin: str | None,
                      blob: str | None = None) -> str:
    source = f"--plugin {plugin}" if plugin else f"--impl {impl}"
    line = f"harness check {technique} {source} --property {prop} --profile {profile}"
    return line + (f" --reproduce {blob}" if blob else "")


def reproduce_commands(technique: str, impl: str, prop: str, profile: str, plugin: str | None, exc: BaseException,
                       blob: str | None = None) -> str:
    """A failure's reproduce line, or one line per distinct failure where Hypothesis found several (an
    ExceptionGroup), in the order `counterexample` numbers them, each replaying its own example; ``blob``, the
    example replayed, where the exception printed none."""
    blobs = list(dict.fromkeys(failure_blobs(exc))) or [blob]
    return "\n".join(reproduce_command(technique, impl, prop, profile, plugin, b) for b in blobs)


def first_line(exc: BaseException) -> str:
    from llm_inference_harness.engine.guard import BoundaryFailure

    if isinstance(exc, BoundaryFailure):  # "crashed: ...", "hung: ...": the words of a stopped process
        return str(exc).strip().splitlines()[0][:400]
    if isinstance(exc, BaseExceptionGroup):  # Hypothesis found several distinct failures: name the first
        if len(exc.exceptions) == 1:
            return first_line(exc.exceptions[0])
        return f"{len(exc.exceptions)} distinct failures; the first: {first_line(exc.exceptions[0])}"[:400]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


_ADVICE = ("These lines were always", "Explanation:", "/", "You can reproduce this", "@reproduce_failure",
           "Unreliable assumption")


def counterexample(exc: BaseException) -> str:
    """The failing example Hypothesis attached to the exception (one per failure when it found several),
    without its advice to edit a test function: a plugin author has none, the reproduce line replays it."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return counterexample(exc.exceptions[0])
    if isinstance(exc, BaseExceptionGroup):
        return "\n\n".join(f"failure {i} of {len(exc.exceptions)}: {first_line(sub)}\n{counterexample(sub)}"
                           for i, sub in enumerate(exc.exceptions, 1))
    notes = [n for n in getattr(exc, "__notes__", []) if not n.lstrip().startswith(_ADVICE)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(notes)).strip()


def failure_blobs(exc: BaseException) -> list[str]:
    """``VERSION:BLOB`` of each ``@reproduce_failure(...)`` Hypothesis printed, one per distinct failure."""
    found = []
    for sub in exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,):
        for n in getattr(sub, "__notes__", []):
            m = re.search(r"@reproduce_failure\('([^']+)', b'([^']+)'\)", n)
            if m:
                found.append(f"{m.group(1)}:{m.group(2)}")
                break
    return found


def _margin(exc: BaseException) -> float | None:
    for sub in exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,):
        if getattr(sub, "margin", None) is not None:
            return sub.margin
    return None


# --- whole checks, isolated ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What a child checks: a registered implementation (``name``) or a plugin spec, loaded only in the child."""

    technique: str
    name: str | None = None
    plugin: str | None = None  # MODULE:ATTR or FILE.py:ATTR

    @property
    def label(self) -> str:
        return self.plugin or self.name or "?"


@dataclass
class ImplResult:
    """One implementation's verdicts; ``info`` is what the child reported of the record it loaded."""

    target: Target
    info: dict = field(default_factory=dict)  # name, mutant, exact, killed_by, bug, caps, ...
    verdicts: list[Verdict] = field(default_factory=list)
    stopped: str = ""  # why its child stopped early, if it did
    load_error: dict = field(default_factory=dict)  # a plugin that could not be loaded: plugins.LoadFailure
    started: dict[str, float] = field(default_factory=dict)  # property -> monotonic time its child started it

    @property
    def name(self) -> str:
        return self.info.get("name") or self.target.label


class Progress:
    """Callbacks of a running check; the CLI prints them, the report and tests may ignore them."""

    def loaded(self, target: Target, info: dict) -> None: ...

    def started(self, target: Target, prop: str) -> None: ...

    def finished(self, target: Target, verdict: Verdict) -> None: ...

    def note(self, target: Target, text: str) -> None: ...

    def tick(self) -> None:
        """Called every few tens of milliseconds while children run."""


def check(technique: str, targets: list[Target], *, profile: str, properties: list[str] | None = None,
          jobs: int = 1, progress: Progress | None = None, blob: str | None = None,
          limits: isolation.Limits | None = None, shrink: bool = True) -> list[ImplResult]:
    """Every selected property of ``technique`` against each target, each part of its properties (`_parts`) in a child
    (``shrink=False``: each failure's first example, as found)."""
    props = select(properties_of(technique), properties)
    names = [p.name for p in props]

    def job(target: Target, part: list[str]) -> Callable[[], None]:
        return lambda: _check_in_child(target, part, profile, blob, shrink, one_thread=jobs > 1)

    return _run(technique, targets, names, jobs, progress or Progress(), limits, job, profile,
                parts=_parts(names, len(targets), jobs))


def kill_mutants(technique: str, *, profile: str, jobs: int = 1, progress: Progress | None = None,
                 all_properties: bool = False, limits: isolation.Limits | None = None,
                 names: list[str] | None = None) -> list[ImplResult]:
    """Every registered mutant of ``technique`` (or those ``names``) against its properties, its declared killers
    first, stopping at the first that kills it for its reason (``all_properties``: every property, the whole kill
    matrix)."""
    from llm_inference_harness.engine.registry import impls

    targets = [Target(technique, name=m.name) for m in impls(technique, mutants=True)
               if names is None or m.name in names]
    names = [p.name for p in properties_of(technique)]

    def job(target: Target, part: list[str]) -> Callable[[], None]:
        return lambda: _mutant_in_child(target, part, profile, all_properties, one_thread=jobs > 1)

    return _run(technique, targets, names, jobs, progress or Progress(), limits, job, profile, parts=[names])


# Set (to "1") by `--trusted-in-process` and `--harness-trusted-in-process`: the implementation runs in the judge's
# own process, where it could change its own verdicts -- for one's own code, never for code under judgement.
TRUSTED_IN_PROCESS = "HARNESS_TRUSTED_IN_PROCESS"


def trusted_in_process() -> bool:
    return environment.value(TRUSTED_IN_PROCESS)


# Importing a plugin and registering it (torch, transformers, a JIT build) takes seconds; a module that sleeps
# or blocks at import is stopped here, not at the per-implementation limit of its whole check.
def import_limit_s() -> float:
    """HARNESS_IMPORT_LIMIT_S, else 180 (llm_inference_harness.engine.environment)."""
    return environment.value("HARNESS_IMPORT_LIMIT_S")


def _parts(names: list[str], targets: int, jobs: int) -> list[list[str]]:
    """The properties cut into parts, each part of each implementation checked in a child of its own, so that
    ``jobs`` children keep busy until the end: about two parts per worker in all (one plugin and two cores: two
    parts per core).  A part takes every k-th property, the costliest (a technique's state machines come first)
    spread over the parts; block_manager's two implementations, whole, ended 0.5 s apart.  An implementation that
    hangs or crashes stops its part's later properties, not the other parts' (each has its own limits)."""
    k = max(1, min(len(names), -(-2 * jobs // max(1, targets)))) if jobs > 1 else 1
    return [names[i::k] for i in range(k)]


def _run(technique, targets, names, jobs, progress, limits, job, profile, parts) -> list[ImplResult]:
    results = {t: ImplResult(t) for t in targets}

    def on_event(key: tuple[Target, int], kind: str, payload) -> None:
        target = key[0]
        result = results[target]
        if kind == "impl":
            result.info = payload
            progress.loaded(target, payload)
        elif kind == "start":
            result.started[payload] = time.monotonic()
            progress.started(target, payload)
        elif kind == "verdict":
            result.verdicts.append(payload)
            progress.finished(target, payload)
        elif kind == "note":
            progress.note(target, payload)
        elif kind == "load_error":
            result.load_error = payload
            if payload.get("fault") == "command":  # the spec names nothing loadable: stop everything, as for a typo
                raise UsageError(f"--plugin {target.plugin}: {payload['exception']}")

    limits = limits or isolation.Limits(start_s=import_limit_s() + 10)  # the judge's own wait on the import ends first
    children = [((t, i), job(t, part)) for i, part in enumerate(parts) for t in targets]  # the costliest parts first
    outcomes = isolation.run_all(children, workers=jobs, limits=limits, on_event=on_event, on_tick=progress.tick)
    for (target, i), outcome in sorted(outcomes.items(), key=lambda item: item[0][1]):  # parts in order
        result = results[target]
        result.stopped = result.stopped or outcome.stopped
        if outcome.stopped:
            for verdict in _unfinished(result, parts[i], outcome, profile):
                result.verdicts.append(verdict)
                progress.finished(target, verdict)
    order = {name: i for i, name in enumerate(names)}
    for result in results.values():
        result.verdicts.sort(key=lambda v: order.get(v.property, len(names)))
    return [results[t] for t in targets]


def _unfinished(result: ImplResult, names: list[str], outcome: isolation.Outcome, profile: str) -> list[Verdict]:
    """FAIL verdicts for the properties a child never finished: the one it was running says why it stopped,
    the later ones that they were not run (an implementation that hung once is not given the chance again)."""
    done = {v.property for v in result.verdicts}
    running = [p for p in isolation.events(outcome, "start") if p not in done]
    seconds = outcome.ended - result.started.get(running[0], outcome.ended) if running else 0.0
    where = "while importing and registering it" if not result.info else ""
    failure = result.load_error
    verdicts = []
    for name in names:
        if name in done:
            continue
        current = name in running or (not running and not verdicts)
        if failure:  # said once: an earlier part of the same implementation said it already
            current = current and not result.verdicts
            message = str(LoadFailure(**failure)) if current else "not run: the plugin could not be loaded"
        else:
            message = outcome.stopped + (f" ({where})" if where else "") if current else (
                f"not run: the implementation's process stopped in {running[0] if running else 'loading'} "
                f"({outcome.stopped.split(':')[0]})")
        plugin = result.target.plugin
        output = failure.get("trace", "") if failure else outcome.output  # a load failure: no harness traceback
        verdicts.append(Verdict(result.name, name, "FAIL", message=message, seconds=seconds if current else 0.0,
                                output=output if current else "",
                                reproduce=reproduce_command(result.target.technique, result.name, name, profile,
                                                            plugin)))
    return verdicts


# --- what the children run -----------------------------------------------------------------------------------
def _load(target: Target) -> Impl:
    if target.plugin:
        from llm_inference_harness.engine.plugins import load_plugin

        return load_plugin(target.plugin, target.technique)
    from llm_inference_harness.engine.registry import get

    return get(target.technique, target.name)


def verdicts_of(impl: Impl, props: list[Property], *, profile: str, plugin: str | None = None,
                blob: str | None = None, shrink: bool = True) -> Iterator[Verdict]:
    """Each property's verdict, in order, run here (in a child, each announced to the parent first)."""
    _, offset = isolation.output_since(0)
    for prop in props:
        isolation.send("start", prop.name)
        verdict = run_property(prop, impl, profile=profile, plugin=plugin, blob=blob, shrink=shrink)
        if not shrink and prop.name in impl.killed_by and "ContractViolation: raised " in verdict.message:
            verdict = run_property(prop, impl, profile=profile, plugin=plugin, blob=blob)  # a crash: shrink
        verdict.output, offset = isolation.output_since(offset)
        isolation.send("verdict", verdict)
        yield verdict


def kill_mutant(mutant: Impl, props: list[Property], *, profile: str, all_properties: bool) -> list[Verdict]:
    """The mutant's declared killers first; without ``all_properties``, stop at the first that kills it for its
    reason.  Unshrunk: the first failing example is the kill.  Where that example made the mutant raise, the
    property is run again with shrinking, which may reach the bug it computes (a crash is not a kill for its
    reason, so the next declared killer is tried)."""
    ordered = sorted(props, key=lambda p: p.name not in mutant.killed_by)
    verdicts = []
    for verdict in verdicts_of(mutant, ordered, profile=profile, shrink=False):
        verdicts.append(verdict)
        if not all_properties and verdict.status == "FAIL" and verdict.property in mutant.killed_by and not (
                _broke(verdict)):
            break
    return verdicts


def _check_in_child(target: Target, names: list[str], profile: str, blob: str | None, shrink: bool,
                    one_thread: bool) -> None:
    impl = _start_child(target, profile, one_thread)
    props = [p for p in properties_of(target.technique) if p.name in names]
    for _ in verdicts_of(impl, props, profile=profile, plugin=target.plugin, blob=blob, shrink=shrink):
        pass


def _mutant_in_child(target: Target, names: list[str], profile: str, all_properties: bool, one_thread: bool) -> None:
    mutant = _start_child(target, profile, one_thread)
    kill_mutant(mutant, [p for p in properties_of(target.technique) if p.name in names], profile=profile,
                all_properties=all_properties)


def _start_child(target: Target, profile: str, one_thread: bool, trusted: bool = False) -> Impl:
    """Start the implementation's process (before this process computes anything), quiet Hypothesis's own
    printing (the verdict carries the example), load the profile; the target is loaded over there, or here
    when ``trusted`` (the in-process path, for one's own code)."""
    from hypothesis import reporting

    from llm_inference_harness.engine.profiles import load

    impl = _loaded_here(target) if trusted or trusted_in_process() else _opened(target, one_thread)
    reporting.reporter.default = lambda value: None
    if one_thread:  # children share the cores: intra-op threads would only spin against each other
        import torch

        torch.set_num_threads(1)
    load(profile)
    isolation.send("impl", _info(impl))
    return impl


def _loaded_here(target: Target) -> Impl:
    try:
        return _load(target)
    except PluginLoadError as exc:
        _report_load_error(asdict(exc.failure))
        raise


def _report_load_error(failure: dict) -> None:
    """What the plugin printed while being imported, then its part of the traceback."""
    printed, _ = isolation.output_since(0)
    isolation.send("load_error", {**failure, "trace": (printed + failure["trace"]).strip()})


def _opened(target: Target, one_thread: bool) -> Impl:
    """`open_isolated`, its failures reported as the child's reason to stop (as when a plugin crashed or raised
    while this process imported it)."""
    from llm_inference_harness.engine.guard import BoundaryFailure

    try:
        return open_isolated(target, one_thread=one_thread)
    except BoundaryFailure as exc:
        raise isolation.Stopped(str(exc)) from None
    except LoadError as exc:
        if exc.failure:
            _report_load_error(exc.failure)
        raise isolation.Stopped(f"error: {exc}") from None


class LoadError(Exception):
    """The implementation's process could not load the target: its import or its declaration raised;
    ``failure``: a llm_inference_harness.engine.plugins.LoadFailure's fields when that target was a plugin."""

    def __init__(self, text: str, failure: dict | None = None) -> None:
        super().__init__(text)
        self.failure = failure


def open_isolated(target: Target, *, one_thread: bool, spawn=None) -> Impl:
    """The target loaded in a process of its own (harness/engine/boundary.py); here, a record of what it declared
    whose ``fn`` is a proxy.  RuntimeError naming the file, line and exception when loading it failed."""
    from llm_inference_harness.engine import callserver
    from llm_inference_harness.engine.boundary import LoadFailed, PluginProcess
    from llm_inference_harness.engine.registry import make_impl

    load = {"technique": target.technique, "name": target.name, "plugin": target.plugin}
    process = PluginProcess.start(load, callserver.serve, capture=isolation.capture_path(),
                                  memory_bytes=isolation.memory_limit(), one_thread=one_thread, spawn=spawn)
    try:
        started = process.hello(import_limit_s())
    except LoadFailed as exc:
        process.close()
        raise LoadError(f"loading {target.label} failed: {exc}", exc.failure) from None
    info = started.info
    fields = {k: info[k] for k in ("devices", "dtypes", "exact", "mutant", "killed_by", "bug", "cite", "caps",
                                   "source", "unavailable") if k in info}
    impl = make_impl(str(info["technique"]), str(info["name"]), started.fn, **fields)
    process.impl_fn, process.call_limit_s = started.fn, impl.caps.call_limit_s
    return impl


def mutant_status(result: ImplResult) -> tuple[bool, str]:
    """(killed for its declared reason, a one-line status) of a mutant's verdicts.  A kill counts only where the
    mutant computed its bug: a declared killer that failed because the mutant raised, crashed, hung or never ran
    says nothing about the bug it models."""
    killed_by = tuple(result.info.get("killed_by", ()))
    if why := not_run_here(result):
        return False, f"not run here: {why}"
    killers = [v.property for v in result.verdicts if v.status == "FAIL"]
    right = sorted({v.property for v in result.verdicts if v.status == "FAIL" and v.property in killed_by
                    and not _broke(v)})
    if right:
        return True, f"killed by {', '.join(right)}"
    broke = [v.property for v in result.verdicts if v.status == "FAIL" and v.property in killed_by and _broke(v)]
    if broke:
        return False, f"CRASHED instead of computing its bug in {', '.join(broke)}: {result.verdicts[0].message}"
    return False, f"SURVIVED its declared killers {killed_by}" + (f" (other failures: {killers})" if killers else "")


def not_run_here(result: ImplResult) -> str | None:
    """Why a mutant could not run on this machine (the library it wraps is not installed, no CUDA device), or
    None: such a mutant is neither killed nor a survivor, and is counted apart."""
    return result.info.get("unavailable") or None


def _broke(verdict: Verdict) -> bool:
    """The property failed because the implementation raised, crashed, hung or was not run."""
    return verdict.message.startswith(("crashed:", "hung:", "not run:", "error:", "stopped:")) or (
        "ContractViolation: raised " in verdict.message)
