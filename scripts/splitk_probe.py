"""Decode-shape candidates (split-K, the GEMV form) against their starts: a quick probe, not gate 3's method.

Usage (repo root):
    python scripts/splitk_probe.py write DIR    # anywhere xeforge is set up: the start and candidate files
    python scripts/splitk_probe.py bench DIR [CASE ...]   # on the GPU (torch and Triton only): DIR/split.json and
                                                          # a line each; CASE: a part of a case's name

Cases: gemm_square (128 x 128 tiles) split 4 and 8 only where M <= 128; kb09 re-tiled to 32 x 256 (its bias in the
kernel: the epilogue split) split 4 and 8 where M <= 64, beside kb09 as written (32 x 32 tiles). Each figure is the
median of ``triton.testing.do_bench`` over the whole ``Model.forward`` (no L2 flush, host time included); the ratio
is against the case's first file. BENCHMARKS.md's issue-34 probe came from this.

GEMV cases (``gemv <problem>``): the problem as written, and its GEMV form (:mod:`xeforge.rewrite.device_tuning.gemv`)
launched where M <= 64 with each configuration ``gemv_configs`` gives, at M = 1, 2 and 4 (1, 8 and 16 before
2026-12-06's change to one row a program); ``cublas``
is ``torch.matmul`` of the same bf16 operands alone (the GEMM without the problem's epilogue).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

CASES = {
    "gemm_square": (["gsq_start", "gsq_split4", "gsq_split8"], [(16, 4096, 4096), (4096, 4096, 4096)]),
    "kb09 32x256": (["kb09w_start", "kb09w_split4", "kb09w_split8", "kb09_start"],
                    [(16, 8192, 8192), (1024, 8192, 8192)]),
}
#: GEMV-form cases: problem folder -> (file prefix, its kernel, shapes (M, K, N))
GEMV = {
    "gemm_skinny_m": ("skinny", "skinny_matmul_kernel", [(1, 8192, 8192), (2, 8192, 8192), (4, 8192, 8192)]),
    "gemm_square": ("gsq", "matmul_kernel", [(1, 4096, 4096), (2, 4096, 4096), (4, 4096, 4096)]),
    "kb09_matmul_subtract_multiply_relu": ("kb09", "matmul_bias_kernel",
                                           [(1, 8192, 8192), (2, 8192, 8192), (4, 8192, 8192)]),
}


def write(out: Path) -> None:
    from xeforge.problem import load_problem
    from xeforge.rewrite.device_tuning import splitk
    from xeforge.rewrite.tiling.configs import apply_config

    out.mkdir(parents=True, exist_ok=True)
    p = load_problem("kernels/gemm_square")
    plan = splitk.find(p.kernel_source, p)
    (out / "gsq_start.py").write_text(p.kernel_source)
    for s in (4, 8):
        (out / f"gsq_split{s}.py").write_text(splitk.apply(p.kernel_source, plan, s, when="M <= 128"))
    p = load_problem("kernels/kb09_matmul_subtract_multiply_relu")
    wide = apply_config(p.kernel_source, "matmul_bias_kernel", {"BLOCK_M": 32, "BLOCK_N": 256, "BLOCK_K": 32})
    plan = splitk.find(wide, p)
    (out / "kb09_start.py").write_text(p.kernel_source)
    (out / "kb09w_start.py").write_text(wide)
    for s in (4, 8):
        (out / f"kb09w_split{s}.py").write_text(splitk.apply(wide, plan, s, when="M <= 64"))
    write_gemv(out)
    print(f"wrote {len(list(out.glob('*.py')))} files to {out}", file=sys.stderr)


def write_gemv(out: Path) -> None:
    from xeforge.kernel_model import parse_kernel
    from xeforge.problem import load_problem
    from xeforge.rewrite.device_tuning import gemv
    from xeforge.rewrite.tiling.configs import OPTION_KEYS, current_config, tunable
    from xeforge.rewrite.tiling.dispatch import Branch, dispatch

    cases = {}
    for folder, (prefix, kernel, shapes) in GEMV.items():
        p = load_problem(f"kernels/{folder}")
        src = p.kernel_source
        model = parse_kernel(src)
        site = next(s for s in model.launches if s.kernel == kernel)
        _, plan = gemv.gemv_form(src, kernel)
        names = set(tunable(model, site)) | set(OPTION_KEYS)
        files = [f"{prefix}_start"]
        (out / f"{prefix}_start.py").write_text(src)
        for i, cfg in enumerate(gemv.gemv_configs(plan, current_config(model, site), names)):
            name = f"{prefix}_gemv{i}"
            (out / f"{name}.py").write_text(gemv.gemv_branch(dispatch(src, kernel, [Branch("M <= 64", cfg)]), src,
                                                             kernel, "M <= 64"))
            files.append(name)
            print(name, cfg, file=sys.stderr)
        cases[f"gemv {folder}"] = (files, shapes)
    (out / "gemv_cases.json").write_text(json.dumps(cases))


def bench(folder: Path) -> None:
    import torch
    import triton

    dev = torch.device("cuda")

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    def inputs(case: str, m: int, k: int, n: int):
        if case.endswith("gemm_skinny_m"):
            return (k, n), (torch.randn(m, k, device=dev, dtype=torch.bfloat16),)
        if case.endswith("gemm_square"):
            return None, (torch.randn(m, k, device=dev, dtype=torch.bfloat16),
                          torch.randn(k, n, device=dev, dtype=torch.bfloat16))
        return (k, n, 0.5, 2.0), (torch.randn(m, k, device=dev, dtype=torch.bfloat16),)

    rows = []
    cases = dict(CASES)
    if (folder / "gemv_cases.json").exists():
        cases.update({c: (f, [tuple(s) for s in sh]) for c, (f, sh) in json.loads((folder / "gemv_cases.json")
                                                                              .read_text()).items()})
    only = sys.argv[3:]  # case names to run (default: all)
    for case, (files, shapes) in cases.items():
        if only and not any(o in case for o in only):
            continue
        mods = {f: load(f) for f in files}
        for shape in shapes:
            init, args = inputs(case, *shape)
            row, ref = {"case": case, "shape": shape}, None
            for f, mod in mods.items():
                torch.manual_seed(0)
                model = mod.Model(*init).to(dev, torch.bfloat16) if init else mod.Model()
                with torch.no_grad():
                    y = model(*args).float()
                    ref = y if ref is None else ref
                    ms = triton.testing.do_bench(lambda: model(*args), warmup=25, rep=200, return_mode="median")
                row[f] = {"ms": round(ms, 4), "maxdiff": (y - ref).abs().max().item()}
            a, b = (torch.randn(shape[0], shape[1], device=dev, dtype=torch.bfloat16),
                    torch.randn(shape[1], shape[2], device=dev, dtype=torch.bfloat16))
            row["cublas"] = {"ms": round(triton.testing.do_bench(lambda: torch.matmul(a, b), warmup=25, rep=200,
                                                                 return_mode="median"), 4)}
            base = row[files[0]]["ms"]
            print(case, shape, {f: (row[f]["ms"], round(base / row[f]["ms"], 2)) for f in [*files, "cublas"]},
                  flush=True)
            rows.append(row)
    meta = {"torch": torch.__version__, "triton": triton.__version__, "device": torch.cuda.get_device_name()}
    (folder / "split.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(meta)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("write", "bench"):
        sys.exit(__doc__)
    (write if sys.argv[1] == "write" else bench)(Path(sys.argv[2]))
