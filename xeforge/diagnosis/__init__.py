"""Diagnosis: what the compiler made of a candidate, and what that says about where its time goes.

- :mod:`xeforge.diagnosis.capture` (worker side): the compiled kernels of a call written to files — metadata
  (registers, spills, shared memory, warps, stages, GRF build flags) and the IR texts the installed Triton produced;
- :mod:`xeforge.diagnosis.compiler` (parent side): those files read back as facts, with the knowledge base's
  version-gated recognizers (which matrix instruction each ``tl.dot`` became, TMA / 2D block loads, async copies,
  vector widths);
- :mod:`xeforge.diagnosis.rules`: the knowledge base's diagnoses matched against the facts: a cause, and the stage
  and tactics that address it.

Only files cross from the worker (data, never code), and the facts steer the search and the reports: they never
decide a gate (the worker that wrote them ran the candidate).
"""
