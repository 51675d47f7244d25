"""Property test of epilogue graphs (issue 33): random elementwise graphs over a GEMM's output — values reused,
residuals through ``clone()``, ``torch.where`` on a comparison, ops torch decomposes (hardswish, elu, ...), Python
scalars (literals and the Model's own), a per-column parameter whose shape only the trace knows, the layer's input,
and several outputs — are fused into the
GEMM's epilogue by fuse-epilogue and verified against their PyTorch reference through the real verifier on the
interpreter. Bounded and derandomized, so CI sees the same graphs on every run; the GEMM, its wrapper and the
Model are test_fusion_graph's."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from stages import fusion
from tests.conftest import tactic_context
from tests.test_fusion_graph import _problem

UNARY = ["torch.relu({a})", "torch.sigmoid({a})", "torch.tanh({a})", "F.gelu({a})", "F.silu({a})",
         "F.leaky_relu({a}, 0.1)", "torch.clamp({a}, -1.0, 1.0)", "torch.abs({a})", "{a} * {a}", "-{a}",
         # lowered from torch's decompositions, as every op
         "F.hardswish({a})", "F.elu({a}, 0.5)", "F.softsign({a})"]
BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.maximum({a}, {b})", "torch.where({a} > 0, {a}, {b})",
          "torch.where({a} > {b}, {b}, {a} * 0.5)"]
OPERAND = ["{a} * {s}", "{a} + {s}", "{a} + self.bias2", "{a} * self.bias2", "x + {a}", "{a} - x * {s}",
           # the Model's Python scalar, passed to the kernel at run time (torch's decomposition traced around it)
           "F.leaky_relu({a}, self.slope)", "F.hardtanh({a}, -self.slope, self.slope)"]


@st.composite
def graphs(draw) -> str:
    """forward's lines after ``y = linear(...)``: each a new value from earlier ones; the return reads one or two."""
    values, lines = ["y"], []
    for i in range(draw(st.integers(2, 5))):
        kind = draw(st.sampled_from(["unary", "binary", "operand", "clone"]))
        a = draw(st.sampled_from(values))
        if kind == "clone":
            expr = f"{a}.clone()"
        elif kind == "unary":
            expr = draw(st.sampled_from(UNARY)).format(a=a)
        elif kind == "binary":
            expr = draw(st.sampled_from(BINARY)).format(a=a, b=draw(st.sampled_from(values)))
        else:
            s = draw(st.sampled_from(["0.5", "2.0", "-1.5"]))
            expr = draw(st.sampled_from(OPERAND)).format(a=a, s=s)
        lines.append(f"v{i} = {expr}")
        values.append(f"v{i}")
    last, other = values[-1], draw(st.sampled_from(values))
    if other == last:
        lines.append(f"return {last}")
    elif draw(st.booleans()):
        lines.append(f"return {last} + {other}")
    else:
        lines.append(f"return {last}, {other}")  # several outputs: the kernel stores each
    return "\n".join(lines)


@pytest.mark.slow  # 12 graphs, a trace and the verifier each (about 10 s a graph on the interpreter)
@settings(max_examples=12, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=graphs())
def test_a_random_epilogue_graph_fuses_and_verifies(body, tmp_path_factory, verify):
    p = _problem(tmp_path_factory.mktemp("graph"), body)
    ctx = tactic_context(p)
    tactic = next(t for t in fusion.STAGE.tactics if t.name == "fuse-epilogue")
    app = tactic.check(ctx)
    assert app.applies, f"{body}\n-> {app.reason}"
    src = tactic.propose(ctx)[0].source
    fwd = src[src.index("def forward"):]
    assert not any(op in fwd for op in ("torch.relu", "torch.sigmoid", "torch.where", "F.gelu", "self.bias2 ")), fwd
    verdict = verify(p, src)
    assert verdict.correct, f"{body}\n{verdict.feedback()}"
