"""Compile the llm engine's prompts with a DSPy optimizer, the verifier as the metric (optional; see docs/llm.md,
"Compiling the prompts with a DSPy optimizer").

For each problem folder: the stage's brief as ``xeforge port`` would send it (``cover_agent.prompts``), and a
verifier of that problem on the device (``xeforge.verifier``). ``cover_agent.optimize.compile_cover`` runs the
CoVeR module over them with ``dspy.BootstrapFewShot``: the answers the verifier passes become demos. The compiled
module is saved as JSON (demos and instructions per predictor). Nothing here says the compiled prompts are
better; compare runs of the suite to find out.

Usage (repo root, a model configured as for ``xeforge port``: XEFORGE_MODEL, OPENAI_API_BASE, ...):
    python3 scripts/compile_prompts.py kernels/gemm_swish kernels/softmax --stage memory_access \
        --device cpu --out runs/compiled-memory_access.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import stages
from cover_agent.client import build_lm
from cover_agent.config import LMConfig
from cover_agent.engine import kb_view
from cover_agent.optimize import MetricLog, Problem, compile_cover, make_trainset
from cover_agent.prompts import render_stage
from xeforge.devices import describe
from xeforge.pipeline import Pipeline, PortOptions, constraint_hook, kb_context
from xeforge.problem import load_problem
from xeforge.settings import Settings
from xeforge.verifier import Verifier


def trainset_for(folders: list[Path], stage_name: str, device: Any, kbc: Any,
                 settings: Settings) -> tuple[list[Any], dict[str, Any]]:
    """One example per problem folder (the stage's brief as ``xeforge port`` renders it), and the loaded
    problems by example name."""
    stage = stages.BY_NAME[stage_name]
    items, loaded = [], {}
    for i, folder in enumerate(folders):
        problem = load_problem(folder)
        ctx = Pipeline(problem, PortOptions(device=device.kind, engine="rules", settings=settings)).context(
            device, kbc, problem.kernel_source)
        rendered = render_stage(stage, ctx, stage.detect(ctx), kb_view(ctx), [])
        key = Problem(f"{i:02d}-{Path(folder).name}", problem.kernel_source, device.can_time)
        loaded[key.name] = problem
        items.append((key, rendered.text, rendered.signature))
    return make_trainset(items), loaded


def verify_with(verifiers: dict[str, Verifier], workdir: Path) -> Callable[[Problem, str], Any]:
    """``verify_code(problem, code) -> Verdict``: the problem's verifier on the code (correctness; no timing)."""

    def verify_code(problem: Problem, code: str) -> Any:
        path = workdir / problem.name / f"candidate-{hashlib.sha256(code.encode()).hexdigest()[:12]}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
        return verifiers[problem.name].verify(path, None, time_it=False)

    return verify_code


def main(argv: list[str] | None = None, lm: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--stage", default="memory_access", choices=sorted(stages.BY_NAME))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=2, help="CoVeR rounds per example")
    parser.add_argument("--max-demos", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="where the compiled module's JSON goes")
    args = parser.parse_args(argv)
    if lm is None:
        config = LMConfig.from_args(argparse.Namespace(model=None, api_base=None, max_iters=None, best_k=None))
        if not config.configured:
            print("Error: no model configured: set XEFORGE_MODEL (see docs/llm.md)", file=sys.stderr)
            return 1
        lm = build_lm(config)
    log = MetricLog()
    device, settings = describe(args.device), Settings()
    kbc = kb_context(device)
    hooks = [h for h in [constraint_hook(kbc)] if h]
    trainset, problems = trainset_for(args.folders, args.stage, device, kbc, settings)
    with tempfile.TemporaryDirectory(prefix="xeforge-compile-") as tmp, contextlib.ExitStack() as stack:
        verifiers = {name: stack.enter_context(Verifier(problem, device, settings, Path(tmp) / name, hooks, kbc.entry))
                     for name, problem in problems.items()}
        compiled = compile_cover(trainset, verify_with(verifiers, Path(tmp)), lm, rounds=args.rounds,
                                 max_demos=args.max_demos, log=log)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    compiled.save(str(args.out))
    demos = {name: len(p.demos) for name, p in compiled.named_predictors()}
    print(f"verdicts: {log.scores}; demos per predictor: {demos}; saved to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
