"""The split reduction (device_tuning): few programs that each run a long reduction loop get SPLIT programs per
program over slices of the loop, and a second kernel combines their partial states in slice order.

Kernels of the real-world corpus, brought in with ``xeforge new``: cross-entropy over a vocabulary (one program a
token: a running max, a sum rescaled by it, a plain sum), GQA decode attention (one program a sequence and kv head:
[BLOCK_H] and [BLOCK_H, BLOCK_D] states rescaled by the max). Every rewrite is verified on the CPU interpreter at ci
and the ragged shapes, where slices are short or empty (ci's 2 loop steps over 3 or 4 slices); a combine that drops
the rescale is rejected there. The per-shape-config tactic offers the split in the branch of a class of few rows
only, with a stand-in H200 (132 cores); loops the combine cannot merge are left alone with the reason.
"""

from __future__ import annotations

import ast

import pytest

from stages import device_tuning
from stages.device_tuning_splitred import SplitReduction
from tests.conftest import tactic_context
from tests.realworld import problem_dir
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite.device_tuning import splitred
from xeforge.rewrite.tiling import NotApplicable

CE, CE_KERNEL = "cross_entropy_fwd", "_cross_entropy_fwd_kernel"
GQA, GQA_KERNEL = "gqa_decode_gather", "_gqa_decode_kernel"


def problem(name: str):
    return load_problem(problem_dir(name))


def states(plan: splitred.Plan) -> list[tuple[str, str, list[str], str | None]]:
    return [(s.name, s.kind, s.shape, s.factor and ast.unparse(s.factor)) for s in plan.states]


def test_cross_entropy_is_split_and_its_states_combined_in_order(verify):
    """m (max), s (rescaled by exp(m - m_new)) and total (a sum under `if HAS_SMOOTHING:`) are the loop's states.
    SPLIT=4 over ci's two vocabulary chunks leaves two slices empty: their -inf max adds nothing."""
    p = problem(CE)
    plan = splitred.find(p.kernel_source, CE_KERNEL)
    assert states(plan) == [("m", "max", [], None), ("s", "rescaled", [], "tl.exp(m - m_new)"),
                            ("total", "sum", [], None)]
    assert plan.new_max == {"m_new"}
    src = splitred.apply(p.kernel_source, plan, 4)
    for text in ("sp = tl.program_id(0) % SPLIT", "row = (tl.program_id(0) // SPLIT).to(tl.int64)",
                 "it_hi = tl.minimum(n_it, it_lo + it_per)",
                 "for start in range(it_lo * BLOCK_V, it_hi * BLOCK_V, BLOCK_V):",
                 "tl.store(m_part + part_idx, m)", "m = tl.maximum(m, tl.load(m_part + part_idx + sj))",
                 "w_s = tl.exp(m_j - m)", "s = s + tl.where(w_s > 0, tl.load(s_part + part_idx + sj) * w_s, 0.0)",
                 "total = total + tl.load(total_part + part_idx + sj)", "split_r = 4",
                 f"{CE_KERNEL}_split[(grid_r[0] * split_r,)](", f"{CE_KERNEL}_combine[grid_r]("):
        assert text in src, text
    assert [s.kernel for s in parse_kernel(src).launches] == [f"{CE_KERNEL}_split", f"{CE_KERNEL}_combine"]
    assert f"def {CE_KERNEL}(" not in src  # without a class test the copies take the kernel's place
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_a_combine_that_drops_the_rescale_is_rejected(verify):
    """The slices' sums are relative to their own max: added without exp(m_j - m) the loss is wrong."""
    p = problem(CE)
    src = splitred.apply(p.kernel_source, splitred.find(p.kernel_source, CE_KERNEL), 2)
    bad = src.replace("tl.load(s_part + part_idx + sj) * w_s", "tl.load(s_part + part_idx + sj)")
    assert bad != src
    assert not verify(p, bad).correct


def test_decode_attention_tiles_are_split_in_the_class_branch_only(verify):
    """[BLOCK_H] and [BLOCK_H, BLOCK_D] states, the accumulator rescaled by alpha[:, None] (alpha spelled out); the
    partials sized on the host from the launch's block_h and block_d. With `batch <= 2` ci's batch 2 runs the split
    (SPLIT=3: two steps, one empty slice) and the ragged batch 17 the kernel as written."""
    p = problem(GQA)
    plan = splitred.find(p.kernel_source, GQA_KERNEL)
    assert states(plan) == [("m_i", "max", ["BLOCK_H"], None),
                            ("l_i", "rescaled", ["BLOCK_H"], "tl.exp(m_i - m_new)"),
                            ("acc", "rescaled", ["BLOCK_H", "BLOCK_D"], "tl.exp(m_i - m_new)[:, None]")]
    src = splitred.apply(p.kernel_source, plan, 3, when="batch <= 2")
    for text in ("if batch <= 2:", "grid_r = grid", "acc_partials = torch.empty(grid_r[0] * grid_r[1] * grid_r[2] * "
                 "split_r * block_h * block_d, device=q.device, dtype=torch.float32)",
                 f"{GQA_KERNEL}_split[(grid_r[0] * split_r, grid_r[1], grid_r[2])](",
                 "tl.arange(0, BLOCK_H)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]",
                 "w_acc = tl.exp(m_j - m_i)[:, None]", "else:"):
        assert text in src, text
    assert [s.kernel for s in parse_kernel(src).launches] == [f"{GQA_KERNEL}_split", f"{GQA_KERNEL}_combine",
                                                              GQA_KERNEL]
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_per_shape_config_offers_it_for_the_class_of_few_rows(verify):
    """16 tokens x 128k vocabulary (bench-gpu-1) is 16 programs for 132 cores: the `n_rows <= 256` branch gets
    SPLIT=16 (the smallest that fills the cores) and 8; the else branch keeps the kernel's launch. Verified with a
    threshold that splits the CPU's shapes (ci's 2 tokens split, the ragged 17 not)."""
    p = problem(CE)
    tactic = next(t for t in device_tuning.STAGE.tactics if t.name == "per-shape-config")
    ctx = tactic_context(p, kind="cuda", target="h200", cores=132)
    split = [c for c in tactic.propose(ctx) if splitred.PARAM in c.params]
    assert [c.params[splitred.PARAM] for c in split] == [16, 8]
    assert all(c.params["when"] == "n_rows <= 256" and c.time_all_shapes for c in split)
    assert "16 programs and 32 loop steps at bench-gpu-1 for 132 cores" in split[0].description
    verdict = verify(p, split[0].source.replace("if n_rows <= 256:", "if n_rows <= 2:"))
    assert verdict.correct, verdict.feedback()


def test_the_tactic_splits_where_the_bench_shape_leaves_cores_idle(verify):
    """At bench-gpu GQA decode launches 256 programs: they fill an H200, not a device of 1024 cores (SPLIT=4 first,
    then the larger values); the interpreter gets one candidate, SPLIT=2, verified."""
    p = problem(GQA)
    tactic = SplitReduction()
    full = tactic.check(tactic_context(p, kind="cuda", target="h200", cores=132))
    assert not full.applies and "256 programs at bench-gpu already fill the 132 cores" in full.reason, full.reason
    wide = tactic.propose(tactic_context(p, kind="cuda", target="h200", cores=1024))
    assert [c.params[splitred.PARAM] for c in wide] == [4, 16, 8, 2]
    assert "256 programs and 64 loop steps at bench-gpu for 1024 cores" in wide[0].description
    (cand,) = tactic.propose(tactic_context(p))
    assert cand.params[splitred.PARAM] == 2 and cand.time_all_shapes
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


def _ce(old: str, new: str):
    def make(src: str) -> str:
        assert old in src, old
        return src.replace(old, new)
    return make


@pytest.mark.parametrize("make,reason", [
    (_ce("        m = m_new\n", "        m = m_new * 1.0\n"),
     "carries m (line 32: m = m_new * 1.0), which is not a running max, a sum, or a sum rescaled by the max"),
    (_ce("s = s * tl.exp(m - m_new)", "s = s * 0.5"), "which is not an exponential of m against its next value"),
    (_ce("        m = m_new\n", "        m = m_new\n        tl.store(Lse + row, m)\n"), "writes memory (line 33)"),
    (_ce("    total = tl.zeros([], dtype=tl.float32)", "    total = tl.full([], 1.0, tl.float32)"),
     "which starts at tl.full([], 1.0, tl.float32), not 0"),
    (_ce("    lse = m + tl.log(s)", "    lse = m + tl.log(s) + 0.0 * tl.max(z, axis=0)"), "reads z, set inside"),
    (_ce("    s = tl.zeros([], dtype=tl.float32)", "    s = tl.zeros([], dtype=tl.float16)"),
     "the partials are stored in float32"),
    (_ce("tl.where(mask, z, 0.0)", "tl.where(mask, z - m_new, 0.0)"),
     "adds to total a value made from m, m_new (line 34): a slice's sum would depend on the others'"),
    (_ce("tl.where(mask, z, 0.0)", "tl.where(mask, z * s, 0.0)"), "adds to total a value made from m, m_new, s (line 34)"),
], ids=["not-a-max", "not-an-exponential", "store-in-the-loop", "not-the-identity", "loop-local-after",
        "fp16-state", "sum-of-the-max", "sum-of-another-state"])
def test_loops_the_combine_cannot_merge_are_left_alone_with_the_reason(make, reason):
    p = problem(CE)
    with pytest.raises(NotApplicable) as err:
        splitred.find(make(p.kernel_source), CE_KERNEL)
    assert reason in str(err.value), str(err.value)


def test_a_max_started_as_zeros_minus_inf_is_a_max():
    """`m_i = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")`, the other way kernels write it."""
    p = problem(GQA)
    src = p.kernel_source.replace('m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)',
                                  'm_i = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")')
    assert src != p.kernel_source
    assert states(splitred.find(src, GQA_KERNEL))[0] == ("m_i", "max", ["BLOCK_H"], None)


@pytest.mark.parametrize("name,kernel,reason", [
    ("swiglu_fwd", "_swiglu_fwd_kernel", "depends on the meta-parameters"),
    ("fused_add_rmsnorm", "_fused_add_rmsnorm_kernel", "has no loop at its top level to split"),
    ("matmul_config_by_m", "_linear_kernel", "advances x_ptrs from x_ptr + rows[:, None] * stride_xm + ks[None, :] * "
     "stride_xk (line 40): a pointer or counter"),
])
def test_other_kernels_are_left_alone_with_the_reason(name, kernel, reason):
    p = problem(name)
    with pytest.raises(NotApplicable) as err:
        splitred.find(p.kernel_source, kernel)
    assert reason in str(err.value), str(err.value)


def test_registered_right_after_split_k():
    names = [t.name for t in device_tuning.STAGE.tactics]
    assert names.index("split-reduction") == names.index("split-k") + 1
