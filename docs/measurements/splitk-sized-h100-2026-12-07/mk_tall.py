"""gemm_tall_k as the tool's split-k (sized per call) then launch-params trials would write it: the split-k tactic's
first candidate on the start, then the configuration the H200 launch search chose on 2026-12-06 (128x256x64)."""
import sys
from stages.device_tuning_splitk import SplitK
from tests.conftest import tactic_context
from xeforge.problem import load_problem
from xeforge.rewrite.tiling.configs import apply_config
from xeforge.rewrite.device_tuning.splitk import follow
p = load_problem("kernels/gemm_tall_k")
ctx = tactic_context(p, p.kernel_source, kind="cuda", cores=132)
cand = SplitK().propose(ctx)[0]
print(cand.description, file=sys.stderr)
src = follow(apply_config(cand.source, "matmul_kernel_splitk", {"BLOCK_N": 256, "BLOCK_K": 64}))
open(sys.argv[1], "w").write(src)
