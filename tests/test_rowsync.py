"""The row-sync tactic: a split row reduction finished inside its persistent GEMM (xeforge.rewrite.rowsync).

The interpreter runs programs one at a time, so a tile waiting for the other tiles of its row would wait forever:
on the CPU the candidate runs its two-pass path (SYNC is set only on CUDA), and the synchronised path is run here
where a row has one tile (N within BLOCK_N), which exercises everything but the wait itself: the partials read back
in slot order, the ops after the reduction on the tile in registers, the direct store and the flag that makes the
combine kernel stand aside."""

from __future__ import annotations

import pytest

from tests.test_fusion_graph import SPLIT_READ_BACK, _problem, _applying_to
from tests.conftest import tactic_context
from xeforge.rewrite import NotApplicable, persistent, rowsync


def _split_persistent(tmp_path, name: str, style: str = "wrapper"):
    """The problem of ``name``'s read-back graph with the fusion stage's split (its combine-kernel candidate) and the
    persistent stage's tile loop applied, as the port would have them when the row sync is proposed."""
    body, _ = SPLIT_READ_BACK[name]
    p = _problem(tmp_path, body, style)
    tactic, ctx = _applying_to(p, "fuse-split-row-reduction")
    fused = tactic.propose(ctx)[0].source
    assert "row_combine_kernel[" in fused
    src, _ = persistent.rewrite(fused)
    return p, src


@pytest.mark.slow  # about 15 s a graph (a trace and two runs of the verifier on the interpreter)
@pytest.mark.parametrize("style", ["wrapper", "direct"])
@pytest.mark.parametrize("name", sorted(SPLIT_READ_BACK))
def test_the_row_sync_is_correct_on_both_paths(name, style, tmp_path, verify):
    p, src = _split_persistent(tmp_path, name, style)
    plan = rowsync.plan(src)
    assert (plan.gemm, plan.combine, plan.part, plan.y, plan.keep_y) == ("_mm_bias", "row_combine_kernel",
                                                                        "row_part", "y", False)
    out = rowsync.apply(src, plan)
    kernel, fwd = out[:out.index("class Model")], out[out.index("def forward"):]
    assert 'while tl.load(sync_count_ptr + 1 + pid_0, volatile=True) < num_pid_1:' in kernel
    assert 'tl.atomic_add(sync_count_ptr + 1 + pid_0, 0, sem="acquire")' in kernel
    assert "(sync_slots < num_pid_1)[None, :]" in kernel  # the row's used slots only
    assert "pid_0 = tile_id // num_pid_1" in kernel and "volatile=True" in kernel
    assert 'SYNC=y.device.type == "cuda", launch_cooperative_grid=y.device.type == "cuda"' in fwd
    assert "if tl.load(sync_flag_ptr) == 0:" in kernel
    # the CPU path: the two passes, rows of tiles first
    verdict = verify(p, out)
    assert verdict.correct, verdict.feedback()
    # the synchronised path where a row has one tile: N = 96 within BLOCK_N = 128
    forced = out.replace('SYNC=y.device.type == "cuda"', "SYNC=True").replace(
        'launch_cooperative_grid=y.device.type == "cuda"', "launch_cooperative_grid=False").replace(
        "BLOCK_N=32", "BLOCK_N=128")
    assert forced.count("SYNC=True") == 1 and "BLOCK_N=128" in forced
    verdict = verify(p, forced)
    assert verdict.correct, verdict.feedback()
    # without the flag the combine kernel reads back a tile nobody wrote: the verifier must see it, so the
    # synchronised path is what ran
    unflagged = forced.replace("tl.store(sync_count_ptr, 1)", "pass")
    assert unflagged != forced and not verify(p, unflagged).correct


def test_the_row_sync_needs_the_tile_loop_and_says_why(tmp_path):
    body, _ = SPLIT_READ_BACK["centred"]
    p = _problem(tmp_path, body)
    tactic, ctx = _applying_to(p, "fuse-split-row-reduction")
    fused = tactic.propose(ctx)[0].source
    with pytest.raises(NotApplicable, match="no persistent tile loop"):
        rowsync.plan(fused)
    with pytest.raises(NotApplicable, match="no generated row-combine kernel"):
        rowsync.plan(p.kernel_source)


def test_the_row_sync_refuses_a_warp_specialized_loop_and_xpu(tmp_path):
    from stages.persistent_rowsync import RowSync

    p, src = _split_persistent(tmp_path, "centred")
    ws = persistent.specialize(src, "_mm_bias")
    with pytest.raises(NotApplicable, match="warp-specialized"):
        rowsync.plan(ws)
    ctx = tactic_context(p, source=src)
    assert RowSync().check(ctx).applies
    xpu = tactic_context(p, source=src, kind="xpu", target="arc-b580")
    app = RowSync().check(xpu)
    assert not app.applies and "cooperative launch" in app.reason


def test_the_row_sync_takes_a_flattened_tile_loop_and_unflattens_it(tmp_path):
    """The ports adopt the flattened tile loop (H100, 2026-12-07, call V); the row sync applies on top of it and
    drops flatten=True, which Triton 3.6 cannot compile around the wait."""
    body, _ = SPLIT_READ_BACK["softmax-numerator"]
    p = _problem(tmp_path, body)
    tactic, ctx = _applying_to(p, "fuse-split-row-reduction")
    flat, _ = persistent.rewrite(tactic.propose(ctx)[0].source, flatten=True)
    assert "flatten=True" in flat
    out = rowsync.apply(flat)
    loop = next(ln for ln in out.splitlines() if ln.strip().startswith("for tile_id in tl.range("))
    assert "flatten" not in loop and loop.rstrip().endswith("sync_step):"), loop
