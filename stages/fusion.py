"""Stage 3, fusion: fewer launches and round trips: epilogues into the GEMM, elementwise chains, torch ops in forward into the kernel.

Owns: this stage's goal, issue detectors and deterministic tactics. Tactics are added here as they are
implemented; until then the pipeline reports 'no tactic implemented for fusion'.
"""

from __future__ import annotations

from stages.base import Stage

STAGE = Stage(
    name='fusion',
    order=3,
    goal='fewer launches and round trips: epilogues into the GEMM, elementwise chains, torch ops in forward into the kernel',
    kb_topics=('fusion',),
)
