"""The device_tuning stage's host-descriptors tactic on the CPU interpreter, through the real verifier.

Each kernel's descriptors come from the block_io stage's rewrite (after the dtype and fusion stages' first
tactics, as a port would chain them) and, for the GEMM with the heaviest epilogue, the persistent tile loop and the
epilogue halves too; the host-side form must then verify in every style of the corpus (the launch in forward, in a
wrapper, behind a META grid, an ``@triton.autotune`` list whose pre_hook sets the block shapes, an
``autograd.Function``, a launcher class, a ``torch.library`` op, ...). The tactic applies only where a KB pattern
of the device asks for it (the H200), and says so elsewhere; kernels it cannot take keep their descriptors with the
reason.
"""

from __future__ import annotations

import ast

import pytest

import stages
from stages.device_tuning_host_desc import HostDescriptors
from tests.conftest import FIXTURES, load_kernel_module, sm90_compiler, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import NotApplicable, blockio, persistent
from xeforge.rewrite.device_tuning import epilogue, host_desc

STYLES = FIXTURES / "styles"
H200 = dict(kind="cuda", target="h200", cores=132)


def described(problem: str, style: str, tile_loop: bool = False) -> tuple[object, str]:
    """The style's file after the dtype and fusion stages' first tactics and the block_io rewrite (and, with
    ``tile_loop``, a persistent tile loop with the epilogue in column halves), and its problem."""
    p = load_problem(STYLES / problem / f"{style}.py")
    src = p.kernel_source
    for stage in stages.ALL:
        if stage.name not in ("dtype", "fusion"):
            continue
        ctx = tactic_context(p, source=src, **H200)
        tactic = next((t for t in stage.tactics if t.check(ctx).applies), None)
        if tactic is not None:
            src = tactic.propose(ctx)[0].source
    src, plan = blockio.rewrite(src)
    if tile_loop:
        src, _ = persistent.rewrite(src, kernel=plan.kernel)
        src, _ = epilogue.split_epilogue(src, plan.kernel)
    return p, src


def _calls(src: str, name: str) -> int:
    return sum(1 for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) and
               (ast.unparse(n.func) == name or ast.unparse(n.func).endswith("." + name)))


@pytest.mark.parametrize("style", ["direct", "autotune", "wrapper", "launcher"])
def test_host_descriptors_verify_in_the_styles(verify, style):
    p, src = described("linear_gelu_residual", style, tile_loop=style in ("direct", "autotune"))
    ctx = tactic_context(p, source=src, **H200)
    tactic = HostDescriptors()
    app = tactic.check(ctx)
    assert app.applies, app.reason
    assert "bio-host-descriptors-on-hopper" in app.reason
    new = tactic.propose(ctx)[0].source
    assert _calls(new, "make_tensor_descriptor") == 0 and _calls(new, "TensorDescriptor") >= 3
    assert _calls(new, "set_allocator") == 0  # no device-side descriptor left: no scratch allocator
    if style == "autotune":
        assert ".pre_hook = " in new and "block_shape = [" in new
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()


@pytest.mark.slow
@pytest.mark.parametrize("problem,style", [("linear_gelu_residual", s) for s in
                                           ("meta_grid", "autograd", "param_cast", "constants", "library_op",
                                            "backward_kernels")] +
                         [("linear_groupnorm", "direct"), ("linear_groupnorm", "autotune"),
                          ("linear_logsumexp", "direct"), ("linear_relu", "constants")])
def test_host_descriptors_verify_in_the_other_styles(verify, problem, style):
    p, src = described(problem, style)
    new, plan = host_desc.rewrite(src)
    assert plan.descs and _calls(new, "make_tensor_descriptor") == 0
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()


def test_only_where_the_kb_asks_for_it():
    p, src = described("linear_gelu_residual", "direct")
    for kw in (dict(kind="cpu"), dict(kind="xpu", target="arc-b580", cores=20)):
        app = HostDescriptors().check(tactic_context(p, source=src, **kw))
        assert not app.applies and "tactic: host-descriptors" in app.reason, app.reason


def test_the_launch_block_shape_and_the_guard_come_from_the_launch():
    _, src = described("linear_gelu_residual", "constants")
    new, plan = host_desc.rewrite(src)
    model = parse_kernel(new)
    fn = model.functions[plan.kernel]
    assert [d.name for d in plan.descs] == fn.params[-len(plan.descs):]
    site = next(s for s in model.launches if s.kernel == plan.kernel)
    kw = {k.arg: ast.unparse(k.value) for k in site.node.keywords}
    assert kw[blockio.FLAG].startswith("host_descriptors")
    text = "\n".join(new.splitlines()[site.line - 8:site.line])
    assert "bool(use_block_io) and min(" in text
    # the block shape is the launch's own constexpr expressions (module constants here), not a value read once
    launch_blocks = {k: kw[k] for k in ("BLOCK_M", "BLOCK_K")}
    assert f"[{launch_blocks['BLOCK_M']}, {launch_blocks['BLOCK_K']}]" in new


def test_descriptors_the_host_cannot_make_stay_with_the_reason():
    src = '''
import torch
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, M, N, BLOCK: tl.constexpr):
    rows = M // 2
    d = tl.make_tensor_descriptor(x_ptr, shape=[rows, N], strides=[N, 1], block_shape=[BLOCK, BLOCK])
    for i in range(2):
        e = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK, BLOCK])
        e.store([i * BLOCK, 0], d.load([0, 0]))


class Model(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        k[(1,)](x, y, x.shape[0], x.shape[1], BLOCK=16)
        return y
'''
    with pytest.raises(NotApplicable) as exc:
        host_desc.rewrite(src)
    text = str(exc.value)
    assert "rows, computed in the kernel" in text and "inside a loop" in text


def test_a_launch_argument_with_side_effects_is_not_evaluated_twice():
    _, src = described("linear_gelu_residual", "direct")
    model = parse_kernel(src)
    site = next(s for s in model.launches if s.kernel == "linear_bias_kernel")
    line = src.splitlines()[site.line - 1]
    # pass M through a call the host must not repeat
    bad = src.replace("x, self.proj.weight, self.proj.bias, y, M, N, K,",
                      "x, self.proj.weight, self.proj.bias, y, next(iter([M])), N, K,")
    assert bad != src, line
    with pytest.raises(NotApplicable, match="evaluate a second time"):
        host_desc.rewrite(bad)


def test_the_ci_shapes_run_the_host_descriptors(verify):
    """A wrong extent in one host-side descriptor must fail the verifier: the ci shapes take the host path."""
    p, src = described("linear_gelu_residual", "wrapper")
    new, _ = host_desc.rewrite(src)
    assert new.count("TensorDescriptor(x, [M, K]") == 1, new
    verdict = verify(p, new.replace("TensorDescriptor(x, [M, K]", "TensorDescriptor(x, [M, K // 2]"))
    assert not verdict.correct


def test_host_descriptors_compile_to_tma_without_scratch_for_hopper(tmp_path):
    """No GPU needed (as the block_io test does it): the host-side form compiles for sm_90 to TMA copies feeding
    wgmma with no global scratch (the device-side form needs triton.set_allocator's)."""
    import triton

    GPUTarget, ASTSource = sm90_compiler()
    _, src = described("linear_gelu_residual", "direct", tile_loop=True)
    new, plan = host_desc.rewrite(src)
    fn = load_kernel_module(tmp_path / "host_desc_sm90.py", new, "xeforge_test_host_desc_sm90").linear_bias_kernel
    consts = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, blockio.FLAG: True}
    blocks = {"x_desc": "128,64", "w_desc": "256,64", "out_desc": "128,128"}
    assert set(blocks) == {d.name for d in plan.descs}
    sig = {a: "constexpr" if a in consts else f"tensordesc<bf16[{blocks[a]}]>" if a in blocks else
           "*bf16" if a.endswith("_ptr") else "i32" for a in fn.arg_names}
    const_idx = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    out = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const_idx), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 8, "num_stages": 3})
    assert "cp.async.bulk.tensor" in out.asm["ptx"] and "wgmma" in out.asm["ptx"]
    assert out.metadata.global_scratch_size == 0


def test_a_per_shape_dispatch_gets_descriptors_at_each_launch(verify):
    """The per-shape-config tactic runs before this one: gemm_relu's launch becomes two (``if M <= 31: ... else:
    ...``), each with its own block sizes; each launch builds its descriptors with its own block shape, and both
    branches verify (the CPU's ci M=32 takes the else branch, the ragged 31 and 17 the new one)."""
    from tests.conftest import ROOT
    from xeforge.rewrite.tiling.dispatch import Branch, dispatch

    p = load_problem(ROOT / "kernels" / "gemm_relu")
    src, _ = blockio.rewrite(p.kernel_source)
    src = dispatch(src, "matmul_kernel", [Branch("M <= 31", {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16,
                                                              "num_warps": 2})])
    new, plan = host_desc.rewrite(src)
    assert len(plan.sites) == 2
    assert "[16, 16]" in new and "[32, 32]" in new  # a's block at each launch: (BLOCK_M, BLOCK_K) of its branch
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()


def test_retiling_a_dispatched_kernel_offers_nothing_instead_of_failing():
    """A kernel launched from two places (a per-shape dispatch) has no one configuration to re-tile: the tactics
    that offer their rewrite at the KB's tiles get none, where they raised and stopped the port on the H200."""
    from tests.conftest import ROOT
    from xeforge.rewrite.autotune import with_configs
    from xeforge.rewrite.tiling.dispatch import Branch, dispatch

    p = load_problem(ROOT / "kernels" / "gemm_relu")
    src = dispatch(p.kernel_source, "matmul_kernel", [Branch("M <= 31", {"BLOCK_M": 16})])
    ctx = tactic_context(p, source=src, **H200)
    assert with_configs(ctx, src, "matmul_kernel", 2) == []
    assert with_configs(tactic_context(p, **H200), p.kernel_source, "matmul_kernel", 2)  # one launch: configs


GEMM_PROBLEMS = ("linear_relu", "linear_gelu_residual", "linear_logsumexp", "linear_groupnorm")


@pytest.mark.slow
@pytest.mark.parametrize("problem", GEMM_PROBLEMS)
def test_it_applies_in_every_style_of_the_corpus_gemm_problems(problem):
    """Wherever the block_io rewrite applied, this one does: every style of the corpus's four GEMM problems."""
    from tests.test_style_corpus import styles_of

    missing = {}
    for style in styles_of(problem):
        _, src = described(problem, style)
        try:
            new, plan = host_desc.rewrite(src)
        except NotApplicable as exc:
            missing[style] = str(exc)
            continue
        if _calls(new, "make_tensor_descriptor"):
            missing[style] = f"left in the kernel: {plan.kept}"
    assert not missing, missing
