"""Probe (not a benchmark of xeforge): how close Triton 3.6 GEMM forms get to cuBLAS on this card at 4096^3 and
3000 x 4096 x 3000 bf16. triton.testing.do_bench (L2 cleared between calls), median of its runs."""
import json
import os
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def plain(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, scm,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr):
    pid = tl.program_id(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    per = G * npn
    gid = pid // per
    first = gid * G
    gs = min(npm - first, G)
    pm = first + ((pid % per) % gs)
    pn = (pid % per) // gs
    ad = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM, BK])
    bd = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN])
    cd = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM, BN])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        acc = tl.dot(ad.load([pm * BM, k * BK]), bd.load([k * BK, pn * BN]), acc)
    cd.store([pm * BM, pn * BN], acc.to(tl.bfloat16))


@triton.jit
def persist(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, scm,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr, NSM: tl.constexpr,
            WS: tl.constexpr, FLAT: tl.constexpr):
    start = tl.program_id(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    kt = tl.cdiv(K, BK)
    tiles = npm * npn
    per = G * npn
    ad = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sam, 1], block_shape=[BM, BK])
    bd = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN])
    cd = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[scm, 1], block_shape=[BM, BN])
    for t in tl.range(start, tiles, NSM, flatten=FLAT, warp_specialize=WS):
        gid = t // per
        first = gid * G
        gs = min(npm - first, G)
        pm = first + ((t % per) % gs)
        pn = (t % per) // gs
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(kt):
            acc = tl.dot(ad.load([pm * BM, k * BK]), bd.load([k * BK, pn * BN]), acc)
        cd.store([pm * BM, pn * BN], acc.to(tl.bfloat16))


def main():
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    shapes = [(4096, 4096, 4096), (3000, 4096, 3000)]
    cfgs = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
            (128, 128, 64, 8, 4), (64, 256, 64, 4, 4), (128, 128, 128, 8, 3), (128, 192, 64, 8, 3)]
    for (M, K, N) in shapes:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        ref = a @ b
        t = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
        rows.append({"shape": [M, K, N], "kind": "cublas", "ms": t})
        print(M, K, N, "cublas", round(t, 4), file=sys.stderr)
        for bm, bn, bk, w, s in cfgs:
            for kind in ("plain", "persist", "persist-flat", "persist-ws"):
                c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                try:
                    if kind == "plain":
                        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
                        f = lambda: plain[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0),  # noqa
                                                BM=bm, BN=bn, BK=bk, G=8, num_warps=w, num_stages=s)
                    else:
                        grid = (min(nsm, triton.cdiv(M, bm) * triton.cdiv(N, bn)),)
                        ws, flat = kind == "persist-ws", kind == "persist-flat"
                        f = lambda: persist[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0),  # noqa
                                                  BM=bm, BN=bn, BK=bk, G=8, NSM=nsm, WS=ws, FLAT=flat,
                                                  num_warps=w, num_stages=s)
                    f()
                    torch.cuda.synchronize()
                    err = (c.float() - ref.float()).abs().max().item()
                    tm = triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
                    rows.append({"shape": [M, K, N], "kind": kind, "cfg": [bm, bn, bk, w, s], "ms": tm,
                                 "err": err, "vs_cublas": t / tm})
                    print(M, K, N, kind, bm, bn, bk, w, s, round(tm, 4), round(t / tm, 3), err, file=sys.stderr)
                except Exception as exc:  # noqa: BLE001
                    rows.append({"shape": [M, K, N], "kind": kind, "cfg": [bm, bn, bk, w, s],
                                 "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                    print(M, K, N, kind, bm, bn, bk, w, s, "ERROR", type(exc).__name__, str(exc)[:120], file=sys.stderr)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "gemm_probe.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
