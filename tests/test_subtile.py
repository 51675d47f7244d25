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
from xeforge.rewrite.subtile import subtile_stores

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
    from stages.base import Applicability, Candidate, Stage, Tactic
    from xeforge.engines import RulesEngine, TrialOutcome
    from xeforge.verifier import GateResult, Verdict

    p = load_problem(KERNELS / "kb09_matmul_subtract_multiply_relu")
    ctx = tactic_context(p, kind="cuda", target="h200")
    src = descriptor_source(p)
    # the H200 figure for a 128x256x64 fp32-staged tile at 3 stages: 147456 B of stages + 131072 B of C
    over = ("variant ci@bfloat16: raised: OutOfResources: out of resource: shared memory, Required: 278552, "
            "Hardware limit: 232448. Reducing block sizes or `num_stages` may help.")

    class Propose(Tactic):
        name = "fixed"

        def check(self, ctx):
            return Applicability(True, "test")

        def propose(self, ctx):
            from xeforge.rewrite.tiling_configs import apply_config
            tile = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_stages": 3}
            return [Candidate(apply_config(src, "matmul_bias_kernel", tile), self.name, "128x256", kind="search",
                              params=tile)]

    seen = []

    def evaluate(c):
        seen.append(c)
        if "BLOCK_N // 2" not in c.source:
            v = Verdict("h", [GateResult("0-isolation", "fail", over, {"kind": "exception", "detail": over})])
        else:
            v = Verdict("h", [GateResult("0-isolation", "pass", "ok"), GateResult("2-correctness", "pass", "ok")],
                        correct=True, accepted=True)
        return TrialOutcome(f"{len(seen):04d}", c, v)

    stage = Stage("device_tuning", 7, "test", (), tactics=[Propose()])
    rec, = RulesEngine().run_stage(stage, ctx, evaluate, lambda outs: next((o for o in outs if o.verdict.correct), None))
    # 64 KB of staging beside three 48 KB stages fits: the tile keeps its stages; the fewer-stages refit follows
    assert len(seen) == 3 and "two halves" in seen[1].description and "num_stages" not in seen[1].description
    launch = next(s for s in parse_kernel(seen[1].source).launches if s.kernel == "matmul_bias_kernel")
    assert launch.options.get("num_stages") == 3 and launch.constexprs["BLOCK_N"] == 256
    assert "num_stages 3 -> 2" in seen[2].description
    assert rec.best is not None and rec.best.candidate is seen[1]
