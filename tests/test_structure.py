"""The harness's structure: dependencies point one way, capabilities are typed, implementations come in through
the entry-point group.

The import graph is read from the source (every import statement, at module level or inside a function), so
a lazy import that closes a cycle counts as one."""

import ast
import importlib.metadata
from pathlib import Path

import pytest

from llm_inference_harness.contracts import load_techniques
from llm_inference_harness.engine.capabilities import Caps, build
from llm_inference_harness.engine.registry import DISTRIBUTION, ENTRY_POINT_GROUP, make_impl, register

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = ("impls", "benchmarks", "properties", "tests")


def harness_modules() -> dict[str, Path]:
    mods = {}
    for path in (ROOT / "harness").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = path
    return mods


def imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    mods = harness_modules()

    def module_of(target: str) -> str | None:
        parts = target.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in mods), None)

    return {name: {m for t in imports(path) if (m := module_of(t)) and m != name} for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_harness_modules():
    assert cycles(import_graph()) == []


def test_cycles_finds_a_cycle():
    """The check above can fail: a two-module loop is reported."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_harness_imports_nothing_of_impls_benchmarks_properties_or_tests():
    bad = [(name, t) for name, path in harness_modules().items() for t in imports(path) if t.split(".")[0] in OUTSIDE]
    assert bad == []


def test_only_the_cli_parses_arguments():
    """The engine is a library call: no module builds an argparse Namespace by hand to drive another."""
    users = [name for name, path in harness_modules().items() if "Namespace(" in path.read_text()]
    assert users == []


def test_our_implementations_come_in_through_the_entry_point_group():
    ours = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            if ep.dist is not None and ep.dist.name == DISTRIBUTION}
    # one package per technique, and impls/external: the adapters of third-party libraries, of several techniques
    assert ours == {**{t: f"impls.{t}" for t in load_techniques()}, "external": "llm_inference_harness.impls.external"}


def test_every_implementation_module_is_listed_by_its_package():
    """A file in impls/<t>/ that its package does not import would register nothing."""
    for package in sorted((ROOT / "impls").iterdir()):
        if package.is_dir() and (package / "__init__.py").is_file():
            listed = (package / "__init__.py").read_text()
            missing = [p.stem for p in package.glob("*.py") if p.stem != "__init__" and f"    {p.stem}," not in listed]
            assert missing == [], f"impls/{package.name}/__init__.py does not import {missing}"


def test_a_misspelled_capability_is_rejected_naming_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown capability 'retuns_lse'.*returns_lse"):
        register("attention", "typo_kernel", caps={"retuns_lse": True})(lambda q, k, v, **kw: q)


def test_a_capability_of_the_wrong_type_is_rejected():
    with pytest.raises(TypeError, match=r"capability 'max_len' must be int \| None, got '300'"):
        make_impl("attention", "typed_kernel", lambda q, k, v, **kw: q, caps={"max_len": "300"})
    with pytest.raises(TypeError, match=r"capability 'symmetric' must be bool"):
        make_impl("quantization", "typed_quantizer", lambda w, **kw: w, caps={"symmetric": 1})


def test_an_unknown_field_or_device_is_rejected():
    with pytest.raises(TypeError, match=r"unknown field\(s\) \['dtype'\].*dtypes"):
        make_impl("attention", "typed_kernel", lambda q, k, v, **kw: q, dtype=("float32",))
    with pytest.raises(ValueError, match=r"devices \['gpu'\] are not among"):
        make_impl("attention", "typed_kernel", lambda q, k, v, **kw: q, devices=("gpu",))


def test_declared_capabilities_are_typed_attributes_with_defaults():
    impl = make_impl("attention", "typed_kernel", lambda q, k, v, **kw: q, caps={"max_len": 64})
    assert (impl.caps.max_len, impl.caps.returns_lse, impl.caps.call_limit_s) == (64, False, 20.0)
    assert impl.caps.declared() == {"max_len": 64}


@pytest.mark.parametrize("technique", sorted(load_techniques()))
def test_every_capability_has_a_type_a_default_and_a_meaning(technique):
    schema = load_techniques()[technique].caps
    assert issubclass(schema, Caps)
    for name, kind, _default, meaning in schema.table():
        assert kind and meaning, f"{technique}: capability {name} lacks a type or a meaning"
    build(schema, {}, who=technique)  # every default is valid
