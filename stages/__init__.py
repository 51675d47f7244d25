"""The nine stages, in order. A registry: name -> :class:`stages.base.Stage` (one module each)."""

from __future__ import annotations

from stages import (algorithmic, autotuning, block_io, device_tuning, discovery, dtype, fusion, memory_access,
                    persistent)
from stages.base import Applicability, Candidate, Issue, Stage, StageContext, Tactic

ALL: tuple[Stage, ...] = tuple(sorted(
    (m.STAGE for m in (algorithmic, dtype, fusion, memory_access, block_io, persistent, device_tuning, autotuning,
                       discovery)),
    key=lambda s: s.order))
BY_NAME: dict[str, Stage] = {s.name: s for s in ALL}
NAMES: tuple[str, ...] = tuple(s.name for s in ALL)


def get(name: str) -> Stage:
    return BY_NAME[name]


__all__ = ["ALL", "BY_NAME", "NAMES", "get", "Stage", "StageContext", "Tactic", "Candidate", "Issue", "Applicability"]
