"""Probe: how fast one Triton GEMM runs on this GPU by weight layout, persistence and loop options.

Not part of the port loop. Question it answers: at the corpus's shapes (M x 4096 x 4096, bf16), how much of the
gap to cuBLAS comes from the weight's layout (``nn.Linear``'s ``[N, K]``, loaded as a transposed view, against a
``[K, N]`` operand), from the grid (one program per tile against a persistent loop), and from the loop options
(``flatten``, ``warp_specialize``). One kernel, written here, with every option a constexpr; timing is
``triton.testing.do_bench`` (L2 cleared between calls), median ms; one JSON line per case on stdout.

Usage (GPU machine, repo root): python3 scripts/gemm_layout_probe.py [M ...]
"""
from __future__ import annotations

import itertools
import json
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _gemm(a_ptr, b_ptr, c_ptr, M, N, K,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
          B_NK: tl.constexpr, PERSISTENT: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr,
          RELU: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    if B_NK:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    in_group = GROUP_M * num_pid_n
    if PERSISTENT:
        start = tl.program_id(0)
        step = tl.num_programs(0)
    else:
        start = tl.program_id(0)
        step = num_tiles
    for tile in tl.range(start, num_tiles, step, flatten=FLATTEN, warp_specialize=WS):
        group = tile // in_group
        first_m = group * GROUP_M
        size_m = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + ((tile % in_group) % size_m)
        pid_n = (tile % in_group) // size_m
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            a = a_desc.load([pid_m * BM, k * BK])
            if B_NK:
                b = b_desc.load([pid_n * BN, k * BK]).T
            else:
                b = b_desc.load([k * BK, pid_n * BN])
            acc = tl.dot(a, b, acc)
        if RELU:
            acc = tl.maximum(acc, 0.0)
        c_desc.store([pid_m * BM, pid_n * BN], acc.to(c_ptr.dtype.element_ty))


def main() -> int:
    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    shapes = [int(m) for m in sys.argv[1:]] or [1024, 2048]
    configs = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4)]
    for m in shapes:
        n = k = 4096
        flop = 2 * m * n * k
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)   # nn.Linear layout [N, K]
        wt = w.t().contiguous()                                    # [K, N]
        ref = a @ w.t()
        for name, fn in (("cublas a@w.t()", lambda: a @ w.t()), ("cublas a@wt", lambda: a @ wt)):
            ms = do_bench(fn)
            print(json.dumps({"M": m, "case": name, "ms": round(ms, 5), "tflops": round(flop / ms / 1e9, 1)}), flush=True)
        for (bm, bn, bk, nw, ns), b_nk, pers, flat, ws in itertools.product(
                configs, (True, False), (True, False), (False, True), (False, True)):
            if (flat or ws) and not pers or (flat and ws):
                continue
            case = {"M": m, "BM": bm, "BN": bn, "BK": bk, "warps": nw, "stages": ns, "w_layout": "NK" if b_nk else "KN",
                    "persistent": pers, "flatten": flat, "warp_specialize": ws}
            c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
            grid = (min(sms, tiles) if pers else tiles,)
            b = w if b_nk else wt

            def run():
                _gemm[grid](a, b, c, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=8, B_NK=b_nk, PERSISTENT=pers,
                            FLATTEN=flat, WS=ws, RELU=False, num_warps=nw, num_stages=ns)
            try:
                run()
                torch.cuda.synchronize()
                err = (c.float() - ref.float()).abs().max().item()
                ms = do_bench(run)
                case.update(ms=round(ms, 5), tflops=round(flop / ms / 1e9, 1), max_err=round(err, 3))
            except Exception as exc:  # noqa: BLE001 - a probe reports every failure as data
                case.update(error=f"{type(exc).__name__}: {str(exc)[:160]}")
            print(json.dumps(case), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
