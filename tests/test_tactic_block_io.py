"""The block_io stage's tensor-descriptor tactic on the CPU interpreter, through the real verifier.

The rewrite applies to the naive GEMM ports, the NVIDIA-tuned GEMMs (pointer increments, block pointers) and
a fixture with both loop shapes; each rewrite passes ``Verifier.verify`` with the knowledge base's gate-1
constraints (float64 oracle, ragged shapes that take the pointer fallback). Injected bugs prove that the ci
shapes run the descriptor path and the ragged ones the fallback. The form follows the KB (block pointers when
the Triton lacks descriptors, plain pointers on DG2); unsupported shapes are left alone with a reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stages import block_io
from tests.conftest import FIXTURES, ROOT, load_kernel_module, sm90_compiler, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite import blockio
from xeforge.rewrite.tiling import NotApplicable

KERNELS = ROOT / "kernels"
HERE = FIXTURES / "tactics" / "block_io"
TACTIC = block_io.TensorDescriptorTiles()



def context(p, source: str | None = None, kind: str = "cpu", target: str | None = None, triton: str | None = None):
    return tactic_context(p, source, kind, target, cores=20, triton=triton)


def rewritten(p, **kw) -> str:
    ctx = context(p, **kw)
    app = TACTIC.check(ctx)
    assert app.applies, app.reason
    cands = TACTIC.propose(ctx)
    assert cands and cands[0].kind == "rewrite" and cands[0].tactic == "tensor-descriptor"
    return cands[0].source


@pytest.mark.parametrize("folder", [KERNELS / "kb09_matmul_subtract_multiply_relu",
                                    KERNELS / "gemm_square", KERNELS / "gemm_tall_k", HERE / "linear_small_tiles",
                                    HERE / "inline_program_ids"],
                         ids=lambda p: Path(p).name)
def test_descriptor_rewrite_is_correct(verify, folder):
    p = load_problem(folder)
    src = rewritten(p)
    assert "tl.make_tensor_descriptor(" in src and ".load([" in src
    fn = parse_kernel(src).functions
    assert any(blockio.FLAG in f.constexpr_params for f in fn.values())
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_program_ids_read_inline_are_named_first():
    """``tl.program_id(axis=0) * TM + tl.arange(0, TM)`` written where it is used (no ``pid = ...`` line), and K
    offsets summed inline (``(k + ks)[None, :]``): the tile starts are named at the kernel's top, so the loads and
    the store are recognised tiles (before, their pointers read as unknown and nothing was rewritten)."""
    src = rewritten(load_problem(HERE / "inline_program_ids"))
    assert "pid_0 = tl.program_id(0)" in src and "lhs = a_desc.load([pid_0 * TM, k])" in src, src
    assert "out_desc.store([pid_0 * TM, pid_1 * TN]" in src, src


def test_weight_used_transposed_gets_a_transposed_view_and_a_runtime_guard():
    p = load_problem(KERNELS / "kb09_matmul_subtract_multiply_relu")
    plan = blockio.plan_block_io(parse_kernel(p.kernel_source), "matmul_bias_kernel")
    by_base = {a.desc.base: a.desc for a in plan.accesses}
    assert by_base["w_ptr"].transposed and not by_base["a_ptr"].transposed
    # the weight [N, K] is described as is, its last stride literally 1, and the loaded tile is transposed back
    src, _ = blockio.rewrite(p.kernel_source)
    assert "shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K]" in src
    assert ".load([pid_n * BLOCK_N, k0]).T" in src
    assert "self.linear.weight.stride(1) == 1" in src
    assert "(self.linear.weight.stride(0) * self.linear.weight.element_size()) % 16 == 0" in src


def _mutate(src: str, old: str, new: str) -> str:
    assert src.count(old) >= 1, old
    return src.replace(old, new, 1)


def test_ci_shapes_take_the_descriptor_path_and_ragged_shapes_the_fallback(verify):
    p = load_problem(HERE / "linear_small_tiles")
    src = rewritten(p)
    # break only the descriptor branch: the aligned ci variant must catch it
    bad_fast = _mutate(src, "x_desc.load([pid_m * BLOCK_M, k0])", "x_desc.load([pid_m * BLOCK_M, 0])")
    v = verify(p, bad_fast)
    assert not v.correct and v.failed_gate.details.get("variant") == "ci", v.feedback()
    # break only the pointer fallback (else branch): a ragged variant (K=47 or 17 floats: unaligned) must catch it
    tree = ast.parse(src)
    else_load = [n for n in ast.walk(tree) if isinstance(n, ast.If) and n.orelse and
                 any(isinstance(x, ast.Call) and ast.unparse(x.func) == "tl.load" for x in ast.walk(n.orelse[0]))]
    assert else_load, "the rewrite keeps the pointer loop as the fallback"
    bad_slow = _mutate(src, "stride_yn, acc.to(", "stride_yn, (2 * acc).to(")
    v = verify(p, bad_slow)
    assert not v.correct and "ragged" in v.failed_gate.details.get("variant", ""), v.feedback()


@pytest.mark.parametrize("where,fast_load,broken", [
    ("flash_attn_fwd", "v_desc.load([start_n, 0])", "v_desc.load([0, 0])"),
    # its ci shapes are one tile: the bug is a descriptor made at the first batch's matrix for every batch
    ("batched_matmul_3d", "tl.make_tensor_descriptor(b_ptr + bid.to(tl.int64) * stride_bb, ",
     "tl.make_tensor_descriptor(b_ptr, "),
    # packed sequences: each program's descriptor starts at its sequence's offset, loaded from cu_seqlens
    ("context_attn_varlen", "V_desc.load([start_n, 0])", "V_desc.load([0, 0])"),
    # the tutorial form: block pointers made at a head's matrix, the K loop in a jit helper (inlined first)
    pytest.param("flash_attn_fwd_autotune", "V_desc.load([start_n, 0])", "V_desc.load([0, 0])",
                 marks=pytest.mark.slow),  # about 35 s: the autotuner's configs on the interpreter
])
def test_a_batch_or_head_offset_base_and_a_whole_head_dim_take_descriptors(where, fast_load, broken, verify):
    """A tile whose matrix starts at a batch's or head's offset (``k_ptr + off_b * stride_kb + off_h * stride_kh``),
    or at a packed sequence's start the kernel loads first (``seq_start = tl.load(Cu_seqlens + b)``), gets its
    descriptor made at that start, and the guard checks that the batch strides keep it 16-byte aligned;
    an attention head's dimension read whole and unmasked (``tl.arange(0, HEAD_DIM)``) is the descriptor's
    extent there. The start's products are 64-bit (``off_b.to(tl.int64) * stride_vb``: a batch's matrix can start past
    2**31 elements). The ci shapes take the descriptor path: a bug in it alone fails at ci."""
    from tests.realworld import problem_dir

    p = load_problem(KERNELS / where if (KERNELS / where).is_dir() else problem_dir(where))
    src = rewritten(p)
    base = {"flash_attn_fwd": "v_ptr + off_b.to(tl.int64) * stride_vb + off_h.to(tl.int64) * stride_vh",
            "batched_matmul_3d": "b_ptr + bid.to(tl.int64) * stride_bb",
            "context_attn_varlen": "V + head.to(tl.int64) * stride_vh + seq_start.to(tl.int64) * stride_vt",
            "flash_attn_fwd_autotune": "V + off_h.to(tl.int64) * stride_vh + off_z.to(tl.int64) * stride_vz"}
    assert f"tl.make_tensor_descriptor({base[where]}, " in src, src
    stride0 = {"flash_attn_fwd": "v.stride(0)", "batched_matmul_3d": "b.stride(0)",
               "context_attn_varlen": "v.stride(0)", "flash_attn_fwd_autotune": "v.stride(0)"}[where]
    assert f"({stride0} * " in src  # the batch stride's alignment is part of the run-time guard
    if where == "flash_attn_fwd":
        assert "shape=[S, HEAD_DIM]" in src and "block_shape=[BLOCK_N, HEAD_DIM]" in src
    if where == "flash_attn_fwd_autotune":  # the helper's K loop is the kernel's now; the helper itself is gone
        assert "def _attn_fwd_inner" not in src and "K_desc.load([start_n, 0]).T" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()
    v = verify(p, _mutate(src, fast_load, broken))
    assert not v.correct and v.failed_gate.details.get("variant") == "ci", v.feedback()


def test_a_k_loop_that_leaves_k_unmasked_gives_the_descriptor_its_stop_as_the_extent(verify):
    """int4_dequant_matmul (the corpus): the activations are loaded with a mask on their rows only, the kernel
    assuming K % BLOCK_K == 0, and the K loop steps over the whole K by BLOCK_K; the descriptor's extent along K is
    the loop's stop. The packed weight (rows ``offs_k // 8``) stays pointers, and the reason names it."""
    from tests.realworld import problem_dir

    p = load_problem(problem_dir("int4_dequant_matmul"))
    app = TACTIC.check(context(p))
    assert app.applies and "load of QW at line" in app.reason, app.reason
    src = rewritten(p)
    assert "tl.make_tensor_descriptor(X, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_tile_coordinates_a_scalar_helper_computes_are_read_through_it(verify):
    """``pid_m, pid_n = _tile_coords(tile_id, ...)`` (a grouped order in a jit helper of scalar arithmetic): each
    name is a scalar of its own, so the K loop's tiles are recognised and read through descriptors made once per
    program, before its tile loop. A helper that makes tensors is not read so."""
    from tests.realworld import problem_dir
    from xeforge.rewrite.tiling import _scalar_only

    p = load_problem(problem_dir("persistent_matmul"))
    src = rewritten(p)
    assert "a = a_desc.load([pid_m * BLOCK_M, ks * BLOCK_K])" in src, src
    fn = parse_kernel(src).functions["_persistent_matmul_kernel"].node
    loop = next(st for st in ast.walk(fn) if isinstance(st, ast.If) and isinstance(st.body[0], ast.Assign))
    assert "make_tensor_descriptor" in ast.unparse(loop.body[0])  # made before the tile loop, once per program
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()
    v = verify(p, _mutate(src, "a_desc.load([pid_m * BLOCK_M, ks * BLOCK_K])", "a_desc.load([pid_m * BLOCK_M, 0])"))
    assert not v.correct and v.failed_gate.details.get("variant") == "ci", v.feedback()
    helpers = parse_kernel(p.kernel_source).functions
    assert _scalar_only(helpers["_tile_coords"].node)
    tensor_helper = ast.parse("def offsets(pid, BLOCK: tl.constexpr):\n    return pid * BLOCK + tl.arange(0, BLOCK)\n")
    assert not _scalar_only(tensor_helper.body[0])


@pytest.mark.slow  # about 18 s
def test_block_pointers_when_the_kb_rejects_descriptors_for_the_triton(verify):
    p = load_problem(KERNELS / "gemm_relu")
    ctx = context(p, kind="cuda", target="h200", triton="3.3.0")  # tl.make_tensor_descriptor is 3.4+
    modes, _ = block_io.preferred_modes(ctx)
    assert modes[0] == blockio.DESCRIPTOR
    app = TACTIC.check(ctx)
    assert app.applies and "block pointers" in app.reason, app.reason
    src = TACTIC.propose(ctx)[0].source
    assert "tl.make_block_ptr(" in src and "tl.make_tensor_descriptor" not in src
    assert "set_allocator" not in src  # block pointers need no scratch allocation
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_arc_a770_keeps_plain_pointers_with_the_kb_reason():
    p = load_problem(KERNELS / "gemm_relu")
    app = TACTIC.check(context(p, kind="xpu", target="arc-a770"))
    assert not app.applies and "bio-keep-pointers-on-dg2" in app.reason


def test_allocator_is_set_for_cuda_only():
    p = load_problem(KERNELS / "gemm_relu")
    cuda = TACTIC.propose(context(p, kind="cuda", target="h200"))
    xpu = TACTIC.propose(context(p, kind="xpu", target="arc-b580"))
    assert 'device.type == "cuda"' in cuda[0].source and "triton.set_allocator(" in cuda[0].source
    assert "set_allocator" not in xpu[0].source
    # on a GPU the rewrite is also offered with the KB's tile seeds (the verifier times each one), first for
    # gemm_relu's untuned 32 x 32 tile
    assert len(cuda) == 1 + block_io.RETILE_CONFIGS
    assert "BLOCK_M=128" in cuda[0].source and "triton.cdiv(M, 128)" in cuda[0].source


@pytest.mark.parametrize("folder,reason", [
    (KERNELS / "softmax", "no launched kernel calls tl.dot"),
    (HERE / "wrapped_offsets", "not base + start + tl.arange(0, BLOCK) tiles"),
], ids=["no-dot", "wrapped-offsets"])
def test_unsupported_shapes_are_left_alone_with_a_reason(folder, reason):
    p = load_problem(folder)
    ctx = context(p)
    app = TACTIC.check(ctx)
    assert not app.applies and reason in app.reason, app.reason
    assert TACTIC.propose(ctx) == []


def test_a_rewritten_kernel_is_not_rewritten_again():
    p = load_problem(KERNELS / "gemm_relu")
    src = rewritten(p)
    app = TACTIC.check(context(p, source=src))
    assert not app.applies and "already" in app.reason
    with pytest.raises(NotApplicable):
        blockio.rewrite(src)


def test_detector_names_the_pointer_tiles():
    p = load_problem(KERNELS / "gemm_relu")
    issues = block_io.STAGE.detect(context(p))
    assert [i.code for i in issues] == ["pointer-tiles"] and "a_ptr, b_ptr" in issues[0].message


def test_dry_run_shows_the_descriptor_diff_for_the_target(tmp_path):
    from xeforge.pipeline import Pipeline, PortOptions

    plan = Pipeline(load_problem(KERNELS / "gemm_square"),
                    PortOptions(device="cpu", stages=["block_io"], dry_run=True, engine="rules",
                                target="h200", runs_dir=tmp_path)).dry_run()
    (stage_plan,) = plan["stages"]
    (t,) = stage_plan["tactics"]
    assert t["name"] == "tensor-descriptor" and t["applies"], t
    assert "+        a_desc = tl.make_tensor_descriptor(a_ptr" in t["diff"]
    assert "triton.set_allocator(" in t["diff"]  # planned for the H200: device-side TMA descriptors


def test_a_failing_rewrite_or_detector_is_reported_not_raised():
    from stages.base import guarded
    from xeforge.rewrite.tiling.tactics import RewriteMemo

    p = load_problem(KERNELS / "gemm_relu")
    ctx = context(p)

    def broken(_ctx):
        raise KeyError("boom")

    with pytest.raises(NotApplicable, match="KeyError"):
        RewriteMemo().get(ctx, broken)
    issues = guarded("block_io")(broken)(ctx)
    assert [i.code for i in issues] == ["analysis-failed"] and "boom" in issues[0].message


def test_rewritten_gemm_compiles_to_tma_and_wgmma_for_hopper(tmp_path):
    """No GPU needed: Triton compiles for sm_90 on the host (ptxas ships with the wheel). The chain
    block_io -> persistent -> swizzle must lower its descriptors to TMA copies feeding wgmma, and needs the
    global scratch that ``triton.set_allocator`` provides; the fallback path compiles without TMA."""
    import triton

    GPUTarget, ASTSource = sm90_compiler()
    from xeforge.rewrite import persistent
    from xeforge.rewrite.device_tuning import swizzle

    p = load_problem(KERNELS / "gemm_relu")
    src, _ = blockio.rewrite(p.kernel_source)
    src, _ = persistent.rewrite(src)
    src, _ = swizzle.rewrite(src)
    fn = load_kernel_module(tmp_path / "kernel_sm90.py", src, "xeforge_test_sm90").matmul_kernel
    assert isinstance(fn, triton.runtime.jit.JITFunction)

    def build(use_block_io: bool):
        consts = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_SIZE_M": 8, blockio.FLAG: use_block_io}
        sig = {a: "constexpr" if a in consts else ("*bf16" if a.endswith("_ptr") else "i32") for a in fn.arg_names}
        const_idx = {(fn.arg_names.index(k),): v for k, v in consts.items()}
        return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const_idx),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})

    fast = build(True)
    assert "cp.async.bulk.tensor" in fast.asm["ptx"] and "wgmma" in fast.asm["ptx"]
    assert fast.metadata.global_scratch_size > 0  # device-side descriptors: the allocator forward sets is needed
    slow = build(False)
    assert "cp.async.bulk.tensor" not in slow.asm["ptx"] and slow.metadata.global_scratch_size == 0


def test_epilogue_tile_loads_are_a_separate_gpu_candidate(verify):
    """linear_gelu_residual (the style corpus) after fuse-epilogue loads its residual tile after the K loop. The
    base candidate keeps that load on pointers (a staging buffer per descriptor costs shared memory); on a GPU a
    further candidate moves it through a descriptor too, and it is correct on the interpreter (ragged ci shapes
    take the pointer fallback). The interpreter is not offered it: nothing there could time the difference."""
    from stages import fusion

    p = load_problem(FIXTURES / "styles" / "linear_gelu_residual" / "direct.py")
    fuse = next(t for t in fusion.STAGE.tactics if t.name == "fuse-epilogue")
    fused = fuse.propose(context(p))[0].source
    kernel = blockio.choose_kernel(parse_kernel(fused))
    base = blockio.plan_block_io(parse_kernel(fused), kernel)
    more = blockio.plan_block_io(parse_kernel(fused), kernel, epilogue_loads=True)
    assert "residual_ptr" not in {a.desc.base for a in base.accesses}
    assert "residual_ptr" in {a.desc.base for a in more.accesses if a.access.kind == "load" and not a.access.loops}
    assert "b_ptr" not in {a.desc.base for a in more.accesses}  # the bias vector is no tile
    cpu = TACTIC.propose(context(p, fused))
    assert all(not c.params.get("epilogue_loads") for c in cpu)
    gpu = [c for c in TACTIC.propose(context(p, fused, kind="cuda", target="h200")) if c.params.get("epilogue_loads")]
    assert len(gpu) == 2 and all("load of residual_ptr" in c.description for c in gpu)
    assert "BLOCK_M" in gpu[1].params and "; with BLOCK_M=" in gpu[1].description  # also at the KB's top tile
    src, _ = blockio.rewrite(fused, kernel=kernel, epilogue_loads=True)
    assert "residual_desc.load([" in src
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


def test_an_untuned_small_tile_gets_its_retiled_descriptors_first(tmp_path):
    """Descriptors at the epilogue-graph problems' 32 x 32 tile ran 0.83x of the start on an H100 (2026-12-06) and
    took block_io's share of a time budget; at 128 x 256 they ran 4.3x. A tile a quarter of the KB's or smaller puts
    the re-tiled rewrites first."""
    from tests.test_fusion_graph import GRAPHS, _problem

    p = _problem(tmp_path, GRAPHS["clone-residual"][0], "wrapper")
    cands = block_io.TensorDescriptorTiles().propose(tactic_context(p, kind="cuda", target="h200", cores=132))
    first = cands[0].params
    assert first.get("BLOCK_M", 32) * first.get("BLOCK_N", 32) >= 4 * 32 * 32, [c.description for c in cands]
    assert any(set(c.params) == {"mode", "kernel"} for c in cands[1:])


def _gate3(shapes: dict[str, float], margin: float = 0.02):
    """A gate-3 verdict over ``shapes`` (variant -> speedup), decided by the verifier's own rule."""
    from stages.base import TrialOutcome
    from xeforge.timing import Decision, ShapeVerdict, Stats, decide_shapes
    from xeforge.verifier import GateResult, Verdict

    st = Stats.of([1.0, 1.0, 1.0])
    sv = [ShapeVerdict(v, 1.0, Decision(x, margin, x > 1 + margin, st, st, None, False)) for v, x in shapes.items()]
    sd = decide_shapes(sv, [])
    details = {"shapes": [s.as_dict() for s in sv], "objective": sd.objective, "blocked_by": sd.blocked_by,
               "improved": sd.improved}
    return lambda c: TrialOutcome("t", c, Verdict("h", [GateResult("3-performance", "pass" if sd.accepted else "fail",
                                                                   sd.summary(), details)], correct=True,
                                                 accepted=sd.accepted, timed=True, speedup=sd.objective))


def test_a_candidate_that_lost_only_at_a_class_of_shapes_comes_back_with_its_fast_path_off_there(verify):
    """gemm_tall_k's descriptors on the H200 (2026-12-06): 1.022x at M = 1024, 2.564x at M = N = 1000, 0.976x at
    M = 16, turned down for the decode shape alone. The follow-up keeps the original loop for M = 16's class only,
    asks to be timed at every shape, and is correct on the interpreter."""
    p = load_problem(KERNELS / "gemm_tall_k")
    ctx = tactic_context(p, kind="cuda", target="h200", cores=132)
    cands = TACTIC.propose(ctx)
    assert cands[0].time_all_shapes and not any(c.time_all_shapes for c in cands[1:])  # bench-gpu-2 is odd
    lost_at_decode = _gate3({"bench-gpu": 1.022, "bench-gpu-1": 0.976, "bench-gpu-2": 2.564})
    assert not lost_at_decode(cands[0]).verdict.accepted
    (back,) = TACTIC.follow_up(ctx, [lost_at_decode(c) for c in cands])
    assert back.time_all_shapes and back.params["off_where"] == ["M <= 64"], back.params
    (site,) = [s for s in parse_kernel(back.source).launches if s.kernel == "matmul_kernel"]
    flag = ast.parse(site.other_kwargs[blockio.FLAG], mode="eval").body
    assert isinstance(flag, ast.BoolOp) and ast.unparse(flag.values[-1]) == "not M <= 64"
    assert "M <= 64 (bench-gpu-1)" in back.description
    verdict = verify(p, back.source)
    assert verdict.correct, verdict.feedback()
    # nothing comes back where the primary lost (no class holds it), where it lost nowhere, or on a pass
    for shapes in ({"bench-gpu": 0.95, "bench-gpu-1": 1.2, "bench-gpu-2": 2.0},
                   {"bench-gpu": 1.01, "bench-gpu-1": 1.0, "bench-gpu-2": 1.0},
                   {"bench-gpu": 1.2, "bench-gpu-1": 1.1, "bench-gpu-2": 1.5}):
        assert TACTIC.follow_up(ctx, [_gate3(shapes)(c) for c in cands]) == [], shapes
