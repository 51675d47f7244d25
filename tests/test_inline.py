"""Inlining the calls that lead to a launch into ``Model.forward`` (xeforge/rewrite/fusion/inline.py).

The kernels here are plain Python functions under a stand-in ``triton`` module whose ``jit`` makes
``kernel[grid](...)`` call them: the inliner only reads syntax, and running the file before and after shows that
the inlined ``forward`` computes the same (renamed locals, arguments evaluated once, results hoisted out of
expressions). The Triton kernels of the style corpus go through the real verifier in tests/test_style_corpus.py.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from xeforge.rewrite import NotApplicable
from xeforge.rewrite.fusion.inline import into_forward

HEADER = '''
import torch
import triton


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, SCALE: "tl.constexpr"):
    out_ptr.copy_(x_ptr * SCALE + n)
'''


@pytest.fixture
def fake_triton(monkeypatch):
    """``triton.jit`` whose ``kernel[grid](*args, **kw)`` runs the function; ``triton.cdiv`` as upstream."""
    class Launch:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *a, **kw: self.fn(*a, **{k: v for k, v in kw.items() if k != "num_warps"})

    mod = types.SimpleNamespace(jit=Launch, cdiv=lambda a, b: (a + b - 1) // b)
    monkeypatch.setitem(sys.modules, "triton", mod)
    return mod


def run(source: str, *inputs, init=()):
    ns: dict = {"__name__": "inlined_under_test"}
    exec(compile(source, "<kernel>", "exec"), ns)
    torch.manual_seed(0)
    return ns["Model"](*init)(*inputs)


def forward_of(source: str) -> str:
    return source[source.index("    def forward"):]


def test_a_wrapper_is_inlined_with_clashing_locals_renamed_and_computes_the_same(fake_triton):
    src = HEADER + '''

def scaled(x, scale=2.0):
    out = torch.empty_like(x)
    n = 1
    scale_kernel[(triton.cdiv(x.numel(), 128),)](x, out, n, SCALE=scale, num_warps=4)
    return out


class Model(torch.nn.Module):
    def forward(self, x):
        n = 10  # forward's own n: the wrapper's is renamed
        out = scaled(x)
        return out + n
'''
    new, notes = into_forward(src)
    fwd = forward_of(new)
    assert "scale_kernel[" in fwd and "= scaled(" not in fwd and "def scaled" not in new  # the unused wrapper goes
    assert "n_1 = 1" in fwd and "SCALE=2.0" in fwd  # a clash renamed; the default argument substituted
    assert notes == ["inlined the wrapper scaled into forward: scaled(x)"]
    x = torch.randn(8)
    assert torch.equal(run(new, x), run(src, x))


def test_a_call_inside_an_expression_is_hoisted_and_an_argument_is_evaluated_once(fake_triton):
    src = HEADER + '''

calls = []


def scaled(x, scale):
    calls.append(1)
    out = torch.empty_like(x)
    scale_kernel[(1,)](x, out, 0, SCALE=scale)
    return out


def noisy(x):
    calls.append(2)
    return x + 1


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(scaled(noisy(x), 3.0)) - 1
'''
    new, _ = into_forward(src)
    fwd = forward_of(new)
    assert "x_1 = noisy(x)" in fwd  # forward's x is taken: the parameter's local is renamed
    assert fwd.count("noisy(") == 1 and "return torch.relu(out) - 1" in fwd
    x = torch.randn(5)
    assert torch.equal(run(new, x), run(src, x))


def test_an_autograd_function_drops_its_ctx_bookkeeping_and_says_the_port_is_forward_only(fake_triton):
    src = HEADER + '''

def contiguous_args(fn):
    def wrapper(ctx, *args):
        return fn(ctx, *[a.contiguous() if isinstance(a, torch.Tensor) else a for a in args])
    return wrapper


class ScaleFn(torch.autograd.Function):
    @staticmethod
    @contiguous_args
    def forward(ctx, x, scale):
        out = torch.empty_like(x)
        scale_kernel[(1,)](x, out, 0, SCALE=scale)
        ctx.save_for_backward(x)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


class Model(torch.nn.Module):
    def forward(self, x):
        y = ScaleFn.apply(x, 0.5)
        return y * 2
'''
    new, notes = into_forward(src)
    assert "ctx" not in forward_of(new) and "class ScaleFn" not in new and "def contiguous_args" not in new
    assert "forward-only" in notes[0] and "@contiguous_args is not applied" in notes[0]
    x = torch.randn(6)
    assert torch.equal(run(new, x), run(src, x))


def test_a_launcher_objects_method_is_inlined_with_its_attributes_and_removed(fake_triton):
    src = HEADER + '''

class Launcher:
    def __init__(self, scale=4.0):
        self.scale = scale

    def launch(self, x):
        out = torch.empty_like(x)
        scale_kernel[(1,)](x, out, 0, SCALE=self.scale)
        return out


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.op = Launcher()

    def forward(self, x):
        return self.op.launch(x)
'''
    new, notes = into_forward(src)
    assert "SCALE=self.op.scale" in forward_of(new) and "def launch" not in new and "class Launcher" in new
    assert notes == ["inlined self.op.launch (Launcher.launch) into forward: self.op.launch(x)"]
    x = torch.randn(3)
    assert torch.equal(run(new, x), run(src, x))


def test_a_custom_op_called_through_torch_ops_is_inlined_and_goes_with_its_fake():
    src = HEADER + '''

@torch.library.custom_op("xeforge_test::scaled", mutates_args=())
def scaled(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    scale_kernel[(1,)](x, out, 0, SCALE=2.0)
    return out


@scaled.register_fake
def _(x):
    return torch.empty_like(x)


class Model(torch.nn.Module):
    def forward(self, x):
        y = torch.ops.xeforge_test.scaled(x)
        return y
'''
    new, notes = into_forward(src)
    assert "register_fake" not in new and "custom_op" not in new and "scale_kernel[" in forward_of(new)
    assert "the torch.library op xeforge_test::scaled" in notes[0]


@pytest.mark.parametrize("body, why", [
    ("    if x.numel() > 4:\n        y = x\n    else:\n        return x\n    LAUNCH\n    return out\n",
     "returns from more than one place"),
    ("    LAUNCH\n    yield out\n", "uses yield"),
])
def test_a_callee_that_cannot_be_inlined_is_named_with_the_construct(body, why):
    launch = "out = torch.empty_like(x); scale_kernel[(1,)](x, out, 0, SCALE=1.0)"
    src = HEADER + f"\n\ndef wrap(x):\n{body.replace('LAUNCH', launch)}\n\nclass Model(torch.nn.Module):\n" \
        "    def forward(self, x):\n        return wrap(x)\n"
    with pytest.raises(NotApplicable) as exc:
        into_forward(src)
    assert "the wrapper wrap (line" in str(exc.value) and "cannot be inlined into forward" in str(exc.value)
    assert why in str(exc.value)


def test_early_exits_call_the_wrapper_as_it_was_and_run_the_rest_of_forward(fake_triton):
    """A wrapper that returns early (a size guard, a fallback off the GPU) is inlined: each early exit calls the
    wrapper itself, so its fallback runs as written, then the rest of forward; the inlined launch gets a copy of
    the kernel (which fusion may change) while the wrapper keeps launching its own."""
    src = HEADER + '''

def wrap(x):
    assert x.dim() == 1, "vectors only"
    if x.numel() > 4:
        return x * 3.0
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    scale_kernel[(1,)](x, out, 0, SCALE=2.0)
    return out


class Model(torch.nn.Module):
    def forward(self, x):
        y = wrap(x)
        y = y + 1.0
        return y
'''
    new, notes = into_forward(src)
    fwd = forward_of(new)
    assert "def _rest_after_wrap(value):" in fwd and "scale_kernel_fused[(1,)](" in fwd
    assert fwd.count("return _rest_after_wrap(wrap(x))") == 2
    assert "def wrap(x):" in new and "def scale_kernel_fused(" in new  # the wrapper and its kernel stay as they were
    assert "its early returns call it as it was" in notes[0]
    for x in (torch.arange(3.0), torch.arange(8.0), torch.zeros(0)):  # the launch path and both exits
        assert torch.equal(run(new, x), run(src, x))


@pytest.mark.parametrize("call, why", [
    ("y = wrap(x) if x.numel() > 1 else x", "conditional expression"),
    ("y = [wrap(t) for t in (x,)][0]", "comprehension"),
    ("y = wrap(*[x])", r"passes \*args"),
])
def test_a_launching_call_that_may_not_run_or_cannot_be_bound_is_refused(call, why):
    src = HEADER + '''

def wrap(x):
    out = torch.empty_like(x)
    scale_kernel[(1,)](x, out, 0, SCALE=1.0)
    return out


class Model(torch.nn.Module):
    def forward(self, x):
        CALL
        return y
'''.replace("CALL", call)
    with pytest.raises(NotApplicable, match=why):
        into_forward(src)


def test_ctx_read_beyond_saving_for_backward_is_refused():
    src = HEADER + '''

class Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = torch.empty_like(x)
        scale_kernel[(1,)](x, out, 0, SCALE=1.0)
        ctx.mark_dirty(out)
        return out * ctx.needs_input_grad[0]


class Model(torch.nn.Module):
    def forward(self, x):
        return Fn.apply(x)
'''
    with pytest.raises(NotApplicable, match=r"uses ctx \(line \d+\) beyond saving for backward"):
        into_forward(src)


def test_forward_without_a_launching_call_is_left_alone():
    src = HEADER + '''

def helper(x):
    return x + 1


class Model(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        scale_kernel[(1,)](helper(x), out, 0, SCALE=1.0)
        return out
'''
    assert into_forward(src) is None
