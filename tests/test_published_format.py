"""The published format and kernels as they come (issue 14, item 4), through the real cascade on the interpreter.

Fixtures in ``tests/fixtures/published/``, one problem each: init scalars in ``dims`` (``scalar_dims``); a start
that moves and casts its parameters on the first call, against a reference (``moves_params``) and as its own oracle
(``self_moves_params``); starts with no reference that up-cast fp16 tiles before ``tl.dot`` (``self_upcast``),
hard-code their dtypes (``self_fixed_dtype``), keep state outside the state_dict (``self_init_state``: a packed
W^T and a non-persistent buffer drawn in ``__init__``; before the candidate Model was built from the oracle's seed
it differed from itself in ~80% of elements) and autotune over several configs (``self_autotune``). Every start
must pass against its oracle; the weight checks must still refuse a changed weight.

One module fixture starts every verifier at once (each is two worker processes, ~10 s to start on 2 cores), so the
file runs in well under a minute; one round per start, no ragged shapes (the fixtures' point is the start against
its oracle, not the ragged check, which ``tests/test_verifier_cheats.py`` covers).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io

import pytest

from tests.conftest import FIXTURES
from xeforge.devices import describe
from xeforge.problem import Code, load_problem
from xeforge.settings import Settings
from xeforge.verifier import Verifier

PUBLISHED = FIXTURES / "published"
SELF_ORACLE = ["self_upcast", "self_fixed_dtype", "self_moves_params", "self_init_state", "self_autotune"]
SETTINGS = Settings(compile_timeout_s=120.0, run_timeout_s=60.0, correctness_rounds=1, ragged_shapes=False)
MOVES = (PUBLISHED / "moves_params" / "kernel.py").read_text()
PINNED = "@triton.autotune of gemm_bias_kernel pinned to its first config on the CPU interpreter (3 configs)"


def _candidate(find: str, replace: str) -> Code:
    assert find in MOVES, find
    return Code(MOVES.replace(find, replace), "kernel.py")


# candidates of moves_params that do to the weights what the checks exist to refuse
CHANGES_VALUES = _candidate(  # the first call rounds the weights through bfloat16: not a cast, new values
    "self.weight.data = self.weight.data.to(x.device, x.dtype).contiguous()",
    "self.weight.data = self.weight.data.to(torch.bfloat16).to(x.device, x.dtype).contiguous()")
CONVERTS_LATER = _candidate(  # every call after the first casts the bias again: a conversion only the first may make
    "    def forward(self, x):\n        self._move_params_once(x)\n",
    "    def forward(self, x):\n        if self._moved:\n            with torch.no_grad():\n"
    "                self.bias.data = self.bias.data.to(torch.float32 if self.bias.dtype == torch.float16 "
    "else torch.float16)\n        self._move_params_once(x)\n")
NEEDS_XPU = _candidate(  # a published start's device check, on the CPU
    "    def forward(self, x):\n",
    "    def forward(self, x):\n        if not (hasattr(torch, 'xpu') and torch.xpu.is_available()):\n"
    "            raise RuntimeError('XPU device is not available')\n")


def _verify_start(name: str, tmp, rounds: int = 1) -> tuple[Verifier, object]:
    p = load_problem(PUBLISHED / name)
    v = Verifier(p, describe("cpu"), SETTINGS.replace(correctness_rounds=rounds), tmp / name)
    return v, v.verify(p.kernel_path)


def _moves_params(tmp) -> dict:
    """The start that moves its parameters once, then three candidates of it, in one verifier (two rounds: the
    second round's call is a later call of the slot)."""
    v, start = _verify_start("moves_params", tmp, rounds=2)
    try:
        return {"start": start, **{name: v.correctness(code) for name, code in
                                   (("changes", CHANGES_VALUES), ("later", CONVERTS_LATER), ("xpu", NEEDS_XPU))}}
    finally:
        v.close()


def _start(name: str, tmp):
    v, verdict = _verify_start(name, tmp)
    v.close()
    return verdict


def _cli(tmp) -> tuple[int, str]:
    """``xeforge verify`` on the autotuned start: (exit status, what it printed on stdout, which a user reads).

    In this process (its settings from XEFORGE_ROUNDS / XEFORGE_RAGGED, set by the fixture): a process of its own
    would import torch once more, on a machine whose two cores start fourteen workers for this file.
    """
    from xeforge.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # nothing else in this process prints to stdout meanwhile
        rc = main(["verify", str(PUBLISHED / "self_autotune"), "--device", "cpu", "--runs-dir", str(tmp / "cli-runs")])
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("published")
    with pytest.MonkeyPatch.context() as mp, concurrent.futures.ThreadPoolExecutor(8) as pool:
        mp.setenv("XEFORGE_ROUNDS", "1")
        mp.setenv("XEFORGE_RAGGED", "false")
        jobs = {name: pool.submit(_start, name, tmp) for name in [*SELF_ORACLE, "scalar_dims"] if name != "self_autotune"}
        jobs["moves_params"] = pool.submit(_moves_params, tmp)
        jobs["cli"] = pool.submit(_cli, tmp)  # self_autotune, verified by the command
        return {name: job.result() for name, job in jobs.items()}


def _gate(verdict, name: str):
    return next(g for g in verdict.gates if g.gate == name)


@pytest.mark.parametrize("name", SELF_ORACLE)
def test_a_start_that_is_its_own_oracle_passes_against_itself(results, name):
    if name == "self_autotune":
        rc, stdout = results["cli"]
        assert rc == 0 and "VERIFIED CORRECT" in stdout, stdout
        assert "matches the starting kernel (no reference.py)" in stdout
        return
    verdict = results[name]
    assert verdict.correct, f"{name}: {verdict.feedback()}"
    g2 = _gate(verdict, "2-correctness")
    assert g2.details["oracle"] == "starting kernel (no reference.py)"


def test_init_scalars_in_dims_reach_the_model(results):
    """SCALING_FACTOR: 1.5 and BN_EPS: '1e-5' are the Model's scale and BatchNorm epsilon, checked in float64."""
    verdict = results["scalar_dims"]
    assert verdict.correct, verdict.feedback()
    assert _gate(verdict, "2-correctness").details["oracle"] == "float64 PyTorch reference"


def test_a_start_that_moves_its_parameters_once_verifies_and_says_so(results):
    verdict = results["moves_params"]["start"]
    assert verdict.correct, verdict.feedback()
    g2 = _gate(verdict, "2-correctness")
    assert "the first call converted parameters weight (float32 -> float16), bias (float32 -> float16)" in g2.summary
    # the self-oracle start that casts the other way says it too
    assert "weight (float16 -> float32)" in _gate(results["self_moves_params"], "2-correctness").summary


def test_a_changed_weight_is_still_refused(results):
    """A first call that moves the weights may not change their values; a later call may not even cast them."""
    for key, name in (("changes", "weight"), ("later", "bias")):
        g0, g2 = results["moves_params"][key]
        assert g0.passed and g2 is not None and g2.status == "fail", (key, g0.summary)
        assert f"changed model weights {name} during forward" in g2.summary, (key, g2.summary)


def test_a_hard_coded_device_names_the_line_and_the_fix(results):
    g0, g2 = results["moves_params"]["xpu"]
    assert g0.status == "fail" and g2 is None
    assert "RuntimeError: XPU device is not available" in g0.summary
    assert "(at kernel.py:" in g0.summary and "raise RuntimeError('XPU device is not available')" in g0.summary
    assert "device=x.device" in g0.details["fix"] and "--device xpu" in g0.details["fix"]


def test_an_autotuned_start_is_pinned_and_the_verdict_says_so(results):
    """``xeforge verify`` prints the verdict's gate summaries: gate 2's says the autotuner was pinned."""
    rc, stdout = results["cli"]
    assert rc == 0, stdout
    g2 = next(line for line in stdout.splitlines() if line.startswith("gate 2-correctness"))
    assert "PASS" in g2 and PINNED in g2, g2
    # a start without @triton.autotune says nothing of the kind
    assert "autotune" not in _gate(results["self_upcast"], "2-correctness").summary


@pytest.mark.parametrize("detail,line,kind,fixed", [
    ("AssertionError: ", 'assert x.device.type == "xpu"', "cpu", True),  # a bare assert: the line says it
    ("AssertionError: Torch not compiled with XPU enabled", "y = torch.empty((M, N), device='xpu')", "cpu", True),
    ("RuntimeError: XPU is not available", "raise RuntimeError('XPU is not available')", "cuda", True),
    ("AssertionError: Torch not compiled with CUDA enabled", "torch.cuda.synchronize()", "cpu", True),
    ("RuntimeError: XPU is not available", "raise RuntimeError('XPU is not available')", "xpu", False),  # it has one
    ("ZeroDivisionError: division by zero", "n = 1 // 0", "cpu", False),
    ("ValueError: bad xpu config", "cfg = parse(xpu_config)", "cpu", False),  # names xpu, hard-codes nothing
])
def test_a_hard_coded_device_fix_is_given_only_for_a_device_this_run_lacks(detail, line, kind, fixed):
    from xeforge.verifier import _device_fix

    fix = _device_fix(detail, line, kind)
    assert bool(fix) == fixed, fix
    if fixed:
        assert "device=x.device" in fix and "--device" in fix


def test_weight_changes_tells_a_conversion_from_a_change():
    import torch

    from xeforge.integrity import weight_changes

    w = torch.randn(4, 3)
    before = {"w": w, "b": torch.randn(3), "n": torch.tensor(3)}
    cast = {"w": w.half(), "b": before["b"], "n": before["n"]}
    assert weight_changes(before, cast, first_call=True) == ([], {"w": "float32 -> float16"})
    assert weight_changes(before, cast, first_call=False) == (["w"], {})  # only a first call may convert
    rounded = {**cast, "w": w.bfloat16().half()}  # a cast of other values
    assert weight_changes(before, rounded, first_call=True) == (["w"], {})
    assert weight_changes(before, {**cast, "w": w.t().contiguous().half()}, True)[0] == ["w"]  # a new shape
    assert weight_changes(before, {"w": w, "n": before["n"]}, True) == (["b"], {})  # removed
    assert weight_changes(before, {**before, "extra": torch.ones(1)}, False) == ([], {})  # added: a cache of its own
