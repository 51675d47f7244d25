import importlib.util, json, sys, torch, triton
from triton.testing import do_bench
sys.path.insert(0, "../scripts")
import gemm_layout_probe as g
dev = torch.device("cuda")
spec = importlib.util.spec_from_file_location("port", "relu_tma_128x256_inplace_noepi.py"); r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)
triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
M = N = K = 4096; M = 1024
torch.manual_seed(0)
lin = torch.nn.Linear(K, N).to(dev, torch.bfloat16)
x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
w_lin = lin.weight.detach()
w_rand = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
def port(w):
    return lambda: r.fc_relu[(8, 16)](x, w, lin.bias, y, M, N, K, K, 1, K, 1, N, 1, BM=128, BN=256, BK=64, USE_BLOCK_IO=True, num_warps=8, num_stages=3)
def probe(w):
    return lambda: g._gemm[(128,)](x, w, y, M, N, K, BM=128, BN=256, BK=64, GROUP_M=8, B_NK=True, PERSISTENT=False, FLATTEN=False, WS=False, RELU=False, num_warps=8, num_stages=3)
model = r.Model(K, N).to(dev, torch.bfloat16)
cases = [("port kernel, Linear weight", port(w_lin)), ("port kernel, randn weight", port(w_rand)),
         ("probe kernel, Linear weight", probe(w_lin)), ("probe kernel, randn weight", probe(w_rand)),
         ("port Model.forward", lambda: model(x)), ("cublas Linear weight", lambda: x @ w_lin.t()), ("cublas randn", lambda: x @ w_rand.t())]
for rep in range(2):
    for name, fn in cases:
        fn(); torch.cuda.synchronize()
        print(json.dumps({"case": name, "rep": rep, "ms": round(do_bench(fn, warmup=50, rep=200), 5)}), flush=True)
