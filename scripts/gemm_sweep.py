"""Launch-configuration sweep of one GEMM kernel file against cuBLAS: where the knowledge base's seeds come from.

Not part of the port loop (the port's search is budgeted and verified); this is the measurement behind the
`hopper-gemm` seeds in knowledge_base/spaces/nvidia.yaml. It loads a problem's `bench-gpu` variant, a kernel
file whose first `@triton.autotune` kernel is the GEMM, and times that kernel under each configuration (and,
with --variants, with `warp_specialize=True` / `flatten=True` on its persistent tile loop) against `torch.mm`
(cuBLAS) on the same operands and the problem's eager reference. Timing: triton.testing.do_bench (L2 cleared
between calls), median of its repetitions. Output: one JSON line per configuration on stdout.

Usage (GPU machine, repo root):
    python3 scripts/gemm_sweep.py kernels/kb09_matmul_subtract_multiply_relu runs/.../final/kernel.py --variants
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIGS = [  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
    (128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (128, 128, 64, 8, 3),
    (128, 128, 128, 8, 3), (256, 128, 64, 8, 3), (64, 256, 64, 4, 4), (128, 256, 32, 8, 4), (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4), (64, 256, 64, 8, 3),
]


def _load(text: str, tag: str):
    tmp = Path(tempfile.mkdtemp()) / f"sweep_{tag}.py"
    tmp.write_text(text)
    spec = importlib.util.spec_from_file_location(tmp.stem, tmp)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[tmp.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    import torch
    import triton
    from triton.testing import do_bench

    from xeforge.inputs import generate_inputs
    from xeforge.problem import load_problem, plan_inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("problem")
    ap.add_argument("kernel")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--variant", default="bench-gpu")
    a = ap.parse_args()
    prob = load_problem(a.problem)
    var = prob.variant(a.variant)
    dtype = getattr(torch, var.dtype)
    inputs = [t.cuda() for t in generate_inputs(plan_inputs(prob, var), 0, device="cpu")]
    src = Path(a.kernel).read_text()
    loop = "tl.range(tl.program_id(0), num_tiles, tl.num_programs(0))"
    variants = {"as-is": src}
    if a.variants and loop in src:
        variants["warp_specialize"] = src.replace(loop, loop[:-1] + ", warp_specialize=True)")
        variants["flatten"] = src.replace(loop, loop[:-1] + ", flatten=True)")

    def model_of(mod):
        torch.manual_seed(0)
        return mod.Model(*prob.init_args(var)).to(dtype).cuda().eval()

    ref = _load((prob.root / "reference.py").read_text(), "ref")
    ref_model = model_of(ref)
    with torch.no_grad():
        want = ref_model(*inputs).float()
        t_eager = do_bench(lambda: ref_model(*inputs), warmup=50, rep=300)
        w = next(p for p in ref_model.parameters() if p.dim() == 2)
        x = inputs[0]
        t_cublas = do_bench(lambda: torch.mm(x, w.t()), warmup=50, rep=300)
        comp = torch.compile(ref_model)
        comp(*inputs)
        t_comp = do_bench(lambda: comp(*inputs), warmup=50, rep=300)
    flop = var.flop or 0.0
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                      "problem": prob.name, "dims": var.dims, "cublas_mm_ms": t_cublas, "eager_ms": t_eager,
                      "compile_ms": t_comp, "cublas_tflops": 2 * x.shape[0] * w.shape[0] * x.shape[1] / t_cublas / 1e9}),
          flush=True)
    for (vname, text), cfg in itertools.product(variants.items(), CONFIGS):
        bm, bn, bk, nw, ns = cfg
        row = {"variant": vname, "config": cfg}
        try:
            mod = _load(text, f"{vname}_{bm}_{bn}_{bk}_{nw}_{ns}")
            model = model_of(mod)
            tuner = next(v for v in vars(mod).values() if isinstance(v, triton.runtime.Autotuner))
            kw = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
            kw.update({k: v for k, v in tuner.configs[0].kwargs.items() if k not in kw})
            tuner.configs = [triton.Config(kw, num_warps=nw, num_stages=ns)]
            tuner.cache = {}
            with torch.no_grad():
                got = model(*inputs).float()
                err = (got - want).abs().max().item()
                t = do_bench(lambda: model(*inputs), warmup=25, rep=200)
            row.update(ms=t, tflops=flop / t / 1e9, vs_cublas_mm=t_cublas / t, vs_compile=t_comp / t, max_err=err)
        except Exception as exc:  # a config that does not compile is a data point, not a stop
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
