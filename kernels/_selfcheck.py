"""Scratch self-check for the problem suite (not a test, not the verifier).

For each problem folder (all by default, or those named on the command line):
  - loads spec.yaml and checks the loader rules it can see (dims defined, flop/bytes arithmetic),
  - for the chosen variant (ci by default) and for the ragged shapes (the spec's `ragged:` entries, or,
    by default, each non-fixed dim set to 17 and to an odd non-power-of-two near its value):
      seeds, builds reference Model and kernel Model with the same inits, copies the state_dict
      (strict), casts the kernel model to the variant dtype, runs the reference in float64 with the
      kernel's (rounded) weights, and checks |out - ref| <= atol + rtol * |ref|,
  - checks the output is a fresh tensor (not an input, not a view of one) and bit-stable on a rerun.

Usage:
  TRITON_INTERPRET=1 .venv/bin/python kernels/_selfcheck.py [folder ...] [--no-ragged] [--quick]
  python3 kernels/_selfcheck.py --variant bench-gpu --device cuda [folder ...]   # on a GPU machine
"""
import argparse
import ast
import importlib.util
import math
import os
import sys
import time

sys.dont_write_bytecode = True  # keep kernels/ free of __pycache__

import torch
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))

DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "int8": torch.int8, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool,
}
DEFAULT_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-7}


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def expr_names(expr):
    tree = ast.parse(str(expr), mode="eval")
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Call):
            raise ValueError(f"call in expression {expr!r}")
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            raise ValueError(f"attribute/subscript in expression {expr!r}")
    return names


def eval_expr(expr, dims):
    expr_names(expr)
    return eval(str(expr), {"__builtins__": {}}, dict(dims))


def check_spec(spec, folder):
    errs = []
    inputs = spec.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        errs.append("inputs must be a non-empty mapping")
        return errs
    if spec.get("precision", "strict") not in ("strict", "tf32", "bf16", "fp16"):
        errs.append("bad precision")
    for k in ("kind", "origin", "description"):
        if k not in spec:
            errs.append(f"missing {k}")
    variants = [k for k in spec if k == "ci" or k.startswith("bench-")]
    if "ci" not in variants:
        errs.append("no ci variant")
    for v in variants:
        entry = spec[v]
        if not (isinstance(entry, list) and len(entry) == 1):
            errs.append(f"{v}: must be a list with one entry")
            continue
        entry = entry[0]
        dims = entry.get("dims", {})
        used = set()
        for name, inp in inputs.items():
            if "shape" not in inp or "dtype" not in inp:
                errs.append(f"input {name}: needs shape and dtype")
                continue
            if inp["dtype"] not in DTYPES:
                errs.append(f"input {name}: bad dtype")
            used |= {d for d in inp["shape"] if isinstance(d, str)}
            if "range" in inp:
                used |= {d for d in inp["range"] if isinstance(d, str)}
        for it in spec.get("inits", []) or []:
            if "dim" in it:
                used.add(it["dim"])
        for key in ("flop", "bytes"):
            if key in entry:
                try:
                    used |= expr_names(entry[key])
                except ValueError as e:
                    errs.append(f"{v}.{key}: {e}")
        if "flop" not in entry:
            errs.append(f"{v}: no flop")
        if "bytes" not in entry:
            errs.append(f"{v}: no bytes")
        missing = used - set(dims)
        if missing:
            errs.append(f"{v}: dims missing {sorted(missing)}")
        for p in entry.get("params", []):
            if p not in inputs:
                errs.append(f"{v}: params names undeclared input {p}")
        if v == "ci":
            dt = entry.get("dtype")
            if dt == "bfloat16":
                errs.append("ci must not be bfloat16")
    return errs


def odd_near(v):
    """An odd non-power-of-two near v (not v itself)."""
    for c in (v - 1, v + 1, v - 3, v + 3, v - 5, v + 5):
        if c > 2 and c % 2 == 1 and (c & (c - 1)) != 0 and c != v:
            return c
    return v + 2


def ragged_shapes(spec, dims):
    r = spec.get("ragged", None)
    if r is False:
        return []
    if isinstance(r, list):
        return [dict(x) for x in r]
    fixed = set(spec.get("fixed", []) or [])
    out = []
    for d, v in dims.items():
        if d in fixed or not isinstance(v, int):
            continue
        for nv in (17, odd_near(v)):
            if nv != v:
                out.append({d: nv})
    return out


def make_inputs(spec, entry, dims, dtype_override, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    tensors = []
    for name in entry["params"]:
        inp = spec["inputs"][name]
        shape = [dims[d] if isinstance(d, str) else int(d) for d in inp["shape"]]
        dt = DTYPES[inp["dtype"]]
        if dt.is_floating_point:
            if dtype_override is not None:
                dt = dtype_override
            t = torch.randn(shape, generator=g, dtype=torch.float32).to(dt)
        elif dt == torch.bool:
            t = torch.rand(shape, generator=g) < 0.5
        else:
            lo, hi = inp.get("range", [0, 100])
            lo = dims[lo] if isinstance(lo, str) else lo
            hi = dims[hi] if isinstance(hi, str) else hi
            t = torch.randint(lo, hi, shape, generator=g, dtype=dt)
        tensors.append(t.to(device))
    return tensors


def make_inits(spec, dims):
    out = []
    for it in spec.get("inits", []) or []:
        if "dim" in it:
            v = dims[it["dim"]]
            out.append(tuple(v) if isinstance(v, list) else v)
        else:
            out.append(it["value"])
    return out


def run_case(kmod, rmod, spec, entry, dims, device, label, rerun=True, bench=False):
    dtype = DTYPES.get(entry.get("dtype"), None) if entry.get("dtype") else None
    inits = make_inits(spec, dims)
    torch.manual_seed(0)
    ref = rmod.Model(*inits)
    torch.manual_seed(0)
    kern = kmod.Model(*inits)
    kern.load_state_dict(ref.state_dict(), strict=True)
    kern = kern.to(device)
    if dtype is not None:
        kern = kern.to(dtype)
    # oracle: reference with the kernel's rounded weights, in float64
    ref.load_state_dict({k: v.detach().cpu() for k, v in kern.state_dict().items()}, strict=True)
    ref = ref.double().to(device)
    xs = make_inputs(spec, entry, dims, dtype, device, seed=1)
    t0 = time.time()
    with torch.no_grad():
        out = kern(*xs)
        if device == "cuda":
            torch.cuda.synchronize()
        t1 = time.time()
        exp = ref(*[x.double() if x.is_floating_point() else x for x in xs])
    ok = True
    notes = []
    if not isinstance(out, torch.Tensor):
        return False, f"{label}: output is not a tensor"
    if out.shape != exp.shape:
        return False, f"{label}: shape {tuple(out.shape)} != ref {tuple(exp.shape)}"
    for x in xs:
        if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            ok = False
            notes.append("output aliases an input")
    if dtype is not None and out.dtype != dtype:
        notes.append(f"out dtype {out.dtype}")
    tol = DEFAULT_TOL.get(out.dtype, 1e-4)
    rtol = float(entry.get("rtol", tol))
    atol = float(entry.get("atol", tol))
    o = out.double()
    diff = (o - exp).abs()
    bound = atol + rtol * exp.abs()
    if not torch.isfinite(o).all():
        ok = False
        notes.append("non-finite output")
    bad = (diff > bound) | torch.isnan(diff)
    if bad.any():
        ok = False
        notes.append(f"{int(bad.sum())} elems out of tol")
    max_abs = diff.max().item() if diff.numel() else 0.0
    max_rel = (diff / exp.abs().clamp_min(1e-6)).max().item() if diff.numel() else 0.0
    # worst ratio of error to allowed error
    worst = (diff / bound).max().item() if diff.numel() else 0.0
    if rerun and ok:
        with torch.no_grad():
            out2 = kern(*xs)
        if not torch.equal(out, out2):
            notes.append("rerun not bit-identical")
            if not spec.get("nondeterministic", False):
                ok = False
    msg = (f"{label}: {'PASS' if ok else 'FAIL'} max_abs={max_abs:.2e} max_rel={max_rel:.2e} "
           f"err/tol={worst:.3f} (rtol={rtol:g} atol={atol:g}) kernel {t1 - t0:.2f}s"
           + (" [" + "; ".join(notes) + "]" if notes else ""))
    if bench and device == "cuda":
        del ref, exp
        torch.cuda.empty_cache()
        import triton.testing
        with torch.no_grad():
            ms = triton.testing.do_bench(lambda: kern(*xs), warmup=50, rep=300)
        fl = eval_expr(entry["flop"], dims)
        by = eval_expr(entry["bytes"], dims)
        msg += f"\n    timing: {ms:.3f} ms  {fl / ms / 1e9:.1f} TFLOP/s  {by / ms / 1e6:.1f} GB/s"
    return ok, msg


def working_set(rmod, spec, entry, dims):
    """Bytes of inputs + params + buffers + output, built on the meta device."""
    dt = DTYPES.get(entry.get("dtype"))
    try:
        with torch.device("meta"):
            m = rmod.Model(*make_inits(spec, dims))
            if dt is not None:
                m = m.to(dt)
            xs = make_inputs_meta(spec, entry, dims, dt)
            with torch.no_grad():
                y = m(*xs)
        tot = sum(x.numel() * x.element_size() for x in xs)
        tot += sum(p.numel() * p.element_size() for p in m.state_dict().values())
        tot += y.numel() * y.element_size()
        return tot
    except Exception as e:  # noqa: BLE001
        return f"n/a ({type(e).__name__}: {e})"


def make_inputs_meta(spec, entry, dims, dt_override):
    xs = []
    for name in entry["params"]:
        inp = spec["inputs"][name]
        shape = [dims[d] if isinstance(d, str) else int(d) for d in inp["shape"]]
        dt = DTYPES[inp["dtype"]]
        if dt.is_floating_point and dt_override is not None:
            dt = dt_override
        xs.append(torch.empty(shape, dtype=dt, device="meta"))
    return xs


def check_folder(folder, args):
    path = os.path.join(HERE, folder)
    with open(os.path.join(path, "spec.yaml")) as f:
        spec = yaml.safe_load(f)
    lines = []
    errs = check_spec(spec, folder)
    if errs:
        return False, [f"  SPEC ERRORS: {e}" for e in errs]
    tag = folder.replace("-", "_")
    kmod = load_module(os.path.join(path, "kernel.py"), f"k_{tag}")
    rmod = load_module(os.path.join(path, "reference.py"), f"r_{tag}")
    ok_all = True
    for v in [k for k in spec if k.startswith("bench-")]:
        e = spec[v][0]
        ws = working_set(rmod, spec, e, e["dims"])
        fl = eval_expr(e["flop"], e["dims"])
        by = eval_expr(e["bytes"], e["dims"])
        wss = f"{ws / 2**30:.2f} GiB" if isinstance(ws, int) else ws
        warn = " WARNING >4GiB" if isinstance(ws, int) and ws > 4 * 2**30 else ""
        lines.append(f"  {v}: dims={e['dims']} {e.get('dtype')} flop={fl:.3e} bytes={by:.3e} "
                     f"working_set={wss}{warn}")
    t0 = time.time()
    for variant in args.variant.split(","):
        if variant == "bench-all":
            vs = [k for k in spec if k.startswith("bench-")]
        else:
            vs = [variant] if variant in spec else []
        for v in vs:
            ok, more = run_variant(kmod, rmod, spec, v, args)
            ok_all &= ok
            lines.extend(more)
    lines.append(f"  total {time.time() - t0:.1f}s")
    return ok_all, lines


def run_variant(kmod, rmod, spec, variant, args):
    lines = []
    ok_all = True
    entry = spec[variant][0]
    dims = dict(entry["dims"])
    cases = [(variant, dims)]
    if not args.no_ragged and variant == "ci":
        rs = ragged_shapes(spec, dims)
        if args.quick and rs:
            rs = [{k: v for r in rs for k, v in r.items() if v == 17}]
        for r in rs:
            d = dict(dims)
            d.update(r)
            cases.append(("ragged " + ",".join(f"{k}={v}" for k, v in r.items()), d))
    for label, d in cases:
        try:
            ok, msg = run_case(kmod, rmod, spec, entry, d, args.device, label, bench=args.bench)
        except Exception as e:  # noqa: BLE001
            import traceback
            ok, msg = False, f"{label}: ERROR {type(e).__name__}: {e}\n{traceback.format_exc()}"
        ok_all &= ok
        lines.append("  " + msg)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return ok_all, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="*")
    ap.add_argument("--variant", default="ci")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-ragged", action="store_true")
    ap.add_argument("--bench", action="store_true", help="on cuda: also time the kernel model (do_bench)")
    ap.add_argument("--quick", action="store_true", help="one ragged case (all dims 17) instead of all")
    args = ap.parse_args()
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("warning: TRITON_INTERPRET=1 is not set", file=sys.stderr)
    folders = args.folders or sorted(
        d for d in os.listdir(HERE)
        if os.path.isfile(os.path.join(HERE, d, "spec.yaml")))
    folders = [f.rstrip("/").split("/")[-1] for f in folders]
    n_ok = 0
    for f in folders:
        ok, lines = check_folder(f, args)
        n_ok += ok
        print(f"{'PASS' if ok else 'FAIL'} {f}")
        for ln in lines:
            print(ln)
        sys.stdout.flush()
    print(f"{n_ok} passed, {len(folders) - n_ok} failed")
    sys.exit(0 if n_ok == len(folders) else 1)


if __name__ == "__main__":
    main()
