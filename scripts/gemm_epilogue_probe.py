"""Probe: what a fused epilogue costs a persistent Triton GEMM on this GPU, and what hides it.

Not part of the port loop. Question it answers: the corpus's GEMM problems at 2048 x 4096 x 4096 bf16 run their
bare GEMM in a tile loop at ~0.101 ms on the H200 but their fused finals at 0.123 (bias + exact GELU + a residual
read) and 0.129 (bias + a row logsumexp's per-tile partials). Which part of the epilogue costs it (the erf, the
residual read, the store), and which schedule hides it: warp specialization (``tl.range(warp_specialize=True)``),
a flattened loop, the residual read before the K loop, the epilogue in two column halves, two resident programs
per core (smaller tiles: one program's epilogue under the other's main loop), C stored through pointers with a
deeper pipeline. One kernel, written here, every option a constexpr; ``triton.testing.do_bench`` (L2 cleared),
median ms; one JSON line per case on stdout, with the max error against torch.

Usage (GPU machine, repo root, PYTHONPATH=.): python3 scripts/gemm_epilogue_probe.py [M] [unfused | erf]
``erf``: the GELU's erf three ways (libdevice, Abramowitz & Stegun 7.1.26, none), under do_bench and gate 3's timer.
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

BARE, GELU, GELU_RES, GELU_RES_DESC, LSE = 0, 1, 2, 3, 4
EPI_NAMES = {BARE: "bias", GELU: "bias+gelu", GELU_RES: "bias+gelu+residual(ptr)",
             GELU_RES_DESC: "bias+gelu+residual(desc)", LSE: "bias+logsumexp partials"}


@triton.jit
def _phi(x):
    """The normal CDF through Abramowitz & Stegun 7.1.26 (|erf error| <= 1.5e-7): one reciprocal, one exp2, five FMAs."""
    z = tl.abs(x) * 0.7071067811865476
    t = tl.fdiv(1.0, 1.0 + 0.3275911 * z, ieee_rounding=False)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    half_erfc = 0.5 * poly * tl.exp2(z * z * -1.4426950408889634)
    return tl.where(x >= 0, 1.0 - half_erfc, half_erfc)


@triton.jit
def _epilogue(acc, bias_ptr, r_ptr, r_desc, part_ptr, offs_m, offs_n, row0, col0, slot, M, N, num_slots,
              EPI: tl.constexpr, PREFETCHED, USE_PREFETCH: tl.constexpr, ERF: tl.constexpr = 0):
    bias = tl.load(bias_ptr + offs_n).to(tl.float32)
    acc = acc + bias[None, :]
    if EPI == 1 or EPI == 2 or EPI == 3:
        if ERF == 0:
            acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
        elif ERF == 1:
            acc = acc * _phi(acc)
    if EPI == 2:
        if USE_PREFETCH:
            res = PREFETCHED.to(tl.float32)
        else:
            res = tl.load(r_ptr + offs_m[:, None] * N + offs_n[None, :]).to(tl.float32)
        acc = acc + res
    if EPI == 3:
        acc = acc + r_desc.load([row0, col0]).to(tl.float32)
    if EPI == 4:
        row_max = tl.max(acc, 1)
        row_sum = tl.sum(tl.exp(acc - row_max[:, None]), 1)
        tl.store(part_ptr + offs_m * num_slots * 2 + slot * 2, row_max)
        tl.store(part_ptr + offs_m * num_slots * 2 + slot * 2 + 1, row_sum)
    return acc


@triton.jit
def _gemm(a_ptr, b_ptr, bias_ptr, r_ptr, c_ptr, part_ptr, M, N, K,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
          EPI: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr, PREFETCH: tl.constexpr,
          SUBTILE: tl.constexpr, PTR_STORE: tl.constexpr, ERF: tl.constexpr = 0):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    if SUBTILE:
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN // 2])
        r_desc = tl.make_tensor_descriptor(r_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN // 2])
    else:
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        r_desc = tl.make_tensor_descriptor(r_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    in_group = GROUP_M * num_pid_n
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN, warp_specialize=WS):
        group = tile // in_group
        first_m = group * GROUP_M
        size_m = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + ((tile % in_group) % size_m)
        pid_n = (tile % in_group) // size_m
        offs_m = pid_m * BM + tl.arange(0, BM)
        if PREFETCH:
            pre = tl.load(r_ptr + offs_m[:, None] * N + (pid_n * BN + tl.arange(0, BN))[None, :])
        else:
            pre = 0.0
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            a = a_desc.load([pid_m * BM, k * BK])
            b = b_desc.load([pid_n * BN, k * BK]).T
            acc = tl.dot(a, b, acc)
        if SUBTILE:
            acc0, acc1 = acc.reshape(BM, 2, BN // 2).permute(0, 2, 1).split()
            offs_n0 = pid_n * BN + tl.arange(0, BN // 2)
            out0 = _epilogue(acc0, bias_ptr, r_ptr, r_desc, part_ptr, offs_m, offs_n0, pid_m * BM, pid_n * BN, 2 * pid_n,
                             M, N, 2 * num_pid_n, EPI, pre, False, ERF)
            c_desc.store([pid_m * BM, pid_n * BN], out0.to(c_ptr.dtype.element_ty))
            offs_n1 = pid_n * BN + BN // 2 + tl.arange(0, BN // 2)
            out1 = _epilogue(acc1, bias_ptr, r_ptr, r_desc, part_ptr, offs_m, offs_n1, pid_m * BM, pid_n * BN + BN // 2, 2 * pid_n + 1,
                             M, N, 2 * num_pid_n, EPI, pre, False, ERF)
            c_desc.store([pid_m * BM, pid_n * BN + BN // 2], out1.to(c_ptr.dtype.element_ty))
        else:
            offs_n = pid_n * BN + tl.arange(0, BN)
            out = _epilogue(acc, bias_ptr, r_ptr, r_desc, part_ptr, offs_m, offs_n, pid_m * BM, pid_n * BN, pid_n,
                            M, N, num_pid_n, EPI, pre, PREFETCH, ERF)
            if EPI != 4:
                if PTR_STORE:
                    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], out.to(c_ptr.dtype.element_ty))
                else:
                    c_desc.store([pid_m * BM, pid_n * BN], out.to(c_ptr.dtype.element_ty))


@triton.jit
def _gelu_residual(y_ptr, r_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    """The epilogue as a kernel of its own after the GEMM (the unfused alternative): out = gelu(y) + r."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    res = tl.load(r_ptr + offs, mask=mask).to(tl.float32)
    out = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476)) + res
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def gate3(fn, reps=30):
    """Median ms of ``fn`` under a timer like the bench's gate 3: the L2-flush write repeated (as many times as
    :func:`xeforge.timing.delay_flushes` says) so the device is still busy when the host has issued the call."""
    import statistics
    import time

    from xeforge.timing import delay_flushes

    dev = torch.device("cuda")
    flush = torch.empty(2 * 60 * 2**20, dtype=torch.int8, device=dev)
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    flush.zero_()
    e.record()
    torch.cuda.synchronize()
    repeats = delay_flushes(host * 1e3, s.elapsed_time(e))
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        for _ in range(repeats):
            flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out), host * 1e3


def main() -> int:
    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    m = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    unfused_only = "unfused" in sys.argv[2:]
    erf_only = "erf" in sys.argv[2:]
    n = k = 4096
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / 64
    bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
    r = torch.randn(m, n, device=dev, dtype=torch.bfloat16)

    def torch_ref(epi):
        y = F.linear(a, w, bias)
        if epi == BARE:
            return y
        if epi == GELU:
            return F.gelu(y)
        if epi in (GELU_RES, GELU_RES_DESC):
            return F.gelu(y) + r
        return torch.logsumexp(y.float(), dim=1, keepdim=True)

    for epi in (BARE, GELU_RES, LSE):
        for mode in ("eager", "compile"):
            fn = (lambda e=epi: torch_ref(e)) if mode == "eager" else torch.compile(lambda e=epi: torch_ref(e))
            fn()
            print(json.dumps({"M": m, "case": f"torch {mode}", "epilogue": EPI_NAMES[epi],
                              "ms": round(do_bench(fn), 5)}), flush=True)

    base = dict(BM=128, BN=256, BK=64, warps=8, stages=3, EPI=BARE, FLATTEN=False, WS=False, PREFETCH=False,
                SUBTILE=False, PTR_STORE=False, ctas_per_core=1)
    cases = []
    for epi in (BARE, GELU, GELU_RES, GELU_RES_DESC, LSE):
        cases.append(dict(base, EPI=epi))
        cases.append(dict(base, EPI=epi, WS=True))
    two = dict(base, BM=128, BN=128, ctas_per_core=2)      # two resident programs per core: 96 KB of pipeline each
    for epi in (GELU_RES, LSE):
        cases.append(dict(base, EPI=epi, SUBTILE=True))
        cases.append(dict(base, EPI=epi, SUBTILE=True, WS=True))
        cases.append(dict(base, EPI=epi, SUBTILE=True, FLATTEN=True))
        cases.append(dict(two, EPI=epi, warps=4, stages=3, PTR_STORE=True))
        cases.append(dict(two, EPI=epi, warps=4, stages=2))
        cases.append(dict(two, EPI=epi, warps=8, stages=3, PTR_STORE=True))
        cases.append(dict(two, EPI=epi, warps=4, stages=3, PTR_STORE=True, WS=True))
        cases.append(dict(base, EPI=epi, BM=128, BN=128, warps=4, stages=4))
        cases.append(dict(base, EPI=epi, BM=256, BN=128))
        cases.append(dict(base, EPI=epi, PTR_STORE=True, stages=4))
    cases.append(dict(base, EPI=BARE, PTR_STORE=True, stages=4))
    cases.append(dict(base, EPI=GELU_RES, PREFETCH=True))
    cases.append(dict(base, EPI=GELU_RES, PREFETCH=True, PTR_STORE=True, stages=4))
    cases.append(dict(base, EPI=GELU_RES_DESC, SUBTILE=True))
    cases.append(dict(base, EPI=GELU_RES_DESC, SUBTILE=True, WS=True))
    if unfused_only:
        cases = [dict(base, EPI=BARE), dict(base, EPI=GELU_RES, SUBTILE=True)]
    if erf_only:  # the GELU's erf: libdevice's (0), A&S 7.1.26 (1), none (2: the epilogue's floor)
        cases = [dict(base, EPI=BARE), dict(base, EPI=BARE, stages=4, PTR_STORE=True)]
        for sub in (False, True):
            cases += [dict(base, EPI=GELU_RES, SUBTILE=sub, ERF=e) for e in (0, 1, 2)]
        cases += [dict(base, EPI=GELU_RES, SUBTILE=True, stages=4, ERF=e) for e in (0, 1)]
    for case in cases:
        epi = case["EPI"]
        bm, bn = case["BM"], case["BN"]
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        part = torch.empty(m, triton.cdiv(n, bn) * (2 if case["SUBTILE"] else 1), 2, device=dev, dtype=torch.float32)
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        grid = (min(sms * case["ctas_per_core"], tiles),)

        def run(case=case, c=c, part=part, grid=grid):
            return _gemm[grid](a, w, bias, r, c, part, m, n, k, BM=case["BM"], BN=case["BN"], BK=case["BK"], GROUP_M=8,
                        EPI=case["EPI"], FLATTEN=case["FLATTEN"], WS=case["WS"], PREFETCH=case["PREFETCH"],
                        SUBTILE=case["SUBTILE"], PTR_STORE=case["PTR_STORE"], ERF=case.get("ERF", 0),
                        num_warps=case["warps"], num_stages=case["stages"])
        row = {"M": m, "epilogue": EPI_NAMES[epi], **{k_: v for k_, v in case.items() if k_ != "EPI"}}
        try:
            kernel = run()
            torch.cuda.synchronize()
            ref = torch_ref(epi).float()
            if epi in (GELU_RES, GELU_RES_DESC) and case.get("ERF") == 2:
                ref = F.linear(a, w, bias).float() + r.float()
            if epi == LSE:
                mx = part[..., 0]
                top = mx.max(dim=1, keepdim=True).values
                got = top + torch.log((part[..., 1] * torch.exp(mx - top)).sum(dim=1, keepdim=True))
            else:
                got = c.float()
            row["max_err"] = round((got - ref).abs().max().item(), 4)
            row["ms"] = round(do_bench(run), 5)
            if erf_only:
                row["gate3_ms"] = round(gate3(run)[0], 5)
            meta = getattr(kernel, "metadata", None)
            row["shared"] = getattr(meta, "shared", None)
            row["regs"], row["spills"] = getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", None)
        except Exception as exc:  # noqa: BLE001 - a probe reports every failure as data
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        print(json.dumps(row), flush=True)
    if unfused_only:
        _unfused(m, n, k, a, w, bias, r, sms, torch_ref)
    return 0


def _unfused(m, n, k, a, w, bias, r, sms, torch_ref) -> None:
    """The GEMM (bias only, tile loop, 128 x 256 x 64) and then gelu + residual as a second Triton kernel."""
    c = torch.empty(m, n, device=a.device, dtype=torch.bfloat16)
    out = torch.empty_like(c)
    part = torch.empty(1, device=a.device)
    grid = (min(sms, triton.cdiv(m, 128) * triton.cdiv(n, 256)),)
    ref = torch_ref(GELU_RES).float()

    def gemm():
        _gemm[grid](a, w, bias, r, c, part, m, n, k, BM=128, BN=256, BK=64, GROUP_M=8, EPI=BARE, FLATTEN=False,
                    WS=False, PREFETCH=False, SUBTILE=False, PTR_STORE=False, num_warps=8, num_stages=3)
    for block, warps in ((1024, 4), (2048, 8), (4096, 8)):
        def tail(block=block, warps=warps):
            _gelu_residual[(triton.cdiv(m * n, block),)](c, r, out, m * n, BLOCK=block, num_warps=warps)

        def both():
            gemm()
            tail()
        both()
        torch.cuda.synchronize()
        row = {"M": m, "case": "unfused: GEMM+bias, then a gelu+residual kernel", "BLOCK": block, "warps": warps,
               "max_err": round((out.float() - ref).abs().max().item(), 4), "ms": round(do_bench(both), 5),
               "tail_ms": round(do_bench(tail), 5)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
