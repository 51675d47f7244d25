"""The device_tuning stage's wave-tail tactic (issue 34: a partial last wave of output tiles at an odd shape).

The rewrite is run through the real verifier on the interpreter with a core count and a tile that make the per-call
split happen at the correctness shapes (64 rows: 48 in whole waves and 16 in the tail; 63 rows: a ragged tail; 17
rows: the launch as written); the tactic's decision is read at the suite's shapes with a stand-in H100.
"""

from __future__ import annotations

import ast

import pytest

from stages.device_tuning import STAGE
from stages.device_tuning_waves import WaveTail
from tests.conftest import ROOT, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite.device_tuning import wave_tail as wt
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.configs import apply_config

SQUARE = ROOT / "kernels" / "gemm_square"
TACTIC = WaveTail()


def test_registered_after_the_per_shape_configurations():
    names = [t.name for t in STAGE.tactics]
    assert names.index("wave-tail") == names.index("per-shape-config") + 1


@pytest.mark.parametrize("rows, tiles, split", [
    (3000, 288, 2816),   # 128 x 256 tiles at 3000 x 3000 on 132 cores: 2.2 waves -> 2 whole waves and a tail
    (4096, 512, 0),      # 3.9 waves: the last is nearly full
    (1000, 8192, 0),     # 62 waves: the last one's fill is under the share a split must save
    (16, 16, 0),         # one wave
])
def test_the_per_call_decision(rows, tiles, split):
    per_block = tiles // -(-rows // 128)
    small_tiles = -(-rows // 64) * per_block * 2
    assert wt.rows_at(rows, tiles, 128, small_tiles, 64, 0.25, 132) == split


def test_the_split_launch_is_correct_on_both_blocks_and_as_written_below_a_wave(verify):
    p = load_problem(SQUARE)
    src = apply_config(p.kernel_source, "matmul_kernel", {"BLOCK_M": 16, "BLOCK_N": 16})
    (site,) = [s for s in parse_kernel(src).launches if s.kernel == "matmul_kernel"]
    out = wt.wave_tail(src, "matmul_kernel", site.line, "M", ["a", "c"], 16, {"BLOCK_M": 8, "BLOCK_N": 8}, 8,
                       0.05, 6)
    # 64 rows: 16 tiles of 16 x 16 on 6 programs (3 waves) -> 48 rows in 2 waves, 16 rows in 8 x 8 tiles
    assert wt.rows_at(64, 16, 16, 64, 8, 0.05, 6) == 48 and wt.rows_at(63, 16, 16, 64, 8, 0.05, 6) == 48
    assert wt.rows_at(17, 4, 16, 12, 8, 0.05, 6) == 0
    launches = [s for s in parse_kernel(out).launches if s.kernel == "matmul_kernel"]
    assert len(launches) == 3
    first, tail = launches[0], launches[1]
    assert first.args[0] == "a[:wave_rows]" and first.args[3] == "wave_rows" and first.constexprs["BLOCK_M"] == 16
    assert tail.args[2] == "c[wave_rows:]" and tail.args[3] == "M - wave_rows" and tail.constexprs["BLOCK_M"] == 8
    assert "cdiv(wave_rows, 16)" in first.grid and "cdiv((M - wave_rows), 8)" in tail.grid
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()


def test_the_tactic_splits_the_odd_shape_only_and_asks_for_every_shape():
    p = load_problem(SQUARE)
    ctx = tactic_context(p, kind="cuda", target="h100", cores=132)
    app = TACTIC.check(ctx)
    assert app.applies and "splits at bench-gpu-2" in app.reason and "bench-gpu-1" not in app.reason.split(
        "splits at")[1], app.reason
    (cand,) = TACTIC.propose(ctx)
    assert cand.time_all_shapes and cand.params["BLOCK_M"] == 64
    tree = parse_kernel(cand.source).tree
    helper = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == wt.ROWS_FN)
    assert helper is not None and f"{wt.ROWS_FN}(M, " in cand.source


def test_where_it_does_not_apply_it_says_why():
    tall = load_problem(ROOT / "kernels" / "gemm_tall_k")
    app = TACTIC.check(tactic_context(tall, kind="cuda", target="h100", cores=132))
    assert not app.applies and "fit one wave of 132 cores" in app.reason
    app = TACTIC.check(tactic_context(load_problem(SQUARE)))
    assert not app.applies and "interpreter" in app.reason


def test_a_row_tensor_passed_as_an_expression_is_refused_with_its_line():
    p = load_problem(SQUARE)
    src = p.kernel_source.replace("matmul_kernel[grid](a, b, c,", "matmul_kernel[grid](a.contiguous(), b, c,")
    app = TACTIC.check(tactic_context(p, src, kind="cuda", target="h100", cores=132))
    assert not app.applies and "a.contiguous()" in app.reason and "plain name" in app.reason
    with pytest.raises(NotApplicable, match="not a name"):
        wt.wave_tail(src, "matmul_kernel", 50, "M - 0", ["c"], 128, {"BLOCK_M": 64}, 64, 0.5, 132)
