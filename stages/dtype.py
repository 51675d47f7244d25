"""Stage 2, dtype: honour the precision contract: fp32 accumulation, no needless up-casts before tl.dot, no fp64 on parts without native fp64.

Owns: this stage's goal, issue detectors and deterministic tactics. Tactics are added here as they are
implemented; until then the pipeline reports 'no tactic implemented for dtype'.
"""

from __future__ import annotations

from stages.base import Stage

STAGE = Stage(
    name='dtype',
    order=2,
    goal='honour the precision contract: fp32 accumulation, no needless up-casts before tl.dot, no fp64 on parts without native fp64',
    kb_topics=('dtype', 'precision'),
)
