"""Shared fixtures: paths, CPU-interpreter settings, and run-time skips for hardware tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def gpu_kind() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.cuda.is_available():
        return "cuda"
    return None


def skip_without_gpu():
    """Skip at run time, with the reason, when no CUDA/XPU device is present."""
    kind = gpu_kind()
    if kind is None:
        pytest.skip("needs a CUDA or XPU GPU: timing on the CPU interpreter measures nothing (run on the H200)")
    return kind


@pytest.fixture
def fast_settings():
    from xeforge.settings import Settings

    return Settings(compile_timeout_s=60.0, run_timeout_s=30.0, correctness_rounds=5)


@pytest.fixture(autouse=True)
def _no_llm_env(monkeypatch):
    for var in ("XEFORGE_MODEL", "OPENAI_API_KEY", "OPENAI_API_BASE", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    yield


@pytest.fixture
def repo_root() -> Path:
    return ROOT


os.environ.setdefault("XEFORGE_TEST", "1")


def tactic_context(p, source=None, kind="cpu", target=None, cores=20, triton=None, run_dir=None):
    """A StageContext for a tactic test: the problem, a source, a device (the interpreter or a stand-in GPU) and
    the knowledge base as the pipeline would select it."""
    from stages.base import StageContext
    from xeforge.devices import DeviceInfo, describe
    from xeforge.pipeline import kb_context
    from xeforge.settings import Settings

    device = describe("cpu") if kind == "cpu" else DeviceInfo(kind, f"test {kind}", cores=cores, interpreter=False)
    kbc = kb_context(device, target, triton)
    src = p.kernel_source if source is None else source
    return StageContext(p, src, p.kernel_source, device, kbc.device_id, kbc.kb, kbc.triton, Settings(),
                        run_dir=run_dir)


#: verifiers the ``verify`` fixture keeps open at once (each holds a candidate and an oracle worker process)
KEPT_VERIFIERS = 4


@pytest.fixture(scope="session")
def verify(tmp_path_factory):
    """verify(problem, source) -> Verdict through the real cascade (KB constraints at gate 1). One verifier per
    starting file, kept for the test process (each xdist worker its own) while it is one of the
    :data:`KEPT_VERIFIERS` used last: the tests of several modules on one problem share its workers and its oracle.
    One round per correctness shape (ci and the ragged ones, normal inputs, run twice for stability): a rewrite is
    checked at every shape it must serve; the rounds over the other input distributions are the verifier's own
    tests' (tests/test_verifier*.py)."""
    from collections import OrderedDict

    from xeforge.devices import describe
    from xeforge.pipeline import constraint_hook, kb_context
    from xeforge.settings import Settings
    from xeforge.verifier import Verifier

    made: OrderedDict = OrderedDict()
    kbc = kb_context(describe("cpu"))
    hooks = [h for h in [constraint_hook(kbc)] if h]
    settings = Settings(compile_timeout_s=60.0, run_timeout_s=30.0, correctness_rounds=1)

    def run(p, source: str):
        key = str(p.kernel_path)  # one verifier per start: a style of the corpus is judged against its own file
        if key not in made:
            made[key] = Verifier(p, describe("cpu"), settings, tmp_path_factory.mktemp(p.name), hooks, kbc.entry)
            while len(made) > KEPT_VERIFIERS:
                made.popitem(last=False)[1].close()
        made.move_to_end(key)
        path = tmp_path_factory.mktemp("cand") / "kernel.py"
        path.write_text(source)
        return made[key].verify(path, p.kernel_path)

    yield run
    for v in made.values():
        v.close()


def run_rules_stage(ctx, candidates, compiles, failure: str | None = None):
    """The rules engine's ``run_stage`` over one test tactic that proposes ``candidates``; a candidate whose
    source ``compiles(source)`` rejects fails gate 0 with ``failure`` (default: the H200's shared-memory message
    ``SMEM_OVER_TEXT``), the others pass. Returns the tactic's record and every candidate evaluated, in order."""
    failure = failure or SMEM_OVER_TEXT
    from stages.base import Applicability, Stage, Tactic, TrialOutcome
    from xeforge.engines import RulesEngine
    from xeforge.verifier import GateResult, Verdict

    class Propose(Tactic):
        name = "fixed"

        def check(self, ctx):
            return Applicability(True, "test")

        def propose(self, ctx):
            return list(candidates)

    seen = []

    def evaluate(c):
        seen.append(c)
        if not compiles(c.source):
            v = Verdict("h", [GateResult("0-isolation", "fail", failure, {"kind": "exception", "detail": failure})])
        else:
            v = Verdict("h", [GateResult("0-isolation", "pass", "ok"), GateResult("2-correctness", "pass", "ok")],
                        correct=True, accepted=True)
        return TrialOutcome(f"{len(seen):04d}", c, v)

    stage = Stage("device_tuning", 7, "test", (), tactics=[Propose()])
    rec, = RulesEngine().run_stage(stage, ctx, evaluate, lambda outs: next((o for o in outs if o.verdict.correct), None))
    return rec, seen


#: the H200's figure for a 128x256x64 tile with an fp32 C tile staged at 3 stages: 147456 B of stages + 131072 B
SMEM_OVER_TEXT = ("variant ci@bfloat16: raised: OutOfResources: out of resource: shared memory, Required: 278552, "
                  "Hardware limit: 232448. Reducing block sizes or `num_stages` may help.")


def sm90_compiler():
    """(GPUTarget, ASTSource) to compile a kernel for sm_90 on this host (no GPU: ptxas ships with Triton's wheel),
    or the test is skipped with the reason. Load the kernel's file with :func:`load_kernel_module`."""
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 makes @triton.jit build interpreter functions; compiling needs JIT ones")
    try:
        from triton.backends import backends
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:
        pytest.skip(f"this Triton cannot compile ahead of time: {exc}")
    if "nvidia" not in backends:
        pytest.skip("the installed Triton has no NVIDIA backend to compile for sm_90")
    return GPUTarget, ASTSource


def load_kernel_module(path, source: str, name: str):
    """``source`` written to ``path`` and imported as module ``name`` (its @triton.jit functions are JIT ones)."""
    import importlib.util

    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def problem_folder(path, kernel: str, reference: str, spec: str):
    """A problem folder at ``path`` (made) from the three files' texts, loaded."""
    from xeforge.problem import load_problem

    path.mkdir(parents=True, exist_ok=True)
    for name, text in (("kernel.py", kernel), ("reference.py", reference), ("spec.yaml", spec)):
        (path / name).write_text(text)
    return load_problem(path)
