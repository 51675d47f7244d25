"""The import architecture stays as pyproject.toml's [tool.importlinter] states it (issue 14, item 6).

import-linter (a declared test dependency) checks the contracts: the layers, no import circle between the
modules of a package, dspy and litellm only in cover_agent, cover_agent only through the engine registry, workers
without the llm engine. It reads function-level ("lazy") imports as well, so a circle cannot hide behind one; the
tests below also keep every module inside a layer and every remaining lazy import explained.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PACKAGES = ("xeforge", "stages", "cover_agent")
SETUP_HINT = "import-linter is a declared test dependency (pyproject.toml [test] extra): run `make setup`"



def _require_importlinter() -> None:
    try:
        import importlinter  # noqa: F401
        import grimp  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"{SETUP_HINT} ({exc})")


def _contracts() -> list[dict]:
    _require_importlinter()
    from importlinter.api import read_configuration

    return read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]


def _sources():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield rel.as_posix(), ".".join(parts), path.read_text()


def _function_level_imports(tree: ast.AST):
    """Import nodes inside a function (the lazy ones), with the function they are in."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node


def test_the_import_contracts_are_kept():
    _require_importlinter()
    proc = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()", "--config", "pyproject.toml", "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail("lint-imports: a contract in pyproject.toml [tool.importlinter] is broken (move the shared "
                    "piece to the lower module instead of importing upwards or lazily):\n"
                    f"{proc.stdout[-12000:]}\n{proc.stderr[-3000:]}")


def test_the_contracts_see_function_level_imports():
    """Every lazy first-party import is an edge of the graph the contracts are checked on."""
    _require_importlinter()
    import grimp

    graph = grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)
    modules = graph.modules
    missing, seen = [], 0
    for rel, mod, text in _sources():
        is_pkg = rel.endswith("__init__.py")
        for node in _function_level_imports(ast.parse(text)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if target.split(".")[0] not in PACKAGES or target == mod:
                    continue
                seen += 1
                if not graph.direct_import_exists(importer=mod, imported=target):
                    missing.append(f"{rel}:{node.lineno} {mod} -> {target}")
    assert seen, "no function-level first-party import found: the scan is broken"
    assert not missing, "function-level imports the import graph lacks:\n" + "\n".join(missing)


def test_every_module_is_in_a_layer():
    """A new module (or package) joins a layer of pyproject.toml's contract, so the contract covers it."""
    layered = set()
    for contract in _contracts():
        if contract["type"] == "layers":
            for layer in contract["layers"]:
                layered.update(m.strip(" ()") for m in layer.replace(":", "|").split("|") if m.strip())
    tops = {"stages", "cover_agent"}
    for path in (ROOT / "xeforge").iterdir():
        if path.name.startswith(("_", ".")) and path.name != "__main__.py":
            continue
        if path.suffix == ".py":
            tops.add(f"xeforge.{path.stem}")
        elif path.is_dir() and (path / "__init__.py").exists():
            tops.add(f"xeforge.{path.name}")
    unlayered = sorted(tops - layered)
    assert not unlayered, (f"not in any layer of [tool.importlinter]: {', '.join(unlayered)}; add each one to the "
                           "layer whose modules it imports and is imported by")


def test_each_lazy_import_says_what_heavy_dependency_it_defers():
    """A function-level import is allowed only to defer a heavy optional dependency (dspy, the pipeline's libcst
    and stages in the CLI, torch/triton/safetensors outside the workers, matplotlib), and says so in a comment
    with the word "lazy" on its line or just above it (its group of imports, a ``try:`` included)."""
    bad = []
    for rel, _, text in _sources():
        lines = text.splitlines()
        for node in _function_level_imports(ast.parse(text)):
            i = node.lineno - 1
            ok = "lazy" in lines[i]
            j = i - 1
            while not ok and j >= 0:
                s = lines[j].strip()
                if not (s.startswith(("#", "import ", "from ", "try:")) or s == ""):
                    break
                ok = "lazy" in s
                j -= 1
            if not ok:
                bad.append(f"{rel}:{node.lineno}: {lines[i].strip()}")
    assert not bad, ("function-level imports without a `lazy: <the heavy dependency it defers>` comment (move the "
                     "import to the top of the module unless it defers one):\n" + "\n".join(bad))


def test_every_parse_goes_through_the_lock():
    """``ast.parse`` from two threads at once can raise SystemError on CPython before 3.11.8 (python/cpython#106905;
    CI's 3.11.7 did, in the published-format tests): xeforge parses only through ``kernel_model.parse_python``."""
    bad = [f"{rel}:{node.lineno}" for rel, mod, text in _sources() if mod != "xeforge.kernel_model"
           for node in ast.walk(ast.parse(text))
           if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parse"
           and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast"]
    assert not bad, "ast.parse outside xeforge.kernel_model.parse_python (use it): " + ", ".join(bad)
