"""Epilogue subtiling (the shared-memory refit that keeps a 128x256 tile): the C tile stored in two halves.

The rewrite of a descriptor-stored GEMM passes the real verifier on the CPU interpreter, and an injected bug
(the low half stored twice) fails it, so the ci shapes run the halves; descriptors that are also loaded from,
or whose column block is an odd literal, are left alone; the rules engine offers the halved store before it
gives up pipeline stages.
"""

from __future__ import annotations

import re

from stages import block_io
from tests.conftest import ROOT, tactic_context
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite.tiling.subtile import subtile_stores

KERNELS = ROOT / "kernels"


def descriptor_source(p) -> str:
    ctx = tactic_context(p, cores=20)
    cands = block_io.TensorDescriptorTiles().propose(ctx)
    assert cands and ".store([" in cands[0].source
    return cands[0].source


def test_halved_store_is_correct_and_its_halves_run(verify):
    p = load_problem(KERNELS / "kb09_matmul_subtract_multiply_relu")
    src = descriptor_source(p)
    new, changed = subtile_stores(src)
    assert changed == ["matmul_bias_kernel: c_desc [BLOCK_M, BLOCK_N] -> [BLOCK_M, BLOCK_N // 2]"]
    assert "block_shape=[BLOCK_M, BLOCK_N // 2]" in new and new.count("c_desc.store(") == 2
    assert parse_kernel(new).launches[0].constexprs == parse_kernel(src).launches[0].constexprs
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()
    # the high half stored from the low half's registers: the ci shapes must catch it
    broken = re.sub(r"BLOCK_N // 2\], (\w+)_hi\)", r"BLOCK_N // 2], \1_lo)", new)
    assert broken != new
    assert not verify(p, broken).correct


KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def k(c_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    d = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, {cols}])
    x = tl.zeros((BM, BN), dtype=tl.float32)
    {extra}
    d.store([0, 0], x)
'''


def test_descriptors_it_cannot_halve_are_left_alone():
    assert subtile_stores(KERNEL.format(cols="BN", extra="x += 1.0")) is not None
    assert subtile_stores(KERNEL.format(cols="BN", extra="x += d.load([0, 0])")) is None  # also loaded from
    assert subtile_stores(KERNEL.format(cols="7", extra="x += 1.0")) is None  # an odd literal column block
    assert subtile_stores(KERNEL.format(cols="BN", extra="x += 1.0").replace("@triton.jit\n", "")) is None


def test_rules_engine_halves_the_store_before_it_drops_stages():
    from stages.base import Candidate
    from tests.conftest import run_rules_stage
    from xeforge.rewrite.tiling.configs import apply_config

    p = load_problem(KERNELS / "kb09_matmul_subtract_multiply_relu")
    ctx = tactic_context(p, kind="cuda", target="h200")
    tile = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_stages": 3}
    first = Candidate(apply_config(descriptor_source(p), "matmul_bias_kernel", tile), "fixed", "128x256",
                      kind="search", params=tile)
    # 278552 B at 3 stages: 64 KB of staging beside three 48 KB stages fits once the C store is halved
    rec, seen = run_rules_stage(ctx, [first], lambda src: "BLOCK_N // 2" in src)
    # the tile keeps its stages; the fewer-stages refit is not judged once the halved store is correct
    assert len(seen) == 2 and "two halves" in seen[1].description and "num_stages" not in seen[1].description
    launch = next(s for s in parse_kernel(seen[1].source).launches if s.kernel == "matmul_bias_kernel")
    assert launch.options.get("num_stages") == 3 and launch.constexprs["BLOCK_N"] == 256
    assert rec.best is not None and rec.best.candidate is seen[1]
    # where the halved store fails too, the fewer-stages refit follows
    rec, seen = run_rules_stage(ctx, [first], lambda src: "BLOCK_N // 2" not in src and "num_stages=2" in src)
    assert len(seen) == 3 and "num_stages 3 -> 2" in seen[2].description and rec.best.candidate is seen[2]


def test_a_tile_that_cannot_fit_is_halved_before_it_is_compiled():
    """On CUDA, with the device's per-block limit known, a 4-stage 128 x 256 x 64 bf16 tile with its C tile staged
    whole (262,144 B by the compiler's arithmetic against 232,448) goes to the verifier already halved: no failed
    compile first. A 3-stage tile (212,992 B) fits and is judged as proposed."""
    import dataclasses

    from stages.base import Candidate
    from tests.conftest import run_rules_stage
    from xeforge.rewrite.tiling.configs import apply_config, staged_smem

    p = load_problem(KERNELS / "kb09_matmul_subtract_multiply_relu")
    ctx = tactic_context(p, kind="cuda", target="h100")
    ctx.device = dataclasses.replace(ctx.device, shared_mem_bytes=232448)
    src = descriptor_source(p)
    four = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_stages": 4}
    first = Candidate(apply_config(src, "matmul_bias_kernel", four), "fixed", "128x256x64/4", kind="search", params=four)
    assert staged_smem(first.source) == ("matmul_bias_kernel", 262144)
    # once halved, the staging tile is [BM, BN // 2]: the halved source fits and is not halved again
    assert staged_smem(subtile_stores(first.source)[0]) == ("matmul_bias_kernel", 229376)
    rec, seen = run_rules_stage(ctx, [first], lambda s: "BLOCK_N // 2" in s)
    assert len(seen) == 1 and "two halves (by the estimate it needs 262144 B" in seen[0].description
    launch = next(s for s in parse_kernel(seen[0].source).launches if s.kernel == "matmul_bias_kernel")
    assert launch.options.get("num_stages") == 4 and launch.constexprs["BLOCK_N"] == 256
    three = Candidate(apply_config(src, "matmul_bias_kernel", {**four, "num_stages": 3}), "fixed", "128x256x64/3",
                      kind="search", params={**four, "num_stages": 3})
    _, seen = run_rules_stage(ctx, [three], lambda s: True)
    assert [c.source for c in seen] == [three.source]
    # without the device's limit (the interpreter, or a device that does not report it) nothing changes
    ctx.device = dataclasses.replace(ctx.device, shared_mem_bytes=None)
    _, seen = run_rules_stage(ctx, [first], lambda s: True)
    assert [c.source for c in seen] == [first.source]


def test_a_halved_store_is_made_whole_again_and_split_k_plans_on_it():
    """On the H100 (2026-12-07) gemm_tall_k's adopted descriptors stored C in two halves, and split-K refused the
    kernel ("stores c_desc_lo rather than acc"): its 32 tiles ran on 132 cores, 0.57x of torch.compile. The halves
    are now undone for the split's plan: whole_stores gives back the descriptor source it came from."""
    from stages.device_tuning_splitk import SplitK
    from xeforge.rewrite import NotApplicable
    from xeforge.rewrite.device_tuning import splitk
    from xeforge.rewrite.tiling.subtile import whole_stores

    p = load_problem(KERNELS / "gemm_tall_k")
    src = descriptor_source(p)
    halved, _ = subtile_stores(src)
    kernel = parse_kernel(src).launches[0].kernel
    assert whole_stores(src, kernel) is None  # nothing halved
    back, changed = whole_stores(halved, kernel)
    assert back == src, changed
    assert changed == [f"{kernel}: c_desc [BLOCK_M, BLOCK_N // 2] -> [BLOCK_M, BLOCK_N]"]
    try:
        splitk.find(halved, p)
    except NotApplicable as exc:
        assert "rather than acc" in str(exc)
    else:
        raise AssertionError("split-K's plan took the halved store")
    ctx = tactic_context(p, cores=132).with_source(halved)
    assert SplitK().check(ctx).applies
    (cand, *_) = SplitK().propose(ctx)
    assert "c_desc_lo" not in cand.source and "tl.split(" not in cand.source.split("def splitk_sum_kernel")[0]
