"""Source rewrites behind the rules engine's tactics (the tactics themselves live in ``stages/``).

This package holds the analysis and libcst edits of several stages; each module says which. The dtype and
fusion stages (``stages/dtype.py``, ``stages/fusion.py``) use:

- :mod:`xeforge.rewrite.cst_tools` — libcst plumbing: parse with positions, edit statements by line, add
  kernel parameters and launch arguments, rename names, remove functions. Formatting and comments survive.
- :mod:`xeforge.rewrite.context` — one parse of the kernel file shared by a rewrite (ast, libcst, forward).
- :mod:`xeforge.rewrite.forward_env` — what ``Model.forward`` holds: the symbolic shape (spec dim names) and
  element dtype of each tensor it passes to a launch, per variant; the Model's parameters and scalars.
- :mod:`xeforge.rewrite.tl_ops` — the table of elementwise torch ops that translate to ``tl`` code.
- :mod:`xeforge.rewrite.fusion_tile` — the shapes fusion recognises: a kernel's final tile store and an
  elementwise consumer kernel.
- :mod:`xeforge.rewrite.fusion_rewrites` — the three fusions (consumer kernel into the producer's store,
  trailing torch ops into the epilogue, row reductions when one tile covers the row).
- :mod:`xeforge.rewrite.dtype_rewrites` — the precision-contract rewrites around ``tl.dot`` and fp64.

Each of these rewrites either returns new source or raises :class:`NotApplicable` with the reason.
"""

from __future__ import annotations


class NotApplicable(Exception):
    """A rewrite does not apply to this source; ``str(exc)`` says why (shown to the user as is)."""
