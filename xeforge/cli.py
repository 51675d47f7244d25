"""The ``xeforge`` command line: sub-commands dispatch through ``set_defaults(func=...)``.

Owns: argument parsing and output policy — data to stdout (``--json`` for machines), progress to stderr,
``Error: ...`` with the fix and exit 1 for every :class:`XeforgeError`, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from xeforge import __version__, devices, sandbox
from xeforge.bench import register as register_bench
from xeforge.cli_args import add_check_lanes, add_llm_args, add_time_budget, positive_int
from xeforge.errors import DeviceError, UsageError, XeforgeError
from xeforge.kb.cli import register as register_kb
from xeforge.newproblem import register as register_new
from xeforge.problem import load_problem
from xeforge.report import rerender_all
from xeforge.settings import load_settings
from xeforge.store import RunStore
from xeforge.verifier import Verifier


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


# ---------------------------------------------------------------------------------------------- port
def cmd_port(args: argparse.Namespace) -> int:
    problem = load_problem(args.problem)
    if args.cluster is not None:
        return _port_on_cluster(args, problem)
    # lazy: the pipeline imports libcst and every stage (about a second); `xeforge --help`, `report`, `kb`, `aa`
    # and a port on a cluster (its child imports it) never need it
    from xeforge.pipeline import Pipeline, PortOptions

    settings = load_settings()
    if args.budget is not None:
        settings = settings.replace(tuning_budget=args.budget, cpu_tuning_budget=min(args.budget, settings.cpu_tuning_budget))
    if args.time_budget is not None:
        settings = settings.replace(port_minutes=args.time_budget)
    if args.check_lanes is not None:
        settings = settings.replace(check_lanes=args.check_lanes)
    opts = PortOptions(device=args.device, stages=_split(args.stages), engine=args.engine, dry_run=args.dry_run,
                       resume=args.resume, run_dir=Path(args.run_dir) if args.run_dir else None,
                       runs_dir=Path(args.runs_dir), target=args.target, triton=args.triton, settings=settings,
                       llm=_llm_config(args), argv=sys.argv[1:], patch=args.patch)
    pipe = Pipeline(problem, opts)
    if args.dry_run:
        plan = pipe.dry_run()
        print(f"plan and prompts written to {plan['run_dir']}", file=sys.stderr)
        if args.json:
            _print_json(plan)
        else:
            _print_plan(plan)
        return 0
    return _print_port(pipe.run(), args)


def _port_on_cluster(args: argparse.Namespace, problem) -> int:
    from xeforge.port_cluster import port_on_cluster  # lazy: Ray only for --cluster

    return _print_port(port_on_cluster(args, problem, lambda msg: print(msg, file=sys.stderr, flush=True)), args)


def _print_port(report: dict, args: argparse.Namespace) -> int:
    if args.json:
        _print_json(report)
    else:
        print(f"{report['summary']}")
        print(f"final kernel: {report['final']['path']}")
        print(f"report: {Path(report['run_dir']) / 'report.md'}")
        patch = report["final"].get("patch")
        if patch:
            state = "empty: nothing to change" if patch["empty"] else f"git -C {patch['apply_in']} apply {patch['path']}"
            print(f"patch of {patch['applies_to']}: {patch['path']} ({state})")
            for note in patch["notes"]:
                print(f"note: {note}", file=sys.stderr)
    if report.get("outcome") == "no-usable-answer":
        # exit 3: the run completed, but no answer of the llm engine reached the verifier (docs/llm.md)
        print("note: the llm engine produced no answer that reached the verifier; exit status 3", file=sys.stderr)
    return int(report.get("exit_code", 0))


def _llm_config(args: argparse.Namespace):
    # lazy, for the same reason as the pipeline: the engine registry imports the rewrites (libcst) and the stages
    from xeforge.engines import llm_config

    return llm_config(args)


def _split(value: str | None) -> list[str] | None:
    return [s.strip() for s in value.split(",") if s.strip()] if value else None


def _print_plan(plan: dict) -> None:
    print(f"plan for {plan['problem']} on {plan['device']['kind']} (KB device {plan['kb_device'] or 'none'}, "
          f"Triton {plan['triton']}), engine {plan['engine']} ({plan['engine_reason']}) — no kernel is executed")
    for variant, lines in plan.get("trace", {}).items():
        print(f"\ntrace of forward at {variant} (the meta device, in a worker; launches recorded, not run):")
        for line in lines:
            print(f"  {line}")
    if plan.get("alignment"):
        print("\nalignment by shape (integer arguments that lose Triton's divisibility-by-16 hint at some shapes):")
        for line in plan["alignment"]:
            print(f"  {line}")
    for st in plan["stages"]:
        print(f"\n== stage {st['order']}/9 {st['name']}: {st['goal']}")
        for i in st["issues"]:
            print(f"  issue: {i}")
        for t in st["tactics"]:
            if t["name"] is None:
                print(f"  {t['reason']}")
                continue
            state = "applies" if t["applies"] else "does not apply"
            print(f"  tactic {t['name']}: {state} — {t['reason']}")
            if t.get("candidates"):
                print(f"    {t['candidates']} candidate(s); first: {t.get('description', '')}")
            if t.get("failed"):
                print(f"    {t['failed']}")
            if t.get("diff"):
                print("    " + t["diff"].rstrip().replace("\n", "\n    "))
            if t.get("patch"):
                print(f"    patch of {t['patch']['applies_to']}: {t['patch']['path']}"
                      + (" (edits of the generated Model: " + t["patch"]["model_diff"] + ")"
                         if t["patch"].get("model_diff") else ""))
        if "kb" in st and "prompt" not in st:  # the prompt already carries the KB entries
            print("  knowledge base entries for this stage:")
            print("    " + st["kb"].rstrip().replace("\n", "\n    "))
        if "prompt" in st:
            print("  prompt the llm engine would send:")
            print("    " + st["prompt"].rstrip().replace("\n", "\n    "))


# ---------------------------------------------------------------------------------------------- verify
def cmd_verify(args: argparse.Namespace) -> int:
    # lazy: the pipeline imports libcst and every stage (about a second); `xeforge --help`, `report`, `kb` and
    # `aa` never need it
    from xeforge.diagnosis.rules import describe as describe_diagnosis  # lazy, with the pipeline below
    from xeforge.pipeline import constraint_hook, diagnoser, kb_context

    problem = load_problem(args.problem)
    device = devices.describe(devices.resolve(args.device))
    kbc = kb_context(device, args.target, args.triton)
    cand = Path(args.candidate).resolve() if args.candidate else problem.kernel_path
    if cand.exists() and not cand.is_file():
        raise UsageError("--candidate", f"{cand} is a folder, not a kernel file", "pass a kernel .py file")
    if not cand.exists():
        raise UsageError("--candidate", f"{cand} does not exist", "pass the path of a kernel file")
    store = RunStore.create(Path(args.runs_dir), f"{problem.name}-verify")
    print(f"verifying {cand} against {problem.name} on {device.kind} ({device.name}); scratch {store.root}",
          file=sys.stderr)
    if device.interpreter:
        print("note: the CPU interpreter checks correctness only; gate 3 does not run", file=sys.stderr)
    hooks = [h for h in [constraint_hook(kbc)] if h]
    with Verifier(problem, device, load_settings(), store.root, hooks, kbc.entry, diagnoser(kbc, device)) as v:
        incumbent = problem.kernel_path if (args.candidate and not device.interpreter) else None
        if not args.candidate and not device.interpreter:
            incumbent = problem.kernel_path  # the starting kernel against itself: gate 3 is then an A/A check
        verdict = v.verify(cand, incumbent)
    out = {"problem": problem.name, "candidate": str(cand), "device": device.as_dict(), "kb_device": kbc.device_id,
           "correct": verdict.correct, "accepted": verdict.accepted, "feedback": verdict.feedback(),
           "gates": [g.__dict__ for g in verdict.gates], "diagnosis": verdict.diagnosis}
    if args.json:
        _print_json(out)
    else:
        for g in verdict.gates:
            print(f"gate {g.gate:<14} {g.status.upper():<8} {g.summary}")
        for line in describe_diagnosis(verdict.diagnosis):
            print(line)
        print(("VERIFIED CORRECT" if verdict.correct else "REJECTED") + f": {verdict.feedback()}")
    return 0 if verdict.correct else 2


# ---------------------------------------------------------------------------------------------- env
def cmd_env(args: argparse.Namespace) -> int:
    # lazy: the pipeline imports libcst and every stage (about a second); `xeforge --help`, `report`, `kb` and
    # `aa` never need it
    from xeforge.pipeline import kb_context

    found = {}
    for kind in ("xpu", "cuda", "cpu"):
        try:
            found[kind] = devices.available(kind)
        except Exception as exc:  # a broken backend is reported, not raised
            found[kind] = f"error: {exc}"
    chosen = devices.resolve(args.device)
    info = devices.describe(chosen)
    kbc = kb_context(info, args.target, args.triton)
    llm = _llm_config(args)
    settings = load_settings()
    box = sandbox.report(chosen, settings.sandbox, sandbox.limits_for(settings, chosen))
    out = {"available": found, "selected": info.as_dict(), "versions": devices.versions(),
           "kb_device": kbc.device_id, "kb_note": kbc.note, "triton_gate": getattr(kbc.triton, "text", None),
           "sandbox": box.as_dict(),
           "llm": llm.describe() if llm is not None else "llm engine not installed (pip install -e '.[llm]')"}
    if args.json:
        _print_json(out)
        return 0
    print("devices: " + ", ".join(f"{k}={'yes' if v is True else ('no' if v is False else v)}" for k, v in found.items()))
    print(f"selected: {info.kind} — {info.name}" + (" (Triton interpreter: correctness only)" if info.interpreter else ""))
    for key in ("cores", "l2_bytes", "shared_mem_bytes", "total_memory_bytes", "subgroup_sizes", "has_fp64",
                "architecture", "driver"):
        print(f"  {key}: {getattr(info, key)}")
    v = out["versions"]
    print(f"versions: python {v['python']}, torch {v['torch']}, triton {v['triton']}")
    print(f"knowledge-base device entry: {kbc.device_id or 'none'}{(' — ' + kbc.note) if kbc.note else ''}")
    print(f"knowledge base gated on Triton: {out['triton_gate']}")
    print(f"workers: {box.summary()}")
    print(f"llm: {out['llm']}")
    return 0


# ---------------------------------------------------------------------------------------------- report / aa
def cmd_report(args: argparse.Namespace) -> int:
    for path in rerender_all(Path(args.run_dir)):
        print(path)
    return 0


def cmd_aa(args: argparse.Namespace) -> int:
    """Time a kernel (the starting one, or --candidate) against itself: an A/A comparison must never be accepted
    as faster."""
    problem = load_problem(args.problem)
    kernel = Path(args.candidate) if args.candidate else problem.kernel_path
    if not kernel.is_file():
        raise UsageError("--candidate", f"{kernel} is not a file", "pass a kernel .py, e.g. <run>/final/kernel.py")
    device = devices.describe(devices.resolve(args.device))
    if device.interpreter:
        raise DeviceError("--device", "an A/A timing test needs a GPU; the CPU interpreter times nothing meaningful",
                          "run on a CUDA or XPU machine")
    store = RunStore.create(Path(args.runs_dir), f"{problem.name}-aa")
    results = []
    with Verifier(problem, device, load_settings(), store.root) as v:
        for i in range(args.repeats):
            r = v.aa_test(kernel)
            results.append(r)
            print(f"A/A {i + 1}/{args.repeats}: speedup {r['speedup']:.4f}x, margin {r['margin']:.4f}, "
                  f"accepted as faster: {r['accepted']}", file=sys.stderr)
    out = {"problem": problem.name, "kernel": str(kernel), "device": device.as_dict(), "versions": devices.versions(),
           "runs": results,
           "never_accepted": not any(r["accepted"] for r in results)}
    if args.json:
        _print_json(out)
    else:
        print(f"A/A on {device.name}: {len(results)} runs, speedups "
              + ", ".join(f"{r['speedup']:.4f}" for r in results)
              + f"; accepted as a win: {sum(r['accepted'] for r in results)} (must be 0)")
    return 0 if out["never_accepted"] else 1


# ---------------------------------------------------------------------------------------------- parser
def _add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "xpu", "cuda", "cpu"],
                   help="auto (xpu, then cuda, then cpu), xpu, cuda or cpu")
    p.add_argument("--target", default=None, help="knowledge-base device id to use (default: the entry matching the device)")
    p.add_argument("--triton", default=None, help="Triton version to gate the knowledge base on (default: installed)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xeforge", description="Port Triton kernels to Intel GPUs, stage by stage, "
                                     "with every candidate verified on hardware.")
    parser.add_argument("--version", action="version", version=f"xeforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("port", help="port a problem: stages in order, every candidate verified")
    p.add_argument("problem", help="problem folder (kernels/<name>) or kernel file")
    _add_device_args(p)
    p.add_argument("--stages", default=None, help="comma-separated stage names; a named stage always runs")
    p.add_argument("--engine", default="auto", choices=["rules", "llm", "auto", "both"])
    p.add_argument("--dry-run", action="store_true", help="show the plan, tactics, diffs and prompts; run nothing")
    p.add_argument("--resume", action="store_true", help="continue the latest run of this problem")
    p.add_argument("--run-dir", default=None, help="run folder to use (default: RUNS_DIR/<problem>/<timestamp>)")
    p.add_argument("--runs-dir", default=os.environ.get("XEFORGE_RUNS_DIR", "runs"))
    p.add_argument("--budget", type=positive_int, default=None, help="hardware evaluations per search tactic")
    add_time_budget(p)
    add_check_lanes(p)
    p.add_argument("--json", action="store_true", help="print the report (or plan) as JSON on stdout")
    p.add_argument("--patch", action="store_true", help="write final/upstream.patch: the result as a diff that "
                   "`git apply` takes (against the original file for a problem made by `xeforge new`)")
    p.add_argument("--cluster", default=None, metavar="ray[://ADDRESS]",
                   help="run the port as a task on a Ray cluster's GPU (--device names the kind): 'ray' connects to "
                        "$RAY_ADDRESS, else to a cluster on this host, else starts one here; the run folder comes "
                        "back here (needs the ray extra)")
    add_llm_args(p)
    p.set_defaults(func=cmd_port)

    p = sub.add_parser("verify", help="run the verification cascade on one kernel and print the verdict per gate")
    p.add_argument("problem")
    p.add_argument("--candidate", default=None, help="kernel file to verify (default: the problem's starting kernel)")
    _add_device_args(p)
    p.add_argument("--runs-dir", default=os.environ.get("XEFORGE_RUNS_DIR", "runs"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("env", help="what xeforge found: devices, versions, KB device entry, LLM configuration")
    _add_device_args(p)
    add_llm_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("report", help="re-render a port's report.md/.html (from report.json) or a bench's "
                       "bench.md/.html (from bench.json)")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("aa", help="A/A timing test: a kernel (the starting one unless --candidate) against itself "
                       "must never win (GPU only)")
    p.add_argument("problem")
    p.add_argument("--candidate", default=None, help="kernel file to time against itself (default: the problem's "
                   "starting kernel), e.g. a run's final/kernel.py")
    _add_device_args(p)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--runs-dir", default=os.environ.get("XEFORGE_RUNS_DIR", "runs"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_aa)

    register_new(sub)
    register_kb(sub)
    register_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except XeforgeError as exc:
        print(f"Error: {exc.render()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted: the run folder keeps every finished trial; re-run with --resume to continue.",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
