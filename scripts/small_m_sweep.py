"""Launch-configuration sweep of a GEMM + bias + epilogue kernel at decode-sized M: where the seeds of the knowledge
base's spaces for few rows (``hopper-gemm-few-rows``, ``hopper-gemm-rows-64``) come from.

Not part of the port loop (the port's search is budgeted and verified); this is the measurement behind those seeds.
It times one kernel form, that of the epilogue-graph problems (x [M, K] times a weight stored [N, K] as F.linear
keeps it, bias and ``y * 0.5 + y`` in the epilogue), in bf16, in three layouts:

- ``tile``: a BLOCK_M x BLOCK_N output tile per program;
- ``swap``: the tile computed transposed (``acc[BLOCK_N, BLOCK_M] = W_tile @ x_tile^T``), N on the matrix unit's
  deep side;
- either with ``split`` > 1: split-K, each program summing K / split of the loop into an fp32 workspace, a second
  kernel summing the partials in order and running bias and epilogue.

against ``torch.compile`` of the same Model over ``F.linear`` (default mode) and ``F.linear`` alone (cuBLAS).
Timing: ``triton.testing.do_bench`` (L2 cleared before each call), median. Output: one JSON line per
(shape, configuration) on stdout, the fastest per shape on stderr.

Usage (GPU machine): python3 scripts/small_m_sweep.py [--m 16 64] [--nk 4096x4096 ...] > sweep.jsonl
(a tile of max(16, M) rows; 64-row tiles with a long K step and five stages do not fit in shared memory and are
skipped; configurations that fail to compile are recorded with their error)
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _mm(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, sxm, sxk, swn, swk,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
        SWAP: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    pid_k = tl.program_id(2)
    rk = tl.arange(0, BLOCK_K)
    steps = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(steps, SPLIT)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(pid_k * per, tl.minimum(steps, (pid_k + 1) * per)):
        k = s * BLOCK_K
        if SWAP:
            w = tl.load(w_ptr + rn[:, None] * swn + (k + rk)[None, :] * swk,
                        mask=(rn[:, None] < N) & ((k + rk)[None, :] < K), other=0.0)
            xt = tl.load(x_ptr + (k + rk)[:, None] * sxk + rm[None, :] * sxm,
                         mask=((k + rk)[:, None] < K) & (rm[None, :] < M), other=0.0)
            acc += tl.dot(w, xt)
        else:
            a = tl.load(x_ptr + rm[:, None] * sxm + (k + rk)[None, :] * sxk,
                        mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
            b = tl.load(w_ptr + (k + rk)[:, None] * swk + rn[None, :] * swn,
                        mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
    if SWAP:
        offs = rm[None, :] * N + rn[:, None]
        mask = (rm[None, :] < M) & (rn[:, None] < N)
        bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)[:, None]
    else:
        offs = rm[:, None] * N + rn[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if SPLIT == 1:
        acc = acc + bias
        acc = acc * 0.5 + acc
        tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_k * M * N + offs, acc, mask=mask)


@triton.jit
def _finish(ws_ptr, b_ptr, y_ptr, M, N, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    acc = acc + tl.load(b_ptr + offs % N, mask=mask, other=0.0)
    acc = acc * 0.5 + acc
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def run(x, w, b, y, ws, cfg):
    bm, bn, bk, warps, stages, split, swap = cfg
    M, K = x.shape
    N = w.shape[0]
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn), split)
    _mm[grid](x, w, b, y, ws, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
              BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, SWAP=swap, num_warps=warps, num_stages=stages)
    if split > 1:
        _finish[(triton.cdiv(M * N, 1024),)](ws, b, y, M, N, SPLIT=split, BLOCK=1024, num_warps=4)
    return y


def configs(m: int):
    bm = max(16, triton.next_power_of_2(m))
    for bn, bk, warps, stages, split, swap in itertools.product((32, 64, 128), (64, 128, 256), (4,), (3, 5),
                                                                 (1, 2, 4), (False, True)):
        if swap and bn < 64:
            continue
        if stages * (bm + bn) * bk * 2 > 220 * 1024:
            continue
        yield (bm, bn, bk, warps, stages, split, swap)
    for bn, bk, stages in itertools.product((32, 64), (128, 256), (3, 4)):  # 2 warps on the smallest tiles
        yield (bm, bn, bk, 2, stages, 1, False)


def main() -> int:
    from triton.testing import do_bench

    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--nk", nargs="+", default=["4096x4096"])
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    print(json.dumps(meta), flush=True)

    class Model(torch.nn.Module):
        def __init__(self, w, b):
            super().__init__()
            self.w, self.b = w, b

        def forward(self, x):
            y = torch.nn.functional.linear(x, self.w, self.b)
            original = y.clone()
            y = y * 0.5
            return y + original

    for nk in a.nk:
        n, k = (int(v) for v in nk.split("x"))
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
        b = torch.randn(n, device=dev, dtype=torch.bfloat16)
        model = Model(w, b)
        compiled = torch.compile(model)
        for m in a.m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            ws = torch.empty(4, m, n, device=dev, dtype=torch.float32)
            ref = model(x).float()
            base = {"M": m, "N": n, "K": k}
            compile_ms = do_bench(lambda: compiled(x), warmup=25, rep=100)
            cublas_ms = do_bench(lambda: torch.nn.functional.linear(x, w, b), warmup=25, rep=100)
            print(json.dumps({**base, "compile_ms": compile_ms, "cublas_ms": cublas_ms}), flush=True)
            best = None
            for cfg in configs(m):
                row = {**base, "config": cfg}
                try:
                    out = run(x, w, b, y, ws, cfg).float()
                    err = (out - ref).abs().max().item()
                    if err > 0.05 * ref.abs().max().item() + 0.05:
                        row["error"] = f"wrong: max err {err}"
                    else:
                        ms = do_bench(lambda: run(x, w, b, y, ws, cfg), warmup=10, rep=40)
                        row.update(ms=ms, vs_compile=compile_ms / ms, vs_cublas=cublas_ms / ms)
                        if best is None or ms < best["ms"]:
                            best = row
                except Exception as exc:  # out of resources and the like: recorded, the sweep goes on
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                print(json.dumps(row), flush=True)
            print(f"M={m} N={n} K={k}: compile {compile_ms:.4f} cublas {cublas_ms:.4f} best {best}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
