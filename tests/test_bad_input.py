"""Bad input never crashes or hangs the tool: specs, kernel and KB files, formulas, CLI arguments, settings.

Each case gets a clear error that names the file (and line, where there is one) and a fix — never a traceback —
within a bound time. Property-based cases (hypothesis, bounded examples) throw arbitrary text and structures at
the spec and YAML loaders: the only exceptions allowed out are the tool's own.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.conftest import FIXTURES, ROOT
from xeforge.errors import ProblemError, SpecError, XeforgeError
from xeforge.kb.yamlio import YamlSyntaxError, parse_yaml
from xeforge.problem import _SpecReader, eval_formula, load_problem

SPEC = (FIXTURES / "problems" / "vadd" / "spec.yaml").read_text()
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def _read(text: str):
    return _SpecReader(FIXTURES / "spec.yaml", text).read()


def test_a_yaml_bomb_is_refused_before_it_grows():
    t0 = time.monotonic()
    with pytest.raises(YamlSyntaxError, match="expands to more than"):
        parse_yaml(BOMB)
    with pytest.raises(SpecError, match="expands to more than"):
        _read(SPEC + BOMB)
    assert time.monotonic() - t0 < 5


def test_deep_nesting_and_duplicate_keys_are_named_with_their_line():
    with pytest.raises(SpecError, match="nested deeper than") as info:
        _read(SPEC + "deep: " + "[" * 500 + "]" * 500 + "\n")
    assert ":" in info.value.where and info.value.fix
    with pytest.raises(SpecError, match="written twice") as info:
        _read(SPEC.replace("kind: elementwise\n", "kind: elementwise\nkind: gemm\n"))
    assert info.value.where.endswith(":2")


@pytest.mark.parametrize("formula", ["9**9**9", "10**(10**10)", "(N+1)/0", "N" + "*N" * 2000])
def test_formulas_are_bounded(formula):
    t0 = time.monotonic()
    with pytest.raises(SpecError, match="cannot be evaluated"):
        _read(SPEC.replace('flop: "N"', f'flop: "{formula}"', 1))
    assert time.monotonic() - t0 < 2
    assert eval_formula("2*N*N", {"N": 1024}) == 2 * 1024 * 1024


def _folder(tmp_path, **files):
    root = tmp_path / "p"
    shutil.copytree(FIXTURES / "problems" / "vadd", root)
    for name, data in files.items():
        path = root / name.replace("_", ".")
        if data is None:
            path.unlink()
            path.mkdir()
        else:
            path.write_bytes(data)
    return root


@pytest.mark.parametrize("files,text", [
    ({"spec_yaml": b"\x00\x01binary"}, "NUL bytes"),
    ({"spec_yaml": b"kind: \xff\xfe\n"}, "not valid UTF-8 (byte 6, line 1)"),
    ({"kernel_py": b"\xc3\x28 = 1\n"}, "not valid UTF-8"),
    ({"reference_py": b"x = '\xe9'\n"}, "not valid UTF-8"),
    ({"spec_yaml": None}, "is a folder, not a file"),
    ({"spec_yaml": b"a: 1\n" + b"#" * (5 << 20)}, "larger than 4 MiB"),
], ids=["binary-spec", "utf8-spec", "utf8-kernel", "utf8-reference", "spec-folder", "huge-spec"])
def test_unreadable_problem_files_are_named(tmp_path, files, text):
    root = _folder(tmp_path, **files)
    with pytest.raises(ProblemError) as info:
        load_problem(root)
    assert text in info.value.what and info.value.fix and str(root) in info.value.where


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "xeforge", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, **(env or {})})


def test_cli_arguments_and_settings_are_checked(tmp_path):
    vadd = str(FIXTURES / "problems" / "vadd")
    cases = [
        ((vadd, "--budget", "-1", "--dry-run"), None, 2, "not >= 1"),
        ((vadd, "--budget", "0", "--dry-run"), None, 2, "not >= 1"),
        ((vadd, "--device", "tpu", "--dry-run"), None, 2, "invalid choice: 'tpu'"),
        ((vadd, "--device", "cpu", "--run-dir", str(FIXTURES / "problems" / "vadd" / "spec.yaml")), None, 1,
         "is a file, not a folder"),
        ((vadd, "--device", "cpu"), {"XEFORGE_RUN_TIMEOUT": "-5"}, 1, "out of range"),
        ((vadd, "--device", "cpu"), {"XEFORGE_SANDBOX": "maybe"}, 1, "not one of auto, require, off"),
    ]
    for args, env, code, text in cases:
        proc = _cli("port", *args, env=env)
        assert proc.returncode == code and text in proc.stderr, (args, proc.returncode, proc.stderr[-500:])
        assert "Traceback" not in proc.stderr
    proc = _cli("verify", vadd, "--device", "cpu", "--candidate", str(tmp_path))
    assert proc.returncode == 1 and "is a folder, not a kernel file" in proc.stderr and "Traceback" not in proc.stderr


def test_a_read_only_runs_folder_is_an_error_with_the_fix(tmp_path):
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user whom file permissions do not bind (root): a read-only folder is writable")
        proc = _cli("port", str(FIXTURES / "problems" / "vadd"), "--device", "cpu", "--runs-dir", str(ro))
        assert proc.returncode == 1 and "cannot write the run folder" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        ro.chmod(0o700)


# -------------------------------------------------------------------------------------------- properties
_yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["inputs", "inits", "ci", "bench-gpu", "precision", "ragged", "kind", "x"]),
                       _yaml_values, max_size=5))
def test_any_spec_structure_loads_or_gives_a_spec_error(data):
    try:
        _read(yaml.safe_dump(data))
    except XeforgeError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_or_gives_a_yaml_error(text):
    try:
        parse_yaml(text)
    except YamlSyntaxError:
        pass


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="0123456789+-*/()%NM. ", max_size=60))
def test_any_formula_evaluates_or_is_refused(expr):
    try:
        eval_formula(expr, {"N": 7, "M": 3})
    except (ValueError, SyntaxError, ZeroDivisionError, TypeError, OverflowError, RecursionError):
        pass
