"""The swap-ab tactic (issue 34): a GEMM's tile computed transposed, C^T = B^T A^T, so N fills the matrix unit's deep
side at decode-sized M. On the interpreter: the rewrite of each accumulation form, its refusals with the reason,
and the candidate verified against the reference at the ci shape and the ragged ones (M = 17, 31: fewer rows than a
tile), for a launch in forward and one behind an @triton.autotune decorator."""

from __future__ import annotations

import pytest

from stages.device_tuning import STAGE
from tests.conftest import ROOT, tactic_context
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.device_tuning.swap_ab import swap_ab

TACTIC = next(t for t in STAGE.tactics if t.name == "swap-ab")
KERNELS = ROOT / "kernels"

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def k(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :])
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :])
        UPDATE
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)
'''


@pytest.mark.parametrize("update, swapped", [
    ("acc += tl.dot(a, b)", "acc += tl.dot(tl.trans(b), tl.trans(a))"),
    ("acc = tl.dot(a, b, acc)", "acc = tl.dot(tl.trans(b), tl.trans(a), acc)"),
    ('acc = acc + tl.dot(a, b, input_precision="ieee")',
     'acc = acc + tl.dot(tl.trans(b), tl.trans(a), input_precision="ieee")'),
])
def test_each_accumulation_form_is_swapped_and_transposed_back(update, swapped):
    src, plan = swap_ab(KERNEL.replace("UPDATE", update), "k")
    assert swapped in src and "acc = tl.zeros((BN, BM), dtype=tl.float32)" in src
    assert src.index("    acc = tl.trans(acc)\n") < src.index("tl.store(")  # after the loop, before the epilogue
    assert plan.shape == ("BM", "BN")


@pytest.mark.parametrize("update, says", [
    ("acc = acc * alpha[:, None] + tl.dot(a, b)", "reads acc outside a plain tl.dot update"),
    ("acc += tl.dot(a, b)\n        acc2 = tl.dot(a, b)", "2 tl.dot calls"),
])
def test_what_it_cannot_swap_is_refused_with_the_reason(update, says):
    with pytest.raises(NotApplicable, match=says):
        swap_ab(KERNEL.replace("UPDATE", update), "k")


@pytest.mark.parametrize("problem", ["gemm_relu", "gemm_skinny_m"])
def test_the_candidate_is_correct_at_every_correctness_shape(problem, verify):
    p = load_problem(KERNELS / problem)
    ctx = tactic_context(p)
    app = TACTIC.check(ctx)
    assert app.applies and "swap-AB" in app.reason, app.reason
    cand = TACTIC.propose(ctx)[0]
    assert cand.time_all_shapes and "tl.trans(acc)" in cand.source
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()


@pytest.mark.slow  # the corpus's forms: a persistent tile loop (the accumulator made per tile), int8 operands
@pytest.mark.parametrize("name", ["persistent_matmul", "w8a8_int8_matmul", "tma_matmul_desc"])
def test_the_corpus_forms_swap_correctly(name, verify):
    from tests.realworld import problem_dir

    p = load_problem(problem_dir(name))
    cand = TACTIC.propose(tactic_context(p))[0]
    verdict = verify(p, cand.source)
    assert verdict.correct, verdict.feedback()
