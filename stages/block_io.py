"""Stage 5, block_io: structured memory access: tensor descriptors, or block pointers where the target's Triton still has them and they are faster.

Owns: this stage's goal, issue detectors and deterministic tactics. Tactics are added here as they are
implemented; until then the pipeline reports 'no tactic implemented for block_io'.
"""

from __future__ import annotations

from stages.base import Stage

STAGE = Stage(
    name='block_io',
    order=5,
    goal="structured memory access: tensor descriptors, or block pointers where the target's Triton still has them and they are faster",
    kb_topics=('block_io', 'tensor_descriptor', 'block_pointer'),
)
