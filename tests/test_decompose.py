"""The one lowering of epilogue ops, through torch's decompositions to the primitive table
(xeforge.rewrite.fusion.decompose): the tl code it writes, evaluated with a stand-in ``tl`` made of torch functions,
equals the op itself on random inputs, for tile values, per-column vectors and run-time scalars; what is not
elementwise is refused with the ATen op named; and nothing but tensor math is ever called."""

from __future__ import annotations

import ast
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
    exp=torch.exp, exp2=torch.exp2, log=torch.log, log2=torch.log2, sqrt=torch.sqrt, rsqrt=torch.rsqrt,
    abs=lambda a: torch.abs(torch.as_tensor(a, dtype=torch.float64)),  # a run-time scalar is a tl scalar there
    sigmoid=torch.sigmoid, erf=torch.erf, sin=torch.sin, cos=torch.cos, floor=torch.floor, ceil=torch.ceil,
)

CASES = [
    ("torch.relu", torch.relu, [], {}),
    ("F.leaky_relu", F.leaky_relu, [0.2], {}),
    ("F.silu", F.silu, [], {}),
    ("torch.tanh", torch.tanh, [], {}),
    ("F.gelu-erf", F.gelu, [], {}),
    ("F.hardtanh", F.hardtanh, [-0.5, 2.0], {}),
    ("torch.clamp", torch.clamp, [-1.0], {"max": 3.0}),
    ("F.mish", F.mish, [], {}),
    ("F.softplus", F.softplus, [], {"beta": 2.0, "threshold": 5.0}),
    ("torch.exp", torch.exp, [], {}),
    ("torch.abs", torch.abs, [], {}),
    ("torch.neg", torch.neg, [], {}),
    ("torch.square", torch.square, [], {}),
    ("torch.reciprocal", torch.reciprocal, [], {}),
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
    return _run_with(code, lines, {"acc": z, "other": b})


def _lower(name, args, kwargs, lines):
    return lower_call(name, False, args + [("const", v) for v in kwargs.values()], tuple(kwargs), _binder(lines))


@pytest.mark.parametrize("name,fn,consts,kwargs", CASES, ids=[c[0] for c in CASES])
def test_the_lowered_code_computes_the_op(name, fn, consts, kwargs):
    lines: list[str] = []
    code = _lower(name.split("-")[0], [("tile", "acc"), *[("const", c) for c in consts]], kwargs, lines)
    z = torch.linspace(-6, 6, 97, dtype=torch.float64)
    got = _run(code, lines, z)
    want = fn(z, *consts, **kwargs)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-6), (name, lines, code, (got - want).abs().max())


def test_two_tensors_and_a_scalar_weight():
    lines: list[str] = []
    code = _lower("torch.lerp", [("tile", "acc"), ("tile", "other"), ("const", 0.25)], {}, lines)
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
        _lower(name, [("tile", "acc"), *[("const", c) for c in consts]], {}, [])


def test_a_function_outside_tensor_math_is_never_called(monkeypatch, tmp_path):
    called = []
    monkeypatch.setattr(torch, "save", lambda *a, **k: called.append(a))
    with pytest.raises(DecompositionError):
        _lower("torch.save", [("tile", "acc"), ("const", str(tmp_path / "f"))], {}, [])
    assert called == [] and not (tmp_path / "f").exists()


def test_run_time_scalars_are_operands_of_the_lowered_code():
    """``F.hardtanh(y, self.lo, self.hi)``, ``F.softplus(y, beta=self.beta)``: Python scalars the kernel receives
    at run time appear in the code by name, at every place the decomposition uses them (traced twice with different
    stand-in values to find them); a decomposition that computes with one while tracing is refused."""
    z = torch.linspace(-6, 6, 97, dtype=torch.float64)
    lines: list[str] = []
    code = _lower("F.hardtanh", [("tile", "acc"), ("scalar", "lo"), ("scalar", "hi")], {}, lines)
    env_extra = {"lo": -0.75, "hi": 1.5}
    got = _run_with(code, lines, {"acc": z, **env_extra})
    assert "lo" in code and "hi" in code and torch.allclose(got, F.hardtanh(z, -0.75, 1.5))
    lines = []
    code = lower_call("F.softplus", False, [("tile", "acc"), ("scalar", "beta")], ("beta",), _binder(lines))
    got = _run_with(code, lines, {"acc": z, "beta": 1.7})
    assert torch.allclose(got, F.softplus(z, beta=1.7), atol=1e-9)
    lines = []
    code = _lower("torch.lerp", [("tile", "acc"), ("tile", "other"), ("scalar", "w")], {}, lines)
    b = torch.randn(97, dtype=torch.float64)
    for w in (0.25, 0.75):  # torch's lerp branches on the weight: the branch is in the kernel, not fixed at tracing
        assert torch.allclose(_run_with(code, lines, {"acc": z, "other": b, "w": w}), torch.lerp(z, b, w))
    with pytest.raises(DecompositionError, match="computes a constant from a run-time scalar"):
        _lower("torch.special.logit", [("tile", "acc"), ("scalar", "eps")], {}, [])  # 1 - eps, in Python


def test_per_column_vectors_broadcast_and_their_math_is_done_once_per_column():
    """Inference ``F.batch_norm`` on the tile with per-column statistics, weight, bias and a run-time eps."""
    z = torch.randn(5, 8, dtype=torch.float64)
    cols = {n: torch.randn(8, dtype=torch.float64) for n in ("mean", "w", "b")}
    cols["var"] = torch.rand(8, dtype=torch.float64) + 0.1
    lines: list[str] = []
    code = lower_call("F.batch_norm", False, [("tile", "acc"), ("column", "mean"), ("column", "var"),
                                              ("column", "w"), ("column", "b"), ("const", False), ("scalar", "eps")],
                      ("training", "eps"), _binder(lines))
    got = _run_with(code, lines, {"acc": z, **cols, "eps": 1e-3})
    want = F.batch_norm(z, cols["mean"], cols["var"], cols["w"], cols["b"], training=False, eps=1e-3)
    assert torch.allclose(got, want, atol=1e-9), (lines, code)
    # no division has the tile in its divisor: 1 / sqrt(var + eps) is a column's own ([1, N] in the kernel)
    divisions = [n for n in ast.walk(ast.parse(" ; ".join([code, *(x.split(" = ", 1)[1] for x in lines)])))
                 if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)]
    assert divisions and not any("acc" in ast.unparse(d.right) for d in divisions), (lines, code)
    assert "* 1.0" not in code  # the decomposition's weight of 1 is dropped
    # (acc - mean) * invstd * w + b folded into one multiply-add: the tile is read once, by the code that returns;
    # the scale and shift are computed from the columns alone, so two of them, not four, live beside the tile
    assert _reads(code).count("acc") == 1 and not any("acc" in _reads(x.split(" = ", 1)[1]) for x in lines)
    assert len(_names(code) - {"acc", "tl"}) == 2, code


AFFINE_CASES = [  # ops whose decomposition is a run of multiply-adds on the tile (the alpha'd sub is not folded)
    ("torch.rsub", [("column", "c")], {}, lambda z, c, d: c - z),
    ("torch.addcmul", [("column", "c"), ("column", "d")], {"value": 0.5}, lambda z, c, d: z + 0.5 * c * d),
    ("torch.addcdiv", [("column", "c"), ("column", "d")], {"value": 2.0}, lambda z, c, d: z + 2.0 * c / d),
    ("torch.sub", [("column", "c")], {"alpha": 2.0}, lambda z, c, d: z - 2.0 * c),
    ("torch.div", [("column", "d")], {}, lambda z, c, d: z / d),
    ("torch.neg", [], {}, lambda z, c, d: -z),
]


@pytest.mark.parametrize("name,args,kwargs,want", AFFINE_CASES, ids=[c[0] for c in AFFINE_CASES])
def test_a_run_of_multiply_adds_is_one_multiply_add_on_the_tile(name, args, kwargs, want):
    z = torch.randn(5, 8, dtype=torch.float64)
    c, d = torch.randn(8, dtype=torch.float64), torch.rand(8, dtype=torch.float64) + 0.5
    lines: list[str] = []
    code = _lower(name, [("tile", "acc"), *args], kwargs, lines)
    got = _run_with(code, lines, {"acc": z, "c": c, "d": d})
    assert torch.allclose(got, want(z, c, d), atol=1e-12), (lines, code)
    assert _reads(code).count("acc") == 1 and not any("acc" in x for x in lines), (lines, code)
    ops = [type(n.op) for n in ast.walk(ast.parse(code, mode="eval")) if isinstance(n, ast.BinOp)]
    assert ops.count(ast.Mult) <= 1 and ops.count(ast.Add) + ops.count(ast.Sub) <= 1 and ast.Div not in ops, code


def test_a_division_by_a_zero_literal_is_a_multiply_by_inf():
    z = torch.tensor([-2.0, 0.0, 3.0], dtype=torch.float64)
    lines: list[str] = []
    code = _lower("torch.div", [("tile", "acc"), ("const", 0.0)], {}, lines)
    got, want = _run_with(code, lines, {"acc": z}), z / 0.0
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~want.isnan()], want[~want.isnan()]), code


def test_a_value_read_by_something_else_than_a_multiply_add_is_written_out_once():
    """``where(y > 0, y * s, y * s + c)``-like graphs: the fold stops where a non-affine op reads the run."""
    z = torch.randn(5, 8, dtype=torch.float64)
    lines: list[str] = []
    code = _lower("F.leaky_relu", [("tile", "acc"), ("const", 0.1)], {}, lines)
    got = _run_with(code, lines, {"acc": z})
    assert torch.allclose(got, F.leaky_relu(z, 0.1)) and "+" not in code, code


def _reads(code: str) -> str:
    """The names ``code`` reads, space-separated (so that the tile's can be counted)."""
    return " ".join(n.id for n in ast.walk(ast.parse(code, mode="eval")) if isinstance(n, ast.Name))


def _names(code: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(code, mode="eval")) if isinstance(n, ast.Name)}


def _binder(lines: list[str]):
    def bind(code, base):
        lines.append(f"{base}{len(lines)} = {code}")
        return f"{base}{len(lines) - 1}"
    return bind


def _run_with(code: str, lines: list[str], values: dict) -> torch.Tensor:
    env = {"tl": TL, "float": float, **values}
    for line in lines:
        name, expr = line.split(" = ", 1)
        env[name] = eval(expr, env)  # noqa: S307 - the lowering's own output, on this test's tensors
    return torch.as_tensor(eval(code, env), dtype=torch.float64)  # noqa: S307
