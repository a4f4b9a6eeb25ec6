"""The scripts beside the package (``scripts/``: the main job, the demo tasks, the studies) import only names the
package defines: a name that moves between modules must move in every script too (two benchmarks failed to import for a
while after the composition refactor, unnoticed, because no test imports them)."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(path for path in (ROOT / "scripts").rglob("[!_]*.py"))


def package_imports(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from trl_zerostd... import name`` in the file, at any depth."""
    tree = ast.parse(path.read_text())
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "trl_zerostd"
        for alias in node.names
    ]


def test_the_scripts_import_something_from_the_package():
    assert sum(len(package_imports(path)) for path in SCRIPTS) >= 10


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_name_a_script_imports_from_the_package_exists(path):
    missing = [
        f"{module}.{name}"
        for module, name in package_imports(path)
        if not hasattr(importlib.import_module(module), name)
    ]
    assert not missing, f"{path.relative_to(ROOT)} imports names its module does not define: {missing}"
