"""Stage 6, persistent: a persistent kernel over tiles, sized from the device's core count.

Owns: this stage's goal, issue detectors and deterministic tactics. Tactics are added here as they are
implemented; until then the pipeline reports 'no tactic implemented for persistent'.
"""

from __future__ import annotations

from stages.base import Stage

STAGE = Stage(
    name='persistent',
    order=6,
    goal="a persistent kernel over tiles, sized from the device's core count",
    kb_topics=('persistent',),
)
