"""The knowledge base: validated, version-aware facts and rules about the target GPUs and Triton.

Map of the package (each module says what it owns):
  1. ``yamlio``       YAML with line numbers, so every error says ``path:line``.
  2. ``versions``     the installed Triton (:func:`installed_triton`), version ranges, the gating rule.
  3. ``facts``        device entries: sourced facts, run-time recognition, typed accessors.
  4. ``checks``       the registry of machine-checkable conditions constraints name (``check: {kind: ...}``).
  5. ``schema``       the pydantic schema of every file kind (constraints, patterns, spaces, sources).
  6. ``roles``        which constexpr names are BLOCK_M/N/K, the 1D block, the group size.
  7. ``kernel_facts`` what checks read from a parsed kernel (launch configs, tl.dot use, arange bounds).
  8. ``entries``      one loaded entry (constraint, pattern, space) and whether / where it applies.
  9. ``render``       the text and JSON a stage receives (``xeforge kb show``), ``kb explain``.
 10. ``knowledge``    :class:`KnowledgeBase`: select / check / check_config / space / explain.
 11. ``loader``       files -> base, :func:`load_kb` (cached) and :func:`lint_paths` (every error).
 12. ``cli``          ``xeforge kb lint | show | explain | check``.

Typical use::

    kb = load_kb()
    triton = installed_triton()                      # or TritonInfo.parse("3.6.0", is_xpu=True)
    sel = kb.select("device_tuning", "arc-b580", triton)  # everything that applies, nothing cut
    problems = kb.check(parse_kernel(src, path), "arc-b580", triton)   # gate 1
    for cfg in kb.space("arc-b580", "gemm", triton).configs(["BLOCK_M", "BLOCK_N", "BLOCK_K"]): ...
"""

from __future__ import annotations

from xeforge.kb._base import BACKENDS, FAMILIES, STAGES
from xeforge.kb.facts import DeviceEntry, Fact
from xeforge.kb.knowledge import KnowledgeBase, Selection, TuningSpace, Violation
from xeforge.kb.loader import lint_paths, load_kb
from xeforge.kb.versions import TritonInfo, VersionRange, installed_triton

__all__ = [
    "BACKENDS",
    "FAMILIES",
    "STAGES",
    "DeviceEntry",
    "Fact",
    "KnowledgeBase",
    "Selection",
    "TritonInfo",
    "TuningSpace",
    "VersionRange",
    "Violation",
    "installed_triton",
    "lint_paths",
    "load_kb",
]
