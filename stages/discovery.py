"""Stage 9, discovery: open-ended ideas that no stage above covers.

Owns: this stage's goal, issue detectors and deterministic tactics. It has no deterministic tactic by design (open-ended discovery needs judgment, not rules);
the llm engine proposes candidates from its template `discovery.md.j2`.
"""

from __future__ import annotations

from stages.base import Stage

STAGE = Stage(
    name='discovery',
    order=9,
    goal='open-ended ideas that no stage above covers',
    kb_topics=('discovery',),
    llm_only_reason='open-ended discovery needs judgment, not rules',
)
