"""The harness inside another project's CI: build the wheel, install it into a fresh virtual environment in a
temporary folder (torch and the other heavy dependencies are borrowed from this environment, so no download), and
run our attention properties against a downstream package's kernel with pytest's normal reporting.  Nothing may be
written into site-packages."""

import email
import functools
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree

import pytest

from tests.shared import once

ROOT = Path(__file__).resolve().parents[1]
KERNELS = '''
import torch
from llm_inference_harness import declare
from llm_inference_harness.contracts.attention import check_inputs, check_scores_budget


@declare(dtypes=("float32", "float64"))
def attention(q, k, v, *, causal=False, scale=None):
    scale = check_inputs(q, k, v, scale, causal)
    check_scores_budget("my_pkg attention", q, k.shape[2], copies=2)
    G = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(G, dim=1).transpose(-1, -2) * scale  # (B, H, Nq, Nk)
    Nq, Nk = s.shape[-2:]
    visible = torch.ones(Nq, Nk, dtype=torch.bool).tril(Nk - Nq) if causal else torch.ones(Nq, Nk, dtype=torch.bool)
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.where(visible.any(-1, keepdim=True), p, 0) @ v.repeat_interleave(G, dim=1)


@declare(dtypes=("float32", "float64"))
def forgets_the_scale(q, k, v, *, causal=False, scale=None):
    return attention(q, k, v, causal=causal, scale=1.0)

'''


def run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=900, **kw)


def install(tmp: Path) -> list[str]:
    """[python of a fresh venv holding the wheel, its site-packages, a downstream project folder], built in tmp."""
    src = tmp / "src"  # the tracked files, as they are now: pip builds in the tree it is given, and a build/ left
    for name in run("git", "ls-files", "-z", cwd=ROOT).stdout.split("\0"):  # there from an older layout goes
        if name and (ROOT / name).is_file():                                 # into the next wheel
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist",
                src)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((tmp / "dist").glob("llm_inference_harness-*.whl"))
    slim_site(wheel, tmp / BASE)
    python, site = fresh_venv(tmp / "venv", tmp / BASE)
    done = run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel)
    assert done.returncode == 0, done.stderr[-3000:]
    project = tmp / "downstream"
    (project / "my_pkg").mkdir(parents=True)
    (project / "my_pkg" / "__init__.py").write_text("")
    (project / "my_pkg" / "kernels.py").write_text(KERNELS)
    return [str(python), str(site), str(project)]


# where the links to the base install go: a folder named site-packages, as Hypothesis reads any other as this
# project's own code and scans its source for constants (torch's: 45 s a session)
BASE = Path("base-install", "site-packages")


def fresh_venv(folder: Path, slim: Path) -> tuple[Path, Path]:
    """(python, site-packages) of a new virtual environment whose dependencies are borrowed from ``slim`` (no
    download), with pytest's console script, as pip writes it (pytest itself is borrowed)."""
    assert run(sys.executable, "-m", "venv", folder).returncode == 0
    python = folder / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site / "borrowed_dependencies.pth").write_text(f"{slim}\n")  # torch & co.
    script = python.with_name("pytest")
    script.write_text(f"#!{python}\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n")
    script.chmod(0o755)
    return python, site


def slim_site(wheel: Path, folder: Path) -> None:
    """Links, in ``folder``, to what this environment holds of the distributions the wheel requires without an extra,
    and of theirs: what `pip install llm-inference-harness` installs, and nothing of the test or bench tools -- the
    properties run on the base install alone (README, *In your own CI*)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        metadata = email.message_from_bytes(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))))
    wanted, seen = [Requirement(r) for r in metadata.get_all("Requires-Dist")], set()
    folder.mkdir(parents=True)
    while wanted:
        req = wanted.pop()
        if req.name.lower() in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(req.name.lower())
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:  # a conditional dependency this environment does without
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            if not (folder / top).exists() and (dist.locate_file(top)).exists():
                (folder / top).symlink_to(dist.locate_file(top))
        wanted += [Requirement(r) for r in dist.requires or ()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(python, site-packages, downstream project): one wheel and venv for the run, whichever workers ask."""
    return tuple(Path(p) for p in once(tmp_path_factory, "wheel", install))


PACKAGE = "llm_inference_harness"


def files_under(site: Path) -> set[Path]:
    return set((site / "llm_inference_harness").rglob("*"))


def test_the_wheel_is_what_runs(installed):
    python, site, project = installed
    where = run(python, "-c", "import llm_inference_harness as h, llm_inference_harness.properties as p; "
                "print(h.__file__, p.__file__)", cwd=project)
    assert all(Path(p).is_relative_to(site) for p in where.stdout.split()), where.stdout + where.stderr


def test_the_wheel_adds_one_import_name(installed):
    """Generic top-level names (harness, impls, properties) would clash with a downstream project's modules."""
    python, site, project = installed
    installed = {p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".pth"))}
    assert installed - {"pip", "_distutils_hack", "setuptools", "pkg_resources", "__pycache__"} == {PACKAGE}
    for name in ("harness", "impls", "properties"):
        done = run(python, "-c", f"import {name}", cwd=project)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, f"import {name}: {done.stderr[-500:]}"


def test_our_properties_run_in_a_downstream_pytest_session(installed):
    python, site, project = installed
    before = files_under(site)
    pytest_script = Path(python).with_name("pytest")  # as the README writes it: the script, not python -m pytest
    ok = run(pytest_script, "--pyargs", "llm_inference_harness.properties.test_attention", "--harness-impl",
             "attention=my_pkg.kernels:attention", "-q", "-p", "no:cacheprovider", "-k",
             "matches_reference or rejects_bad_input or empty_shapes", cwd=project)
    assert ok.returncode == 0 and " passed" in ok.stdout, ok.stdout[-3000:] + ok.stderr[-2000:]
    assert "3 passed" in ok.stdout, ok.stdout[-2000:]
    bad = judged(installed)
    failed = "FAILED" in bad.stdout and "test_matches_reference[attention/forgets_the_scale]" in bad.stdout
    assert bad.returncode == 1 and failed, bad.stdout[-3000:]
    assert files_under(site) == before, "running the properties wrote into site-packages"
    # the test function is ours, in site-packages: the advice is the harness's command, which replays the example
    assert "@reproduce_failure" not in bad.stdout, bad.stdout[-3000:]
    command = re.search(r"Reproduce: harness (check .*--reproduce \S+)", bad.stdout)
    assert command, bad.stdout[-3000:]
    again = run(python, "-m", "llm_inference_harness", *command.group(1).split(), "--no-shrink", cwd=project)
    assert again.returncode == 1 and "FAIL" in again.stdout, again.stdout[-3000:]
    assert _case(again.stdout) == _case(bad.stdout), "the reproduce command replays another example"


@functools.cache
def judged(installed) -> subprocess.CompletedProcess:
    """One downstream session judging two kernels -- one that forgets the scale, a right one -- with a JUnit report
    (judged.xml in the project's folder)."""
    python, site, project = installed
    kernels = [a for name in ("forgets_the_scale", "attention")
               for a in ("--harness-impl", f"attention=my_pkg.kernels:{name}")]
    return run(python, "-m", "pytest", "--pyargs", "llm_inference_harness.properties.test_attention", *kernels,
               "-q", "-p", "no:cacheprovider", "-k", "matches_reference", "--junitxml", "judged.xml", cwd=project)


def failure_of(stdout: str, kernel: str) -> str:
    """The section pytest prints for the failure of test_matches_reference against ``kernel``."""
    sections = re.split(r"\n_{3,} (\S+) _{3,}\n", stdout)
    return dict(zip(sections[1::2], sections[2::2], strict=True))[f"test_matches_reference[attention/{kernel}]"]


def test_a_failure_names_its_contract_rule(installed):
    """Under the plugin as under `harness check` (tests/test_failure_report.py, which also has the reproduce line of
    each distinct failure)."""
    shown = failure_of(judged(installed).stdout, "forgets_the_scale")
    assert "Contract: the attention contract's output rule: the output is softmax" in shown, shown[-3000:]


def test_a_junit_report_tells_the_implementations_apart(installed):
    """A CI dashboard groups testcases by classname: it names the property module (pytest's own would be empty for a
    module in site-packages), the name carries technique/implementation."""
    python, site, project = installed
    judged(installed)
    cases = {case.get("name"): case for case in ElementTree.parse(project / "judged.xml").iter("testcase")}
    assert set(cases) == {f"test_matches_reference[attention/{name}]" for name in ("attention", "forgets_the_scale")}
    assert {case.get("classname") for case in cases.values()} == {"llm_inference_harness.properties.test_attention"}
    assert cases["test_matches_reference[attention/forgets_the_scale]"].find("failure") is not None
    assert cases["test_matches_reference[attention/attention]"].find("failure") is None


def test_a_property_module_of_an_installed_wheel_gets_its_package_path_as_node_id(tmp_path):
    """Also from a virtual environment inside the project's folder (under the rootdir); a checkout keeps its own."""
    from llm_inference_harness.engine.pytest_plugin import _node_id

    config = SimpleNamespace(rootpath=tmp_path)
    venv = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages" / "llm_inference_harness" / "properties"
    assert _node_id(venv / "test_attention.py", config) == "llm_inference_harness/properties/test_attention.py"
    assert _node_id(tmp_path / "properties" / "test_attention.py", config) is None


def _case(text: str) -> str:
    """The drawn case a failure printed, up to its seed, without whitespace."""
    found = re.search(r"AttentionCase\((.*?)seed=", re.sub(r"(?m)^E ", "", text), re.S)  # pytest marks lines E
    assert found, text[-3000:]
    return re.sub(r"\s+", "", found.group(1))


def test_check_runs_from_the_wheel_and_writes_nothing_into_site_packages(installed):
    python, site, project = installed
    before = files_under(site)
    done = run(python, "-m", "llm_inference_harness", "check", "attention", "--plugin", "my_pkg.kernels:attention",
               "--property", "matches_reference", "--json", "verdicts.json", cwd=project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert (project / "verdicts.json").is_file()
    assert files_under(site) == before


def downstream_lines() -> list[str]:
    """The command lines of README.md's block that starts ``# in your project's folder`` (*In your own CI*)."""
    text = (ROOT / "README.md").read_text()
    blocks = [m.group(1) for m in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M)]
    block = next(b for b in blocks if b.startswith("# in your project's folder"))
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_example_project_passes_the_readme_lines_as_its_ci_runs_them(installed, tmp_path):
    """examples/downstream/ in a fresh environment that holds the base install's dependencies alone: the README's
    lines, as written, install the wheel (pip finds it in a local folder: PIP_NO_INDEX, PIP_FIND_LINKS) and the
    package, and judge its kernel; the example's workflow and README carry the same lines.  (12 s, at a load of 2.4.)"""
    lines = downstream_lines()
    example = ROOT / "examples" / "downstream"
    workflow = (example / ".github" / "workflows" / "ci.yml").read_text()
    assert [line for line in lines if f"run: {line}\n" not in workflow] == [], workflow
    assert [line for line in lines if f"\n{line}\n" not in (example / "README.md").read_text()] == []
    python, site, project = installed
    tmp = python.parents[2]  # tmp/venv/bin/python: the folder of the wheel (dist) and of the base install
    venv_python, _ = fresh_venv(tmp_path / "venv", tmp / BASE)
    # the venv's own setuptools (Python 3.11's bundled 65) cannot build a wheel without `wheel`; the borrowed one can
    assert run(venv_python, "-m", "pip", "uninstall", "-y", "-q", "setuptools").returncode == 0
    shutil.copytree(example, tmp_path / "project")
    env = {**os.environ, "PATH": f"{venv_python.parent}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": str(venv_python.parents[1]), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp / "dist"),
           "PIP_NO_BUILD_ISOLATION": "0"}  # pip's spelling of --no-build-isolation in the environment
    for line in lines:
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path / "project", env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    cases = list(ElementTree.parse(tmp_path / "project" / "harness.xml").iter("testcase"))
    assert len(cases) > 5, cases
    assert {c.get("classname") for c in cases} == {"llm_inference_harness.properties.test_attention"}
    assert [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None] == []
