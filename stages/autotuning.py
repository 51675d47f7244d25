"""Stage 8, autotuning: @triton.autotune with a small, KB-valid config list keyed on the shape arguments.

Owns: this stage's goal, issue detectors and deterministic tactics. Tactics are added here as they are
implemented; until then the pipeline reports 'no tactic implemented for autotuning'.
"""

from __future__ import annotations

from stages.base import Stage

STAGE = Stage(
    name='autotuning',
    order=8,
    goal='@triton.autotune with a small, KB-valid config list keyed on the shape arguments',
    kb_topics=('autotune',),
)
