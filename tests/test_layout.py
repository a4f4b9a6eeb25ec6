"""The package's layout as its design: the pure subpackages (``core``, ``sampling``) import nothing of TRL or its
stack, directly or through another module, and no module, class or function outgrows what a reader takes in at once
(counted on ruff-formatted code, ``# fmt: skip`` lines reformatted)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trl_zerostd"
PURE = ("core", "sampling")
FORBIDDEN = ("trl", "transformers", "accelerate", "datasets", "peft")
MOST_LINES = {"module": 300, "class": 200, "function": 50}


def modules(subpackage: str = "") -> list[Path]:
    return sorted((PACKAGE / subpackage).rglob("*.py"))


def test_the_pure_subpackages_import_nothing_of_trls_stack():
    """Every module of ``core`` and ``sampling`` imported in a fresh interpreter: none of TRL, transformers,
    accelerate, datasets or peft is loaded (the package's own ``__init__`` included)."""
    names = [".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts) for sub in PURE for path in modules(sub)]
    names = [name.removesuffix(".__init__") for name in names]
    script = (
        f"import importlib, sys\nfor name in {names!r}: importlib.import_module(name)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r})))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"a pure module loads {done.stdout.strip()}"
    assert len(names) >= 10  # every module was imported, not an empty list


def formatted(path: Path) -> str:
    """``path``'s source as ruff formats it once ``# fmt: skip`` is taken out (the project's settings)."""
    source = path.read_text().replace("  # fmt: skip", "").replace("# fmt: skip", "")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
        input=source, capture_output=True, text=True, check=True, cwd=PACKAGE.parent,
    )  # fmt: skip
    return done.stdout


def oversized(source: str) -> list[str]:
    """What in ``source`` has more lines than ``MOST_LINES`` allows (decorators included)."""
    found = []
    if source.count("\n") > MOST_LINES["module"]:
        found.append(f"module: {source.count(chr(10))} lines")
    for node in ast.walk(ast.parse(source)):
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
            lines = node.end_lineno - start + 1 if node.end_lineno else 0
            if lines > MOST_LINES[kind]:
                found.append(f"{kind} {node.name}: {lines} lines")
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_module_class_or_function_outgrows_a_reading(path):
    assert not oversized(formatted(path)), oversized(formatted(path))


def test_the_size_check_finds_what_is_too_long():
    long_function = "def f():\n" + "    x = 1\n" * 60
    long_class = "class C:\n" + "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(70))
    assert oversized(long_function) == ["function f: 61 lines"]
    assert oversized(long_class) == ["class C: 210 lines"]
    assert oversized("x = 1\n" * 301) == ["module: 301 lines"]
    assert oversized("def f():\n" + "    x = 1\n" * 49) == []  # 50 lines: at the limit
