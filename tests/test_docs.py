"""The documentation is tested: every Python block of README.md and docs/*.md runs, the example plugins the README
shows are the files in docs/examples/, and every example plugin passes `harness check` for its technique.

A README block that starts with ``# docs/examples/NAME.py`` shows that file; each example file's docstring names
the command that checks it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))
CHECK = re.compile(r"harness check (\w+) --plugin (docs/examples/\w+\.py:\w+)")


def python_blocks() -> list[tuple[str, int, str]]:
    """(page, line, code) of every ```python block."""
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            blocks.append((page.name, text[: m.start()].count("\n") + 1, m.group(1)))
    return blocks


BLOCKS = python_blocks()
SHOWN = [b for b in BLOCKS if b[2].startswith("# docs/examples/")]
RUN = [b for b in BLOCKS if b not in SHOWN]


@pytest.mark.parametrize("page, line, code", SHOWN, ids=[f"{p}:{n}" for p, n, _ in SHOWN])
def test_a_shown_example_is_the_file_it_names(page, line, code):
    name, _, body = code.partition("\n")
    path = ROOT / name.removeprefix("# ")
    assert path.is_file(), f"{page}:{line} shows {path.name}, which does not exist"
    assert body == path.read_text(), f"{page}:{line} differs from {path.relative_to(ROOT)}: copy the file into it"


@pytest.mark.parametrize("page, line, code", RUN, ids=[f"{p}:{n}" for p, n, _ in RUN])
def test_every_python_block_runs(page, line, code, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, f"{page}:{line} failed:\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_plugin_passes_its_check(example, capsys, monkeypatch):
    """`main` is what `harness` calls (a process start each would cost seconds); the plugin is imported
    in the check's own child, as from the command line."""
    from llm_inference_harness.cli import main

    command = CHECK.search(example.read_text())
    assert command, f"{example.name}: its docstring names no `harness check T --plugin {example.name}:ATTR`"
    technique, spec = command.groups()
    assert spec.startswith(f"docs/examples/{example.name}:"), f"{example.name} names another file: {spec}"
    monkeypatch.chdir(ROOT)
    rc = main(["check", technique, "--plugin", spec, "--jobs", "1"])
    out = capsys.readouterr().out
    assert rc == 0, f"{example.name} does not pass its check:\n{out[-4000:]}"
    assert "0 failed" in out, out[-2000:]


def test_every_example_is_shown_or_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in EXAMPLES if f"docs/examples/{p.name}" not in readme]
    assert missing == [], f"README.md mentions no {missing}"
