"""Stage 4, memory_access: coalesced access, contiguous last dimension, int64 offsets where sizes need them.

Owns: this stage's goal, issue detectors and deterministic tactics. Tactics are added here as they are
implemented; until then the pipeline reports 'no tactic implemented for memory_access'.
"""

from __future__ import annotations

from stages.base import Stage

STAGE = Stage(
    name='memory_access',
    order=4,
    goal='coalesced access, contiguous last dimension, int64 offsets where sizes need them',
    kb_topics=('memory', 'coalescing', 'int64'),
)
