"""Roles of constexpr parameters: which kernel names are the M/N/K tile, the 1D block, the group size.

Owns: the naming conventions (regular expressions, matched against the whole name) that let one tuning
space or constraint talk about ``block_n`` whether a kernel calls it ``BLOCK_N``, ``BLOCK_SIZE_N`` or
``BN``. Constraints name roles in their parameters and tuning spaces are keyed by role; lint rejects an
unknown role. To support another naming convention, extend a pattern here (and add a test). A kernel whose names
follow none (``TM``, ``TN``, ``TK``) gives its roles by use (:func:`xeforge.kb.kernel_facts.roles_by_use`), passed
as ``by_use`` below.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

ROLE_PATTERNS: dict[str, str] = {
    "block_m": r"(BLOCK|TILE)(_SIZE)?_M|BM|BLOCK_M_SIZE",
    "block_n": r"(BLOCK|TILE)(_SIZE)?_N|BN|BLOCK_N_SIZE",
    "block_k": r"(BLOCK|TILE)(_SIZE)?_K|BK|BLOCK_K_SIZE",
    "block_size": r"BLOCK(_SIZE)?|BLOCK_SIZE_X|BLOCK_X|XBLOCK|RBLOCK|R0_BLOCK",
    "head_dim": r"HEAD_DIM(_[QKV])?|BLOCK_DMODEL|BLOCK_D|D_HEAD|HEAD_SIZE",
    "group_size_m": r"GROUP_(SIZE_)?M|GROUP_SIZE",
}

#: roles whose values are tile extents (must be powers of two when used by ``tl.arange``)
BLOCK_ROLES = ("block_m", "block_n", "block_k", "block_size", "head_dim")

_COMPILED = {role: re.compile(pattern) for role, pattern in ROLE_PATTERNS.items()}


def role_of(name: str) -> str | None:
    """The role a constexpr name plays, or None."""
    for role, rx in _COMPILED.items():
        if rx.fullmatch(name):
            return role
    return None


def _plays(name: str, role: str, by_use: dict[str, str] | None) -> bool:
    rx = _COMPILED[role]
    return bool(rx.fullmatch(name)) or (bool(by_use) and by_use.get(name) == role and role_of(name) is None)


def names_for(role: str, names: Iterable[str], by_use: dict[str, str] | None = None) -> list[str]:
    """The names among ``names`` that play ``role``, in their order (by name, else by ``by_use``)."""
    return [n for n in names if _plays(n, role, by_use)]


def values_for(role: str, values: dict[str, object], by_use: dict[str, str] | None = None) -> list[tuple[str, object]]:
    """``(name, value)`` pairs of ``values`` whose name plays ``role``."""
    return [(k, v) for k, v in values.items() if isinstance(k, str) and _plays(k, role, by_use)]


def first_int(role: str, values: dict[str, object], by_use: dict[str, str] | None = None) -> int | None:
    for _, v in values_for(role, values, by_use):
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None
