"""Timed shapes by class: decode, large and odd.

Owns :func:`shape_class`, which the bench's geomeans per class and its reports read. A port has to hold at every
shape its users run; the three classes are the ones serving and training meet (a decode step's few rows, the
aligned sizes a model is benchmarked at, and sizes no tile divides), so a figure per class says which of them a
port wins or loses.
"""

from __future__ import annotations

from typing import Any

#: a timed shape's class, for the geomeans per class: ``decode`` where the rows a GEMM or row kernel runs (its first
#: input's first dim, of a 2-D input: M, a decode batch B, ROWS, tokens T) are at most DECODE_ROWS (a serving decode
#: step's batch); else ``odd`` where a dimension above that is no multiple of TILE_MULTIPLE (3000, 1000, a
#: vocabulary of 32003: the tiles do not divide it); else ``large``
DECODE_ROWS = 64
TILE_MULTIPLE = 128


def rows_dim(spec: Any) -> str | None:
    """The dim that counts a problem's rows: its first input's first dim where that input is a 2-D (rows, columns)
    matrix with a named first dim; None otherwise (attention's [B, H, S, D], rotary's [B, S, H, D], a vector), and
    such a problem's shapes are not classed."""
    first = next(iter(spec.inputs.values()), None)
    if first is None or len(first.shape) != 2 or not isinstance(first.shape[0], str):
        return None
    return first.shape[0]


def shape_class(spec: Any, dims: dict[str, Any]) -> str | None:
    """``decode``, ``odd`` or ``large`` for a timed shape (``dims``) of the problem ``spec``; None where its rows are
    not one dim (:func:`rows_dim`)."""
    rows = rows_dim(spec)
    if rows is None or not isinstance(dims.get(rows), int):
        return None
    if dims[rows] <= DECODE_ROWS:
        return "decode"
    if any(isinstance(v, int) and v > DECODE_ROWS and v % TILE_MULTIPLE for v in dims.values()):
        return "odd"
    return "large"
