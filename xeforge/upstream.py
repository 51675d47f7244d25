"""The way back to the user's repository: what ``xeforge new`` recorded, and the patch of a port against it.

Owns: the marker line that separates the user's file from the ``Model`` that ``xeforge new`` generated below it,
``upstream.yaml`` (where the kernel file came from: its path, its repository and path inside it, its hash), and
:func:`write_patch`: the final kernel with the generated part removed, as a unified diff against the original
file (``a/<path>`` / ``b/<path>`` inside its repository, so ``git apply`` takes it there). Edits a port made in the
generated ``Model`` are not the user's code: they are kept out of the patch and written beside it, and the result
says so. Format and workflow: ``docs/new.md``.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
from pathlib import Path
from typing import Any

import yaml

from xeforge.errors import ProblemError
from xeforge.kernel_model import parse_python
from xeforge.store import atomic_write

UPSTREAM_FILE = "upstream.yaml"
MARKER_PREFIX = "# ---- xeforge new: "


def marker(relpath: str) -> str:
    return f"{MARKER_PREFIX}everything below is generated (docs/new.md) and is not part of {relpath} ----"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split_generated(text: str) -> tuple[str, str]:
    """(the user's part, the generated part) of a kernel file made by ``xeforge new``.

    The marker line starts the generated part. Where a rewrite dropped the marker, a top-level ``class Model``
    (with its decorators) is the generated part. A file with neither is all the user's."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(MARKER_PREFIX):
            head = "".join(lines[:i])  # the user's text, then the two newlines xeforge new put before the marker
            return head[:-2] if head.endswith("\n\n") else head, "".join(lines[i:])
    try:
        tree = parse_python(text)
    except SyntaxError:
        return text, ""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            end = node.end_lineno or node.lineno
            head = "".join(lines[:start]).rstrip("\n") + "\n"
            tail = "".join(lines[end:])
            return head + (("\n" + tail.lstrip("\n")) if tail.strip() else ""), "".join(lines[start:end])
    return text, ""


def read_upstream(problem_root: Path) -> dict[str, Any] | None:
    """``upstream.yaml`` of a problem folder made by ``xeforge new``, or None when there is none."""
    path = Path(problem_root) / UPSTREAM_FILE
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProblemError(str(path), f"is not valid YAML ({exc})",
                           "re-create the problem with `xeforge new`, or delete upstream.yaml to patch against "
                           "kernel.py") from None
    if not isinstance(data, dict) or not isinstance(data.get("relpath"), str):
        raise ProblemError(str(path), "has no `relpath` (the kernel file's path inside its repository)",
                           "re-create the problem with `xeforge new`, or delete upstream.yaml")
    return data


def write_patch(problem_root: Path, start_text: str, final_text: str, out_dir: Path,
                kernel_name: str = "kernel.py") -> dict[str, Any]:
    """Write ``upstream.patch`` (and ``model.diff`` where the generated Model changed) under ``out_dir``.

    ``start_text`` is the problem's kernel as loaded (its user part is the original as ``xeforge new`` copied it).
    Without ``upstream.yaml`` the patch is against the problem's own kernel file. Returns what was written: the
    patch path, the file it applies to, whether it is empty, and notes for the report."""
    up = read_upstream(problem_root)
    start_user, start_gen = split_generated(start_text)
    final_user, final_gen = split_generated(final_text)
    notes: list[str] = []
    if up is None:
        relpath, apply_in, base = kernel_name, str(problem_root), start_text
        final_user, final_gen, start_gen = final_text, "", ""
    else:
        relpath, base = up["relpath"], start_user
        apply_in = up.get("repo_root") or str(Path(up.get("source", relpath)).parent)
        original = Path(up.get("source", ""))
        if original.is_file() and up.get("sha256") and sha256(original.read_text(encoding="utf-8")) != up["sha256"]:
            notes.append(f"{original} changed since `xeforge new` copied it: the patch is against that copy "
                         "(`git apply -3` merges it with the change)")
    diff = "".join(difflib.unified_diff(base.splitlines(keepends=True), final_user.splitlines(keepends=True),
                                        f"a/{relpath}", f"b/{relpath}"))
    out_dir = Path(out_dir)
    patch = out_dir / "upstream.patch"
    atomic_write(patch, diff)
    result: dict[str, Any] = {"path": str(patch), "applies_to": relpath, "apply_in": apply_in,
                              "empty": not diff, "lines": diff.count("\n"), "notes": notes}
    if start_gen and final_gen.strip() != start_gen.strip():
        model = out_dir / "model.diff"
        atomic_write(model, "".join(difflib.unified_diff(start_gen.splitlines(keepends=True),
                                                         final_gen.splitlines(keepends=True),
                                                         "a/generated-Model", "b/generated-Model")))
        result["model_diff"] = str(model)
        notes.append("the port also changed the generated Model (the call site xeforge new wrote), which is not "
                     f"in the patch: {model.name} shows it; make the same change where your code calls the kernel")
    if not diff:
        notes.append("the port returned the starting kernel's own code for the user's file: the patch is empty")
    return result
