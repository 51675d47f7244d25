"""A kernel's calls of its file's jit helpers, inlined into its body (xeforge/rewrite/jit_inline.py): the code the
tactics then read, and the refusals, each naming the helper and the construct."""

from __future__ import annotations

import ast

import pytest

from xeforge.rewrite import NotApplicable
from xeforge.rewrite.jit_inline import inline_helpers

HEAD = "import triton\nimport triton.language as tl\n\n\n"

ROTATE = HEAD + '''@triton.jit
def _scale_rows(base, n, k, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(base + offs, mask=offs < n)
    tl.store(base + offs, x * k, mask=offs < n)


@triton.jit
def _twice(x, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    return x * 2.0, offs


@triton.jit
def kernel(A, B, n, na, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid
    if pid < na:
        _scale_rows(A + pid * BLOCK, n, 3.0, BLOCK)
    else:
        _scale_rows(B + (pid - na) * BLOCK, n, 3.0, BLOCK)
    y, o = _twice(offs, BLOCK)
'''


def _kernel_body(source: str) -> str:
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "kernel")
    return ast.unparse(fn)


def test_each_call_gets_its_own_copy_with_the_kernels_names_kept_apart():
    src, notes = inline_helpers(ROTATE, "kernel")
    assert notes == ["the jit helper _scale_rows inlined into kernel", "the jit helper _twice inlined into kernel"]
    body = _kernel_body(src)
    assert "_scale_rows(" not in body and "_twice(" not in body
    # plain names and constants are substituted (a constexpr stays one); an expression is evaluated once
    assert "base = A + pid * BLOCK" in body and "tl.arange(0, BLOCK)" in body and "x * 3.0" in body
    assert "base_1 = B + (pid - na) * BLOCK" in body
    # the helper's `offs` would clobber the kernel's: renamed; the value returned replaces the call
    assert "offs_1 = tl.arange(0, BLOCK)" in body and "y, o = (offs * 2.0, offs_" in body
    assert "def _scale_rows" not in src and "def _twice" not in src  # nothing calls them any more
    ast.parse(src)


def test_a_helper_another_kernel_still_calls_stays_defined():
    other = ROTATE + '''

@triton.jit
def other(A, BLOCK: tl.constexpr):
    y, o = _twice(A, BLOCK)
'''
    src, _ = inline_helpers(other, "kernel")
    assert "def _twice" in src and "def _scale_rows" not in src


def test_only_the_helpers_asked_for():
    src, notes = inline_helpers(ROTATE, "kernel", lambda h: h.name.value == "_twice")
    assert notes == ["the jit helper _twice inlined into kernel"] and "_scale_rows(A + pid * BLOCK" in src


@pytest.mark.parametrize("helper,call,reason", [
    ("def h(x):\n    if x > 0:\n        return x\n    return -x\n", "y = h(pid)",
     "the jit helper h returns before its end"),
    ("def h(x):\n    return h(x)\n", "y = h(pid)", "the jit helper h calls itself"),
    ("def h(x):\n    return x + 1\n", "y = h(pid) + 1", "the call of h is part of a larger expression"),
    ("def h(*xs):\n    return xs[0]\n", "y = h(pid)", "*args"),
])
def test_refusals_name_the_helper_and_the_construct(helper, call, reason):
    src = HEAD + f"@triton.jit\n{helper}\n\n@triton.jit\ndef kernel(A):\n    pid = tl.program_id(0)\n    {call}\n"
    with pytest.raises(NotApplicable, match=reason.replace("*", r"\*")):
        inline_helpers(src, "kernel")


def test_a_kernel_without_helper_calls_is_returned_as_it_is():
    src = HEAD + "@triton.jit\ndef kernel(A):\n    pid = tl.program_id(0)\n"
    assert inline_helpers(src, "kernel") == (src, [])
