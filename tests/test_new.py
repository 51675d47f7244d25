"""`xeforge new` makes a problem folder from a kernel file where it lives; `upstream` hands a port back as a patch
(issue 32, item 1). The kernel below is this test's own: a wrapper that sizes its block from the row, with an
early return, an assert and a `contiguous()`, the forms real files have."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from xeforge.cli import main
from xeforge.newproblem import NewRequest, build, write
from xeforge.problem import load_problem
from xeforge.upstream import marker, split_generated, write_patch

KERNEL = textwrap.dedent('''\
    """Row scale: y = x * s[row] + b (a test kernel)."""
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _row_scale(x_ptr, s_ptr, b_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(x_ptr + row * stride + cols, mask=m, other=0.0)
        s = tl.load(s_ptr + row)
        b = tl.load(b_ptr + cols, mask=m, other=0.0)
        tl.store(y_ptr + row * stride + cols, x * s + b, mask=m)


    def row_scale(x, s, b, inplace=False):
        assert x.shape[0] == s.shape[0], "one scale per row"
        if x.numel() == 0:
            return x
        x = x.contiguous()
        y = x if inplace else torch.empty_like(x)
        BLOCK = triton.next_power_of_2(x.shape[1])
        _row_scale[(x.shape[0],)](x, s, b, y, x.shape[1], x.stride(0), BLOCK=BLOCK, num_warps=4 if BLOCK <= 1024 else 8)
        return y


    def row_scale_ref(x, s, b, inplace=False):
        return x * s[:, None] + b
    ''')


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding the kernel under src/ops/ (the patch names it by that path)."""
    (tmp_path / "src" / "ops").mkdir(parents=True)
    (tmp_path / "src" / "ops" / "rowscale.py").write_text(KERNEL)
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "k"]):
        subprocess.run(["git", "-C", str(tmp_path), *cmd], check=True, capture_output=True)
    return tmp_path


def _new(repo: Path, *extra: str) -> list[str]:
    return ["new", str(repo / "src/ops/rowscale.py"), "--call", "row_scale(x, s, b)",
            "--input", "x=float16[4096,5120]", "--input", "s=float16[4096]", "--input", "b=float16[5120]",
            "-o", str(repo / "prob"), *extra]


def test_the_command_line_form_infers_shared_dims_and_keeps_the_file(repo, capsys):
    assert main(_new(repo, "--reference", str(repo / "src/ops/rowscale.py") + ":row_scale_ref", "--json")) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["dims"] == {"x_0": 4096, "x_1": 5120}
    spec = yaml.safe_load((repo / "prob" / "spec.yaml").read_text())
    assert spec["inputs"]["s"]["shape"] == ["x_0"] and spec["inputs"]["b"]["shape"] == ["x_1"]
    assert spec["ci"][0]["dims"] == {"x_0": 64, "x_1": 64} and spec["ci"][0]["dtype"] == "float32"
    assert spec["bench-decode"][0]["dims"]["x_0"] == 16 and spec["bench-odd"][0]["dims"]["x_0"] % 2 == 1
    kernel = (repo / "prob" / "kernel.py").read_text()
    assert kernel.startswith(KERNEL) and marker("src/ops/rowscale.py") in kernel
    assert "result = row_scale(x, s, b)" in kernel
    assert "result = row_scale_ref(x, s, b)" in (repo / "prob" / "reference.py").read_text()
    up = yaml.safe_load((repo / "prob" / "upstream.yaml").read_text())
    assert up["relpath"] == "src/ops/rowscale.py" and Path(up["repo_root"]) == repo.resolve()
    p = load_problem(repo / "prob")
    assert p.has_reference and [v.name for v in p.timed_variants("cuda")][0] == "bench-gpu"
    assert (repo / "src/ops/rowscale.py").read_text() == KERNEL  # the user's file is never touched


def test_the_yaml_form_writes_derived_values_in_place_outputs_and_returns(tmp_path):
    (tmp_path / "k.py").write_text(KERNEL)
    req = NewRequest.model_validate({
        "source": "k.py", "call": "row_scale(x, s, b, inplace=True)",
        "inputs": {"x": "float32[rows=300, cols=96]", "b": "float32[cols]"},
        "derived": {"s": "torch.arange(rows, device=x.device, dtype=x.dtype) / rows"},
        "outputs": ["x"], "returns": ["result", "x"], "bench": [{"rows": 7}], "fixed": ["cols"],
        "reference": "k.py:row_scale_ref"})
    np_ = build(req, tmp_path)
    assert set(np_.variants) == {"ci", "bench-gpu", "bench-gpu-1"}  # `bench` given: nothing suggested
    assert np_.variants["ci"] == {"rows": 300 % 64 + 64, "cols": 96}
    gen = split_generated(np_.files["kernel.py"])[1]
    assert "def __init__(self, rows):" in gen and "x = self._keep(x)" in gen and "return (result, x)" in gen
    # the harness's copy runs outside torch.compile's graph, so the reference's baseline pays for it as the kernel does
    assert "    @torch.compiler.disable\n    def _keep(t):" in gen
    assert "        rows = self.rows\n" in gen  # one dim read in forward: a plain assignment, not an unpacking
    spec = yaml.safe_load(np_.files["spec.yaml"])
    assert spec["inits"] == [{"dim": "rows"}] and spec["fixed"] == ["cols"]
    write(np_, tmp_path / "p")
    assert load_problem(tmp_path / "p").spec.inits == [("dim", "rows")]


def test_torch_compile_of_the_reference_does_not_fold_the_harness_copy(tmp_path):
    """fused_add_rmsnorm's start ran at 0.66-0.68x of torch.compile on an H100: four passes over the rows against
    six, the two of the harness's copy of `residual` among them, which torch.compile could fold into the
    reference's `residual.add_(x)`. The copy now runs before the compiled graph starts."""
    import importlib.util

    import torch
    import torch._dynamo

    from tests.realworld import problem_dir

    spec = importlib.util.spec_from_file_location("ref", problem_dir("fused_add_rmsnorm") / "reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    explained = torch._dynamo.explain(mod.Model())(x, r, w)
    code = "\n".join(g.code for g in explained.graphs)
    assert "add_" in code and "clone" not in code, code
    before = r.clone()
    out, r2 = torch.compile(mod.Model(), backend="eager")(x, r, w)
    assert torch.equal(r, before) and torch.allclose(r2, r + x)  # the caller's tensor untouched, the copy updated


@pytest.mark.parametrize("patch, where, says", [
    ({"bogus": 1}, "new.yaml:", "unknown key `bogus`"),
    ({"call": "row_scale(x, q, b)"}, "new.yaml: call", "uses q, which is not an input"),
    ({"call": "nothere(x, s, b)"}, "new.yaml: call", "nothere is not defined"),
    ({"inputs": {"x": "float32[rows, cols]", "s": "float32[rows]", "b": "float32[cols]"}}, "new.yaml: dims",
     "no size for cols, rows"),
    ({"inputs": {"x": "float33[4]", "s": "float32[4]", "b": "float32[4]"}}, "new.yaml: inputs.x", "unknown dtype"),
    ({"outputs": ["y"]}, "new.yaml: outputs", "y is not an input"),
    ({"reference": "k.py:nope"}, "new.yaml: reference", "defines no top-level nope"),
])
def test_a_malformed_request_names_the_file_the_key_and_the_fix(tmp_path, capsys, patch, where, says):
    (tmp_path / "k.py").write_text(KERNEL)
    base = {"source": "k.py", "call": "row_scale(x, s, b)",
            "inputs": {"x": "float32[64, 96]", "s": "float32[64]", "b": "float32[96]"}}
    (tmp_path / "new.yaml").write_text(yaml.safe_dump({**base, **patch}))
    assert main(["new", str(tmp_path / "new.yaml"), "-o", str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err
    assert where in err and says in err and "fix:" in err and "Traceback" not in err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("text, says", [
    (KERNEL + "\n\nclass Model:\n    pass\n", "defines a top-level `Model`"),
    ("from .common import helper\n" + KERNEL, "relative import"),
    (KERNEL + "\ndef broken(:\n", "is not valid Python"),
])
def test_a_file_that_cannot_run_alone_is_refused_with_its_line(tmp_path, capsys, text, says):
    (tmp_path / "k.py").write_text(text)
    assert main(["new", str(tmp_path / "k.py"), "--call", "row_scale(x, s, b)", "--input", "x=float32[64,96]",
                 "--input", "s=float32[64]", "--input", "b=float32[96]", "-o", str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err
    assert says in err and "k.py:" in err and "fix:" in err


def test_an_existing_folder_is_replaced_only_with_force(repo, capsys):
    assert main(_new(repo)) == 0
    assert main(_new(repo)) == 1 and "--force" in capsys.readouterr().err
    (repo / "prob" / "reference.py").write_text("stale")
    assert main(_new(repo, "--force")) == 0
    assert not (repo / "prob" / "reference.py").exists()  # no reference named now: the stale one is gone


def test_a_square_input_is_flagged_for_the_user_to_check(tmp_path, capsys):
    (tmp_path / "k.py").write_text(KERNEL)
    assert main(["new", str(tmp_path / "k.py"), "--call", "row_scale(x, s, b)", "--input", "x=float32[128,128]",
                 "--input", "s=float32[128]", "--input", "b=float32[128]", "-o", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "x has two axes of size 128, both taken as x_0" in out


def test_the_generated_problem_verifies_on_the_interpreter(repo, capsys):
    assert main(_new(repo, "--reference", str(repo / "src/ops/rowscale.py") + ":row_scale_ref")) == 0
    capsys.readouterr()
    assert main(["verify", str(repo / "prob"), "--device", "cpu", "--runs-dir", str(repo / "runs"), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["correct"], verdict


def test_the_patch_holds_the_users_edits_and_git_applies_it(repo, tmp_path):
    assert main(_new(repo)) == 0
    start = (repo / "prob" / "kernel.py").read_text()
    final = start.replace("num_warps=4 if BLOCK <= 1024 else 8", "num_warps=2 if BLOCK <= 1024 else 16")
    final = final.replace("result = row_scale(x, s, b)", "result = row_scale(x, s, b, inplace=False)")
    info = write_patch(repo / "prob", start, final, tmp_path / "final")
    patch = Path(info["path"]).read_text()
    assert patch.startswith("--- a/src/ops/rowscale.py\n+++ b/src/ops/rowscale.py")
    assert "+    _row_scale[(x.shape[0],)]" in patch and "inplace=False" not in patch  # the Model's edit is not the user's
    assert "inplace=False" in Path(info["model_diff"]).read_text() and any("model.diff" in n for n in info["notes"])
    subprocess.run(["git", "-C", str(repo), "apply", "--check", info["path"]], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(repo), "apply", info["path"]], check=True, capture_output=True)
    assert "num_warps=2 if BLOCK" in (repo / "src/ops/rowscale.py").read_text()


def test_the_patch_says_when_the_original_changed_since_new(repo, tmp_path):
    assert main(_new(repo)) == 0
    start = (repo / "prob" / "kernel.py").read_text()
    (repo / "src/ops/rowscale.py").write_text(KERNEL + "\n# edited later\n")
    info = write_patch(repo / "prob", start, start, tmp_path / "final")
    assert info["empty"] and any("changed since `xeforge new`" in n for n in info["notes"])


@pytest.mark.parametrize("tail", ["", "\n", "\n\n\n"])
def test_the_users_part_is_recovered_byte_for_byte(tail):
    user = KERNEL.rstrip("\n") + tail
    text = user + "\n\n" + marker("k.py") + "\nimport torch\n\n\nclass Model(torch.nn.Module):\n    pass\n"
    assert split_generated(text)[0] == user
    # a rewrite that dropped the marker: the top-level Model is still the generated part
    head, gen = split_generated(user + "\n\nclass Model(torch.nn.Module):\n    pass\n")
    assert gen.startswith("class Model") and "class Model" not in head


DOT_KERNEL = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _mm(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b), mask=(rm[:, None] < M) & (rn[None, :] < N))


    def mm(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=torch.float32)
        _mm[(triton.cdiv(M, 16), triton.cdiv(N, 16))](a, b, c, M, N, K, BM=16, BN=16, BK=triton.next_power_of_2(K))
        return c
    ''')


@pytest.mark.parametrize("dot, precision", [("tl.dot(a, b)", "tf32"), ('tl.dot(a, b, input_precision="ieee")', None),
                                            ("tl.dot(a, b, allow_tf32=False)", None)])
def test_a_float32_dot_that_runs_as_tf32_on_nvidia_makes_the_precision_tf32(tmp_path, dot, precision):
    (tmp_path / "k.py").write_text(DOT_KERNEL.replace("tl.dot(a, b)", dot))
    req = NewRequest.model_validate({"source": "k.py", "call": "mm(a, b)", "ci_dtype": "float32",
                                     "inputs": {"a": "bfloat16[M=64, K=32]", "b": "bfloat16[K, N=48]"}})
    np_ = build(req, tmp_path)
    assert yaml.safe_load(np_.files["spec.yaml"]).get("precision") == precision
    assert any("precision: tf32" in line for line in np_.inferred) == (precision == "tf32")
    # what the user writes wins
    req = req.model_copy(update={"precision": "strict"})
    assert yaml.safe_load(build(req, tmp_path).files["spec.yaml"])["precision"] == "strict"


def test_tolerances_follow_the_floating_inputs_and_tf32_only_on_a_gpu(tmp_path):
    """An int64 index tensor listed first does not make a bf16 variant an fp32 one; a `precision: tf32` problem's
    float32 variants get TF32's tolerance on a GPU and keep fp32's on the interpreter."""
    import dataclasses

    from xeforge.devices import describe
    from xeforge.settings import Settings
    from xeforge.verifier import Verifier

    (tmp_path / "k.py").write_text(DOT_KERNEL + "\n\ndef mm_idx(idx, a, b):\n    return mm(a, b)\n")
    req = NewRequest.model_validate({"source": "k.py", "call": "mm_idx(idx, a, b)", "ci_dtype": "float32",
                                     "inputs": {"idx": "int64[M=64]", "a": "bfloat16[M, K=32]",
                                                "b": "bfloat16[K, N=48]"}})
    write(build(req, tmp_path), tmp_path / "p")
    p = load_problem(tmp_path / "p")
    assert p.spec.precision == "tf32"
    s = Settings()
    cpu = describe("cpu")
    gpu = dataclasses.replace(cpu, kind="cuda", interpreter=False)
    tol = {d.kind: Verifier(p, d, s, tmp_path / d.kind)._tolerances for d in (cpu, gpu)}
    assert tol["cpu"](p.spec.variants["bench-gpu"]) == (s.half_tol, s.half_tol)  # bf16, not idx's int64
    assert tol["cpu"](p.spec.variants["ci"]) == (s.fp32_tol, s.fp32_tol)
    assert tol["cuda"](p.spec.variants["ci"]) == (s.tf32_tol, s.tf32_tol)
