"""Gate 1 reads the whole file: torch references wherever they stand, aliases followed, judged against the start."""

from __future__ import annotations

import pytest

from xeforge.host_refs import HostRefs
from xeforge.kernel_model import parse_kernel
from xeforge.static_checks import StaticChecker

KERNEL = '''
import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
'''

MODEL = '''

class Model(torch.nn.Module):
    def forward(self, x{params}):
        y = torch.empty_like(x)
{body}
        copy_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        return y
'''


def make(head: str = "", params: str = "", body: str = "        pass") -> str:
    return KERNEL + head + MODEL.format(params=params, body=body)


START = make()


def refs(src: str) -> set[tuple[str, str]]:
    return {(r.kind, r.key) for r in HostRefs(parse_kernel(src)).refs}


@pytest.mark.parametrize("head,params,body,kind,key,form", [
    ("_mm = torch.mm\n", "", "        z = _mm(x, x)", "compute", "torch.mm", "bound to _mm at module level"),
    ("import torch as T\n", "", "        z = T.bmm(x, x)", "compute", "torch.bmm", "a call in forward()"),
    ("from torch import matmul as M\n", "", "        z = M(x, x)", "compute", "torch.matmul", "imported"),
    ("ops = {'mm': torch.mm}\n", "", "        z = ops['mm'](x, x)", "compute", "torch.mm", "bound to ops"),
    ("pair = (torch.relu, torch._C)\n", "", "        f, C = pair", "internal", "torch._C", "bound to pair"),
    ("", ", f=torch.mm", "        z = f(x, x)", "compute", "torch.mm", "default argument of forward()"),
    ("", "", "        z = getattr(torch, 'addmm')(x, x, x)", "compute", "torch.addmm", "a call in forward()"),
    ("", "", "        z = (lambda a: a.sum())(x)", "compute", ".sum", "in a lambda"),
    ("", "", "        def inner(a):\n            return a @ a\n        z = inner(x)", "compute", "@",
     "nested function"),
    ("import operator\n_f = operator.mul\n", "", "        z = _f(x, x)", "compute", "operator.mul", "module level"),
    ("", "", "        z = x.__matmul__(x)", "compute", ".__matmul__", "a call in forward()"),
    ("", "", "        z = torch.from_numpy(x.numpy())", "compute", ".numpy", "a call in forward()"),
    ("C = torch._C\n", "", "        n = C._len_torch_function_stack()", "internal",
     "torch._C._len_torch_function_stack", "a call in forward()"),
    ("", "", "        torch.ops.aten.mm.default(x, x)", "internal", "torch.ops.aten.mm.default", "a call"),
    ("from torch.overrides import TorchFunctionMode\n", "", "", "internal", "torch.overrides.TorchFunctionMode",
     "imported"),
    ("", "", "        torch.jit.fork(torch.mm, x, x)", "internal", "torch.jit.fork", "a call"),
    ("", "", "        torch.profiler.profile().__exit__(None, None, None)", "internal", "torch.profiler.profile",
     "a call"),
    ("from triton.runtime.jit import JITFunction\nJITFunction.run = print\n", "", "", "patch",
     "triton.runtime.jit.JITFunction.run", "assigned at module level"),
    ("torch.Tensor.__add__ = torch.Tensor.__sub__\n", "", "", "patch", "torch.Tensor.__add__", "assigned"),
    ("", "", "        copy_kernel._bench(x, y, config=None)", "internal", "copy_kernel._bench", "a call"),
])
def test_a_reference_is_found_wherever_it_stands(head, params, body, kind, key, form):
    src = make(head, params, body)
    found = [r for r in HostRefs(parse_kernel(src)).refs if r.kind == kind and r.key == key]
    assert found, f"{kind} {key} not found in {sorted(refs(src))}"
    assert any(form in r.form for r in found), [r.form for r in found]


def test_torch_inside_a_kernel_body_counts_and_tl_methods_do_not():
    src = START.replace("    tl.store(y_ptr", "    z = torch.mm(x_ptr, x_ptr)\n    tl.store(y_ptr")
    kinds = refs(src)
    assert ("compute", "torch.mm") in kinds
    assert not any(k == ".sum" for _, k in refs(START.replace("tl.load(x_ptr + offs, mask=offs < n)",
                                                               "tl.load(x_ptr + offs, mask=offs < n).sum(0)")))



def test_a_kernel_own_name_is_not_the_host_value_of_the_same_name():
    """``acc`` bound to a torch dtype on the host and to a tl tile in the kernel: the kernel's ``acc.to(...)`` is the
    tile's method (a rewrite that adds one more is no torch compute); ``torch`` bound to a kernel name still is."""
    host = START.replace("        y = torch.empty_like(x)",
                         "        acc = torch.float32\n        y = torch.empty_like(x)")
    kernel = host.replace("    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)",
                          "    acc = tl.load(x_ptr + offs, mask=offs < n)\n"
                          "    tl.store(y_ptr + offs, acc.to(tl.float32).to(y_ptr.dtype.element_ty), mask=offs < n)")
    assert "acc.to(" in kernel and "acc = torch.float32" in kernel
    assert not any("to" in k for _, k in refs(kernel))
    aliased = kernel.replace("    acc = tl.load(x_ptr", "    mm = torch.mm\n    acc = tl.load(x_ptr")
    assert ("compute", "torch.mm") in refs(aliased)
    # a kernel name bound to torch itself: what it names is torch's, called or not
    module = kernel.replace("    acc = tl.load(x_ptr + offs, mask=offs < n)",
                            "    T = torch\n    acc = T.relu(tl.load(x_ptr + offs, mask=offs < n))")
    assert ("compute", "torch.relu") in refs(module)

def test_class_attributes_are_followed_through_self():
    src = KERNEL + '''

class Model(torch.nn.Module):
    gemm = torch.mm

    def forward(self, x):
        y = torch.empty_like(x)
        z = self.gemm(x, x)
        copy_kernel[(1,)](z, y, x.numel(), BLOCK=64)
        return y
'''
    hits = [r for r in HostRefs(parse_kernel(src)).of("compute") if r.key == "torch.mm"]
    assert {r.form.split(" ")[0] for r in hits} == {"bound", "a"}  # the class attribute and its call


def test_the_start_is_the_baseline_and_the_finding_names_what_was_added():
    start = make("import time\n_mm = torch.mm\n", body="        t = time.time()\n        z = _mm(x, x)")
    checker = StaticChecker(parse_kernel(start))
    _, findings = checker.check(start)
    assert not findings, [f.render() for f in findings]
    assert any("imports 'time'" in n for n in checker.notes), checker.notes  # the user's own, noted
    # one more use of torch.mm and a mode-stack function: only those are named, with their lines and forms
    cand = make("import time\n_mm = torch.mm\n_pop = torch._C._pop_torch_function_stack\n",
                body="        t = time.time()\n        z = _mm(x, x)\n        w = _mm(z, z)")
    _, findings = checker.check(cand)
    rules = {f.rule: f for f in findings}
    assert set(rules) == {"S020-torch-compute", "S021-torch-internals"}, [f.render() for f in findings]
    assert "torch.mm beyond the starting kernel (1 more" in rules["S020-torch-compute"].message
    assert "the mode stack" in rules["S021-torch-internals"].message
    assert "bound to _pop at module level" in rules["S021-torch-internals"].message
    # a second import the start does not have is still refused
    _, findings = checker.check(cand.replace("import time\n", "import time\nimport socket\n"))
    assert any(f.rule == "S010-import" and "socket" in f.message for f in findings)


def test_own_library_ops_and_public_names_are_not_internals():
    src = make("lib = 'xf'\n", body="        torch.ops.xf.copy(x)\n        d = torch.float32\n"
               "        torch.cuda.synchronize()") + '\n@torch.library.custom_op("xf::copy", mutates_args=())\n' \
        'def copy(x: torch.Tensor) -> torch.Tensor:\n    return x\n'
    kinds = refs(src)
    assert ("internal", "torch.ops.xf.copy") not in kinds
    assert not any(k == "compute" for k, _ in kinds), kinds
    assert not any(k == "internal" for k, _ in kinds), kinds  # the file's own op, defined with the public API
    over = src + '\n@torch.library.impl("aten::mm", "CPU")\ndef mine(a, b):\n    return a\n'
    assert ("internal", "torch.library:aten") in refs(over)  # an override of torch's own operator


def test_a_kernel_named_like_a_vendor_kernel_is_refused():
    src = START.replace("copy_kernel", "nvjet_sm90_tst_64x48_64x15_2x4_h_bz_NNT")
    _, findings = StaticChecker(parse_kernel(START)).check(src)
    assert any(f.rule == "S023-kernel-name" for f in findings), [f.render() for f in findings]
