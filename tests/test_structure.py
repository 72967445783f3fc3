"""The harness's structure: dependencies point one way, capabilities are typed, implementations come in through
the entry-point group.

The import graph is read from the source: every import statement, at module level or inside a function (a lazy
import that closes a cycle counts as one; an import under ``if TYPE_CHECKING:`` does not run and does not count),
and every string naming one of our modules -- ``importlib.import_module("...")``, ``python -m ...`` arguments,
``require("...")``.  The module names a technique lists as its properties (``Technique(properties=...)``) are
imported by the runner, so they count as the runner's imports, not the contract's.  Entry points are the one way
in from outside: each must name a module of the layer its group expects.
"""

import ast
import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from llm_inference_harness.contracts import load_techniques
from llm_inference_harness.engine.capabilities import Caps, build
from llm_inference_harness.engine.registry import DISTRIBUTION, ENTRY_POINT_GROUP, make_impl, register

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "llm_inference_harness"
FOLDERS = {PACKAGE: ROOT / "harness", f"{PACKAGE}.impls": ROOT / "impls", f"{PACKAGE}.properties": ROOT / "properties"}
OUTSIDE = ("benchmarks", "tests", "docs", "harness", "impls", "properties")  # never imported by the package
# Bottom first: a module imports modules of its own layer or below, never above.  A module's layer is that of the
# longest prefix listed for it ("" is the package itself); each wing's __init__ says the same in words.
LAYERS = [
    ("numerics", ["numerics"]),
    ("engine core", ["engine.capabilities", "engine.devices", "engine.tolerance", "engine.isolation", "engine.guard",
                     "engine.profiles", "engine.progress", "engine.memory", "engine.provenance", "engine.inputs",
                     "engine.outputs", "engine.environment", "engine.exampledb", "engine.wire", "engine.confine"]),
    ("models", ["models"]),
    ("sampling", ["sampling"]),
    ("judge's boundary", ["engine.boundary"]),
    ("contracts", ["contracts"]),
    ("registry", ["engine.registry", "engine.plugins"]),
    ("references, strategies, batch invariance", ["references", "strategies", "engine.batch_invariance"]),
    ("implementations, analytic models", ["impls", "analytic"]),
    ("properties", ["properties"]),
    ("runner", ["engine.runner", "engine.laws", "engine.terminal", "engine.pytest_plugin", "engine.callserver",
                "engine.zygote"]),
    ("scale-out and mutation testing", ["engine.units", "engine.executors", "engine.scale", "engine.merge",
                                        "engine.measure", "engine.enumeration_pool", "engine.mutation"]),
    ("bench", ["bench"]),
    ("command line, the package's public face", ["cli", "__main__", ""]),
]
ENTRY_POINT_LAYERS = {ENTRY_POINT_GROUP: "implementations, analytic models", "pytest11": "runner",
                      "scripts": "command line, the package's public face"}
TOP_LEVEL = {"__init__", "__main__", "cli"}  # everything else of harness/ lives in a wing


def package_modules() -> dict[str, Path]:
    mods = {}
    for root, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            mods[".".join([root, *path.relative_to(folder).with_suffix("").parts]).removesuffix(".__init__")] = path
    return mods


MODULES = package_modules()


def layer_of(module: str) -> int | None:
    rest = module.removeprefix(PACKAGE).lstrip(".")
    best = max(((len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if rest == p or rest.startswith(p + ".") or p == ""), default=None)
    return best[1] if best else None


def module_of(target: str, mods=MODULES) -> str | None:
    """The module a dotted name (module, module.attribute, "module:attr" or "package.") lies in."""
    parts = target.split(":")[0].rstrip(".").split(".")
    return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in mods), None)


def type_checking_only(tree: ast.Module) -> set[ast.AST]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skip |= {n for stmt in node.body for n in ast.walk(stmt)}
    return skip


def technique_properties(tree: ast.Module) -> set[ast.AST]:
    """The string constants of ``Technique(..., properties=(...))``: module names the runner imports."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Technique":
            found |= {n for kw in node.keywords if kw.arg == "properties" for n in ast.walk(kw.value)}
    return found


def imports(source: str, mods=MODULES) -> list[tuple[str, str]]:
    """(kind, target module) of every import and string import in a module's source; kind "import" or "string"."""
    tree = ast.parse(source)
    skip = type_checking_only(tree) | technique_properties(tree)
    found = []
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            found += [("import", a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [("import", f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module)
                      for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value:
            if node.value.startswith(OUTSIDE + (PACKAGE,)) and module_of(node.value, mods):
                found.append(("string", node.value))
    return found


def import_graph() -> dict[str, set[tuple[str, str]]]:
    """{module: {(kind, module it imports)}} over the package's modules."""
    graph = {name: {(kind, m) for kind, t in imports(path.read_text()) if (m := module_of(t)) and m != name}
             for name, path in MODULES.items()}
    runner = f"{PACKAGE}.engine.runner"
    graph[runner] |= {("Technique.properties", m) for t in load_techniques().values() for m in t.properties}
    return graph


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


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer_of(m) is None] == []


def test_no_import_points_up():
    up = [f"{name} ({LAYERS[layer_of(name)][0]}) -> {target} ({LAYERS[layer_of(target)][0]}), by {kind}"
          for name, edges in import_graph().items() for kind, target in edges
          if layer_of(target) > layer_of(name)]
    assert up == []


def test_no_import_cycle():
    graph = {name: {m for _, m in edges} for name, edges in import_graph().items()}
    assert cycles(graph) == []


def test_cycles_finds_a_cycle():
    """The check above can fail: a two-module loop is reported."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_string_imports_are_edges_and_type_checking_imports_are_not():
    """The checks above can see a module reached by name: importlib, ``-m``, a lookup by string."""
    mods = {f"{PACKAGE}.bench.compare": None, f"{PACKAGE}.engine.registry": None, f"{PACKAGE}.impls.external": None}
    source = f'''
import importlib
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from {PACKAGE}.engine.registry import Impl
importlib.import_module("{PACKAGE}.bench.compare")
run([sys.executable, "-m", "{PACKAGE}.bench.compare"])
SOURCE = "{PACKAGE}.impls.external."
'''
    found = {(kind, module_of(t, mods)) for kind, t in imports(source, mods) if module_of(t, mods)}
    assert found == {("string", f"{PACKAGE}.bench.compare"), ("string", f"{PACKAGE}.impls.external")}


def test_the_package_imports_nothing_of_benchmarks_tests_or_the_folders_by_their_own_names():
    bad = [(name, t) for name, path in MODULES.items() for _, t in imports(path.read_text())
           if t.split(".")[0] in OUTSIDE]
    assert bad == []


def test_only_the_cli_parses_arguments():
    """The engine is a library call: no module builds an argparse Namespace by hand to drive another."""
    users = [name for name, path in MODULES.items() if path.is_relative_to(ROOT / "harness")
             and "Namespace(" in path.read_text()]
    assert users == []


def test_harness_top_level_holds_the_public_face_only():
    top = {p.stem for p in (ROOT / "harness").glob("*.py")}
    assert top == TOP_LEVEL, f"put {sorted(top - TOP_LEVEL)} in a wing (see each wing's __init__)"


def test_every_wing_says_what_it_holds_and_may_import():
    for init in sorted((ROOT / "harness").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(ROOT)}: its docstring does not say what it may import"


def test_entry_points_name_modules_of_their_layer():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"scripts": project["scripts"], **project["entry-points"]}
    assert set(groups) == set(ENTRY_POINT_LAYERS)
    for group, points in groups.items():
        for name, value in points.items():
            module = value.split(":")[0]
            assert module in MODULES, f"entry point {group}: {name} = {value} names no module"
            assert LAYERS[layer_of(module)][0] == ENTRY_POINT_LAYERS[group], f"{group}: {name} = {value}"


def test_the_wheel_ships_every_package():
    """packages is listed in pyproject.toml (the import name maps onto three folders): a new folder must be added."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert {m for m, path in MODULES.items() if path.name == "__init__.py"} == listed


def test_properties_hold_laws_only():
    """A test in properties/ is a law run against implementations: it takes ``impl``; the harness's own tests
    live in tests/."""
    selftests = [f"{path.name}::{node.name}" for path in sorted((ROOT / "properties").glob("test_*.py"))
                 for node in ast.parse(path.read_text()).body
                 if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
                 and "impl" not in [a.arg for a in node.args.args]]
    assert selftests == []


def test_our_implementations_come_in_through_the_entry_point_group():
    ours = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            if ep.dist is not None and ep.dist.name == DISTRIBUTION}
    # one package per technique, and impls/external: the adapters of third-party libraries, of several techniques
    assert ours == {t: f"{PACKAGE}.impls.{t}" for t in [*load_techniques(), "external"]}


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


def test_no_dead_code():
    """vulture, configured in pyproject.toml: every unused name is dead code, or reached by name and listed with
    how in tests/vulture_whitelist.py (vulture comes with the test extra)."""
    import subprocess
    import sys

    found = subprocess.run([sys.executable, "-m", "vulture"], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr
