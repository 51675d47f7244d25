"""Problem loading: good specs load; each malformed spec gets one clear error naming file, line, key and fix."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES, ROOT
from xeforge.errors import SpecError
from xeforge.problem import eval_formula, load_problem

GOOD = """\
precision: strict
inputs:
  X: {shape: [M, K], dtype: float32}
inits:
  - dim: K
  - dim: N
ci:
  - params: [X]
    dims: {M: 8, K: 16, N: 4}
    flop: "2*M*N*K"
"""


def _problem(tmp_path: Path, spec: str) -> Path:
    d = tmp_path / "p"
    shutil.copytree(FIXTURES / "problems" / "vadd", d)
    (d / "spec.yaml").write_text(spec)
    return d


BROKEN = [
    # (what, spec text, key in message, fix fragment)
    ("missing inputs", GOOD.replace("inputs:\n  X: {shape: [M, K], dtype: float32}\n", ""), "inputs", "inputs"),
    ("wrong dtype", GOOD.replace("dtype: float32", "dtype: float33"), "inputs.X.dtype", "float16"),
    ("unknown dim in a shape", GOOD.replace("[M, K]", "[M, Q]"), "ci[0].dims", "Q"),
    ("bad flop formula", GOOD.replace('"2*M*N*K"', '"2*M*N*__import__(1)"'), "ci[0].flop", "arithmetic"),
    ("flop names an unknown dim", GOOD.replace('"2*M*N*K"', '"2*M*N*Z"'), "ci[0].flop", "arithmetic"),
    ("unknown top-level key", GOOD + "bogus: 1\n", "bogus", "variants named"),
    ("param not an input", GOOD.replace("params: [X]", "params: [Y]"), "ci[0].params[0]", "inputs"),
    ("bad precision", GOOD.replace("precision: strict", "precision: fast"), "precision", "strict"),
    ("no variant", GOOD.split("ci:")[0], "(top level)", "ci"),
    ("negative dim", GOOD.replace("M: 8", "M: -8"), "ci[0].dims.M", "non-negative integer"),
    ("yaml syntax", GOOD.replace("inputs:", "inputs: [", 1), "spec.yaml", "YAML"),
    ("init without dim or value", GOOD.replace("- dim: N", "- {}"), "inits[1]", "dim"),
    # the published format's constructs that stay refused, each with its fix
    ("float dim in a shape", GOOD.replace("M: 8", "M: 8.5"), "ci[0].dims.M", "a dim of its own"),
    ("integral float in a shape", GOOD.replace("M: 8", "M: 8.0"), "ci[0].dims.M", "(e.g. 8)"),
    ("numeric string in a shape", GOOD.replace("M: 8", "M: '1e-5'"), "inputs.X.shape[0]", "non-negative integer"),
    ("list dim in a shape", GOOD.replace("M: 8", "M: [8, 2]"), "ci[0].dims.M", "non-negative integer"),
    ("dim that is not a number", GOOD.replace("N: 4", "N: four"), "ci[0].dims.N", "1.0e-5"),
    ("boolean dim", GOOD.replace("N: 4", "N: true"), "ci[0].dims.N", "number"),
    ("infinite dim", GOOD.replace("N: 4", "N: .inf"), "ci[0].dims.N", "number"),
    ("keyword-style init", GOOD.replace("- dim: N", "- out_features: N"), "inits[1]", "'- dim: N'"),
    ("keyword-style init value", GOOD.replace("- dim: N", "- eps: '1e-6'"), "inits[1]", "'- value: 1.0e-06'"),
    ("ragged float in a shape", GOOD + "ragged:\n  - {M: 2.5}\n", "ragged[0].M", "integer"),
    ("ragged unknown dim", GOOD + "ragged:\n  - {Q: 3}\n", "ragged[0].Q", "dims"),
    ("default_variant names nothing", GOOD + "default_variant: bench-x\n", "default_variant", "ci"),
]


@pytest.mark.parametrize("what,text,key,fix", BROKEN, ids=[b[0] for b in BROKEN])
def test_malformed_spec_names_file_key_and_fix(tmp_path, what, text, key, fix):
    with pytest.raises(SpecError) as info:
        load_problem(_problem(tmp_path, text))
    err = info.value
    assert "spec.yaml" in err.where
    assert key in err.render(), err.render()
    assert fix in err.fix or fix in err.what, err.render()
    assert "Traceback" not in err.render()


def test_error_has_a_line_number(tmp_path):
    with pytest.raises(SpecError) as info:
        load_problem(_problem(tmp_path, GOOD.replace("dtype: float32", "dtype: float33")))
    assert "spec.yaml:3" in info.value.where


def test_cli_prints_one_paragraph_without_traceback(tmp_path):
    d = _problem(tmp_path, GOOD.replace("[M, K]", "[M, Q]"))
    proc = subprocess.run([sys.executable, "-m", "xeforge", "verify", str(d), "--device", "cpu"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: ") and "Traceback" not in proc.stderr
    assert "fix:" in proc.stderr and "'Q'" in proc.stderr


def test_good_spec_loads_variants_ragged_and_formulas(tmp_path):
    p = load_problem(_problem(tmp_path, GOOD))
    ci = p.variant("ci")
    assert ci.flop == 2 * 8 * 4 * 16
    assert p.init_args(ci) == [16, 4]
    ragged = p.ragged_variants(ci)
    assert ragged and all(r.ragged for r in ragged)
    assert any(r.dims["M"] == 17 for r in ragged)
    assert all(r.dims["M"] & (r.dims["M"] - 1) for r in ragged)  # never a power of two


def test_fixed_dims_are_not_made_ragged(tmp_path):
    p = load_problem(_problem(tmp_path, GOOD.replace("precision: strict", "precision: strict\nfixed: [K]")))
    assert all(r.dims["K"] == 16 for r in p.ragged_variants(p.variant("ci")))


def test_kernelbench_get_inputs_fallback(tmp_path):
    d = tmp_path / "kb"
    d.mkdir()
    shutil.copy(FIXTURES / "problems" / "vadd" / "kernel.py", d / "kernel.py")
    (d / "reference.py").write_text((FIXTURES / "problems" / "vadd" / "reference.py").read_text() + """
def get_inputs():
    return [torch.randn(100), torch.randn(100)]


def get_init_inputs():
    return []
""")
    p = load_problem(d)
    assert p.spec.from_kernelbench and p.variant("ci").dims == {"X0_0": 100, "X1_0": 100}
    assert p.ragged_variants(p.variant("ci")) == []
    assert any("get_inputs" in n for n in p.notes)


def test_missing_folder_is_a_clear_error(tmp_path):
    from xeforge.errors import ProblemError

    with pytest.raises(ProblemError) as info:
        load_problem(tmp_path / "nope")
    assert "kernels/" in info.value.fix


PUBLISHED = """\
default_variant: ci
inputs:
  X: {shape: [M, K], dtype: float32}
  IDX: {shape: [M], dtype: int64, range: [LOW, N]}
inits:
  - dim: K
  - dim: N
  - dim: SCALING_FACTOR
  - dim: BN_EPS
  - dim: EPS_PLAIN
  - dim: MIN_VALUE
  - dim: SCALE_SHAPE
ci:
  - params: [X, IDX]
    dims: {M: 8, K: 16, N: 4, LOW: -3, SCALING_FACTOR: 1.5, BN_EPS: '1e-5', EPS_PLAIN: 1e-6, MIN_VALUE: -1,
           SCALE_SHAPE: [4], SIXTY_FOUR: '64'}
    flop: "2*M*N*K*SCALING_FACTOR"
    bytes: "4*(M*K + SIXTY_FOUR)"
lowering:
  family: gemm
"""


def test_published_init_scalars_in_dims_reach_inits(tmp_path):
    """The published format writes init scalars as dims: numbers and strings that read as numbers reach Model's
    __init__ as numbers, formulas may use them, and only integer dims are made ragged."""
    p = load_problem(_problem(tmp_path, PUBLISHED))
    ci = p.variant("ci")
    args = p.init_args(ci)
    assert args == [16, 4, 1.5, 1e-5, 1e-6, -1, (4,)]
    assert [type(a) for a in args] == [int, int, float, float, float, int, tuple]  # '1e-5' read as a float
    assert ci.dims["SIXTY_FOUR"] == 64 and isinstance(ci.dims["SIXTY_FOUR"], int)
    assert ci.flop == 2 * 8 * 4 * 16 * 1.5 and ci.bytes == 4 * (8 * 16 + 64)
    from xeforge.problem import plan_inputs

    ragged = p.ragged_variants(ci)
    assert ragged and all(r.dims["SCALING_FACTOR"] == 1.5 and r.dims["BN_EPS"] == 1e-5 for r in ragged)
    for r in [ci, *ragged]:  # every shape the verifier would build is integers, the negative bound included
        plans = plan_inputs(p, r)
        assert all(isinstance(s, int) for tp in plans for s in tp.shape)
        assert plans[1].low == -3
    assert any("default_variant" in n for n in p.notes) and any("lowering" in n for n in p.notes)


def test_published_specs_beside_their_kernel_file_load(tmp_path):
    """The published layout: NAME.py with NAME.yaml beside it and no reference (the start is the oracle)."""
    from tests.conftest import FIXTURES as F

    for folder in sorted((F / "published").iterdir()):
        p = load_problem(folder)
        assert p.spec.variants and p.kernel_path.parent == folder
        assert p.has_reference == (folder / "reference.py").exists()


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 64))
def test_formula_evaluation_matches_python(m, n, k):
    dims = {"M": m, "N": n, "K": k}
    assert eval_formula("2*M*N*K + (M - N) // K", dims) == 2 * m * n * k + (m - n) // k
