"""Turning a model's answer into a candidate kernel: extract leniently, validate strictly, never repair.

Owns: :func:`extract_code` (find the kernel file in an answer: the parsed ``kernel_code`` field or, when the
answer did not follow the field format, the raw text; fenced blocks first, the largest python block that has
both ``@triton.jit`` and ``class Model``) and :func:`validate_code` (it parses, defines ``class Model`` with a
``forward``, has a ``@triton.jit`` kernel that ``forward`` launches, and differs from the current kernel).
Nothing here edits the code: what does not pass becomes feedback for the next round.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from xeforge.kernel_model import parse_python

_FENCE = re.compile(r"(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*?)(?:\n[ \t]*(?P=fence)[ \t]*(?=\n|\Z)|\Z)",
                    re.DOTALL)
_FIELD_HEADER = re.compile(r"\[\[ ## (\w+) ## \]\]")
_PY_LANGS = {"", "python", "py", "python3", "triton"}


@dataclass
class Extraction:
    code: str | None
    how: str  # what was found, for the record ("largest python block of 2", "whole answer", ...)
    problem: str = ""  # when code is None: what the model should do differently


def _has_jit(text: str) -> bool:
    return "triton.jit" in text or "@jit" in text


def _has_model(text: str) -> bool:
    return re.search(r"^\s*class\s+Model\b", text, re.MULTILINE) is not None


def _field_section(raw: str, name: str) -> str | None:
    """The text under ``[[ ## name ## ]]`` in an answer that used the field markers only partly."""
    headers = list(_FIELD_HEADER.finditer(raw))
    for i, m in enumerate(headers):
        if m.group(1) == name:
            end = headers[i + 1].start() if i + 1 < len(headers) else len(raw)
            return raw[m.end():end]
    return None


def extract_code(field_value: str | None, raw: str | None) -> Extraction:
    """The kernel file in an answer. ``field_value``: the parsed ``kernel_code`` field (None when the answer
    could not be parsed into fields); ``raw``: the whole answer text."""
    sources: list[tuple[str, str]] = []
    if field_value and field_value.strip():
        sources.append(("kernel_code field", field_value))
    if raw and raw.strip():
        section = _field_section(raw, "kernel_code")
        if section and section.strip():
            sources.append(("kernel_code section of the raw answer", section))
        sources.append(("raw answer", raw))
    if not sources:
        return Extraction(None, "empty answer", "the answer was empty: return the complete kernel file in one "
                          "```python block")
    split_parts = False
    for label, text in sources:
        blocks = [(m.group("lang").lower(), m.group("body")) for m in _FENCE.finditer(text)]
        py = [b for lang, b in blocks if lang in _PY_LANGS]
        full = [b for b in py if _has_jit(b) and _has_model(b)]
        if full:
            best = max(full, key=len)
            how = f"largest complete python block of {len(py)} in the {label}" if len(py) > 1 else f"python block in the {label}"
            return Extraction(best.strip("\n") + "\n", how)
        if any(_has_jit(b) for b in py) and any(_has_model(b) for b in py):
            split_parts = True
        if not blocks and _has_jit(text) and _has_model(text):
            body = text.strip("\n")
            body = re.sub(r"\n?\[\[ ## completed ## \]\]\s*$", "", body)
            return Extraction(body + "\n", f"unfenced code in the {label}")
    if split_parts:
        return Extraction(None, "kernel and Model in separate blocks",
                          "the @triton.jit kernel and class Model were in separate code blocks: return the complete "
                          "file (imports, every kernel, class Model) in ONE ```python block")
    return Extraction(None, "no kernel file found",
                      "no code block with both a @triton.jit kernel and class Model was found in the answer: return "
                      "the complete kernel file in one ```python block")


def validate_code(code: str, current: str) -> list[str]:
    """Strict checks before the verifier spends time on it. Returns the problems (empty: valid)."""
    try:
        tree = parse_python(code)
    except SyntaxError as exc:
        line = (exc.text or "").rstrip()
        return [f"the code does not parse: line {exc.lineno}: {exc.msg}" + (f" — `{line.strip()}`" if line else "")
                + ("; the answer may have been cut off at the output token limit" if _looks_truncated(code) else "")]
    problems: list[str] = []
    jit = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and any(_is_jit(d) for d in n.decorator_list)]
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if not jit:
        problems.append("no top-level @triton.jit kernel is defined")
    if model is None:
        problems.append("no top-level class Model is defined")
    else:
        forward = next((n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
        if forward is None:
            problems.append("class Model has no forward method")
        elif jit:
            launched = _launched(tree, set(jit))
            if not launched:
                problems.append(f"no @triton.jit kernel ({', '.join(jit)}) is launched as kernel[grid](...) from Model")
    if not problems and normalise_code(code) == normalise_code(current):
        problems.append("the code is identical to the current kernel: change something this stage is about, or "
                        "explain in your answer why nothing should change")
    return problems


def _is_jit(dec: ast.AST) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    if isinstance(target, ast.Attribute):
        return target.attr in {"jit", "autotune", "heuristics"}
    return isinstance(target, ast.Name) and target.id in {"jit", "autotune", "heuristics"}


def _launched(tree: ast.Module, kernels: set[str]) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            base = node.func.value
            name = base.id if isinstance(base, ast.Name) else (base.attr if isinstance(base, ast.Attribute) else None)
            if name in kernels:
                out.add(name)
    return out


def normalise_code(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def _looks_truncated(code: str) -> bool:
    tail = code.rstrip().splitlines()[-1] if code.strip() else ""
    return tail.endswith(("(", ",", "[", "{", ":", "\\", "=")) or tail.count("(") > tail.count(")")
