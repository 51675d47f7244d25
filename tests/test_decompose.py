"""The lowering of ops outside the fusion table through torch's decompositions (xeforge.rewrite.fusion.decompose):
the tl code it writes, evaluated with a stand-in ``tl`` made of torch functions, equals the op itself on random
inputs; what is not elementwise is refused with the ATen op named; and nothing but tensor math is ever called."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from xeforge.rewrite.fusion.decompose import DecompositionError, lower_call

#: tl's functions as torch computes them (fp64), enough to evaluate what the lowering writes
TL = types.SimpleNamespace(
    where=lambda c, a, b: torch.where(torch.as_tensor(c).bool(), torch.as_tensor(a, dtype=torch.float64),
                                      torch.as_tensor(b, dtype=torch.float64)),
    maximum=lambda a, b: torch.maximum(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)),
    minimum=lambda a, b: torch.minimum(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)),
    exp=torch.exp, exp2=torch.exp2, log=torch.log, log2=torch.log2, sqrt=torch.sqrt, rsqrt=torch.rsqrt, abs=torch.abs,
    sigmoid=torch.sigmoid, erf=torch.erf, sin=torch.sin, cos=torch.cos, floor=torch.floor, ceil=torch.ceil,
)

CASES = [
    ("F.hardswish", F.hardswish, [], {}),
    ("F.hardsigmoid", F.hardsigmoid, [], {}),
    ("F.elu", F.elu, [0.5], {}),
    ("F.selu", F.selu, [], {}),
    ("F.celu", F.celu, [], {"alpha": 2.0}),
    ("F.softsign", F.softsign, [], {}),
    ("F.logsigmoid", F.logsigmoid, [], {}),
    ("F.tanhshrink", F.tanhshrink, [], {}),
    ("F.softshrink", F.softshrink, [0.3], {}),
    ("F.hardshrink", F.hardshrink, [], {}),
    ("F.relu6", F.relu6, [], {}),
    ("F.gelu", F.gelu, [], {"approximate": "tanh"}),
    ("torch.special.expit", torch.special.expit, [], {}),
    ("torch.sinh", torch.sinh, [], {}),
    ("torch.cosh", torch.cosh, [], {}),
]


def _run(code: str, lines: list[str], z: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    env = {"tl": TL, "acc": z, "other": b, "float": float}
    for line in lines:
        name, expr = line.split(" = ", 1)
        env[name] = eval(expr, env)  # noqa: S307 - the lowering's own output, on this test's tensors
    return torch.as_tensor(eval(code, env), dtype=torch.float64)  # noqa: S307


def _lower(name, args, kwargs, lines):
    def bind(code, base):
        lines.append(f"{base}{len(lines)} = {code}")
        return f"{base}{len(lines) - 1}"
    return lower_call(name, False, args + [("const", v) for v in kwargs.values()], tuple(kwargs), bind)


@pytest.mark.parametrize("name,fn,consts,kwargs", CASES, ids=[c[0] for c in CASES])
def test_the_lowered_code_computes_the_op(name, fn, consts, kwargs):
    lines: list[str] = []
    code = _lower(name, [("tensor", "acc"), *[("const", c) for c in consts]], kwargs, lines)
    z = torch.linspace(-6, 6, 97, dtype=torch.float64)
    got = _run(code, lines, z)
    want = fn(z, *consts, **kwargs)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-6), (name, lines, code, (got - want).abs().max())


def test_two_tensors_and_a_scalar_weight():
    lines: list[str] = []
    code = _lower("torch.lerp", [("tensor", "acc"), ("tensor", "other"), ("const", 0.25)], {}, lines)
    z, b = torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    assert "tl.where(False" not in " ".join(lines)  # a condition on constants is decided here, not in the kernel
    assert torch.allclose(_run(code, lines, z, b), torch.lerp(z, b, 0.25))


@pytest.mark.parametrize("name,consts,why", [
    ("torch.cumsum", [1], r"decomposes to aten\.\w+, which has no tl lowering"),
    ("torch.sum", [], r"decomposes to aten\.sum, which has no tl lowering"),
    ("torch.save", ["f"], r"torch\.save\(\) is not an op with a reference implementation in torch\._refs"),
    ("torch.nn.functional.nope", [], r"is not an op"),
])
def test_what_is_not_elementwise_math_is_refused_with_the_op_named(name, consts, why):
    with pytest.raises(DecompositionError, match=why):
        _lower(name, [("tensor", "acc"), *[("const", c) for c in consts]], {}, [])


def test_a_function_outside_tensor_math_is_never_called(monkeypatch, tmp_path):
    called = []
    monkeypatch.setattr(torch, "save", lambda *a, **k: called.append(a))
    with pytest.raises(DecompositionError):
        _lower("torch.save", [("tensor", "acc"), ("const", str(tmp_path / "f"))], {}, [])
    assert called == [] and not (tmp_path / "f").exists()
