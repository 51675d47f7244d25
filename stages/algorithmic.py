"""Stage 1, algorithmic: change the math: algebraic simplification, common subexpressions, reductions that collapse.

Owns: this stage's goal, issue detectors and deterministic tactics. It has no deterministic tactic by design (no rewrite of the math is safe without algebra the rules engine does not do);
the llm engine proposes candidates from its template `algorithmic.md.j2`.
"""

from __future__ import annotations

from stages.base import Stage

STAGE = Stage(
    name='algorithmic',
    order=1,
    goal='change the math: algebraic simplification, common subexpressions, reductions that collapse',
    kb_topics=('algorithmic',),
    llm_only_reason='no rewrite of the math is safe without algebra the rules engine does not do',
)
