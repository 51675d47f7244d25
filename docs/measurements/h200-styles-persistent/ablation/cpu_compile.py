import sys, importlib.util, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, "../scripts")
def load(p):
    spec = importlib.util.spec_from_file_location(p.replace(".", "_"), p); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
tgt = GPUTarget("cuda", 90, 32)
def comp(fn, sig, consts, opts, tag):
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i, v in enumerate(sig.values()) if v != "constexpr"})
    k = triton.compile(src, target=tgt, options=opts)
    open(f"/tmp/{tag}.ttgir", "w").write(k.asm["ttgir"])
    open(f"/tmp/{tag}.ptx", "w").write(k.asm["ptx"])
    print(tag, "shared", k.metadata.shared)
g = load("../scripts/gemm_layout_probe.py")
sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
       "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "GROUP_M": "constexpr", "B_NK": "constexpr", "PERSISTENT": "constexpr",
       "FLATTEN": "constexpr", "WS": "constexpr", "RELU": "constexpr"}
consts = {"BM": 128, "BN": 256, "BK": 64, "GROUP_M": 8, "B_NK": True, "PERSISTENT": False, "FLATTEN": False, "WS": False, "RELU": False}
comp(g._gemm, sig, consts, {"num_warps": 8, "num_stages": 3}, "probe")
r = load("relu_tma_128x256_inplace_noepi.py")
sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
       "sxm": "i32", "sxk": "constexpr", "swn": "i32", "swk": "constexpr", "sym": "i32", "syn": "constexpr",
       "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "USE_BLOCK_IO": "constexpr"}
consts = {"sxk": 1, "swk": 1, "syn": 1, "BM": 128, "BN": 256, "BK": 64, "USE_BLOCK_IO": True}
comp(r.fc_relu, sig, consts, {"num_warps": 8, "num_stages": 3}, "port")
