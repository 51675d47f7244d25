"""``xeforge port --cluster ray[://ADDRESS]``: one port as a task on a Ray cluster's GPU.

Owns: the port's job — the child ``xeforge port --json`` command into a run folder chosen here, before anything
runs — and reading its report back. It runs on :class:`xeforge.ray_cluster.RayScheduler`, the scheduler ``xeforge
bench --cluster`` uses: one GPU per task (none on the CPU interpreter), Ray picks the node, a lost task is
submitted again, and only plain data comes back (the run folder's files by relative path, the child's log). The
child always continues its run folder (``--run-dir ... --resume``: a folder without ``run.json`` starts a new
run), so a retried attempt on the same host replays the trials the lost one recorded, and ``--resume`` here
continues the latest run of the problem as a local port would. The candidates still run in the child's
bubblewrap'd workers on the node.

The device kind is the one ``--device`` names, not what this host has: a laptop drives a GPU cluster with
``--device cuda``; ``--device auto`` is resolved here, and said so.

``--check-lanes K`` makes the task hold K GPUs of one node (fewer if no node has K), so the lanes check
candidates on GPUs of their own while gate 3 times on the port's. ``--dry-run`` with ``--cluster`` is refused: a dry
run uses no device, so it runs without one. Not done: one port's lanes on several nodes (a port is one task).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from xeforge import devices
from xeforge.errors import ClusterError, UsageError
from xeforge.problem import Problem
from xeforge.ray_cluster import RayScheduler, parse_cluster
from xeforge.schedule import Job, Outcome
from xeforge.settings import load_settings
from xeforge.store import RunStore

#: the port's flags the child gets as they were given (flag, attribute of the parsed arguments)
FORWARDED = (("--stages", "stages"), ("--engine", "engine"), ("--budget", "budget"), ("--time-budget", "time_budget"),
             ("--check-lanes", "check_lanes"), ("--target", "target"), ("--triton", "triton"), ("--model", "model"),
             ("--api-base", "api_base"), ("--max-iters", "max_iters"), ("--best-k", "best_k"))


def device_kind(flag: str, say: Callable[[str], None]) -> str:
    """The kind the task asks the cluster for: ``--device`` as named; ``auto`` resolved on this host."""
    if flag != "auto":
        return flag
    kind = devices.resolve("auto")
    say(f"--device auto on this host is {kind}; the cluster's nodes get --device {kind} "
        f"(name --device cuda or --device xpu for the cluster's GPUs)")
    return kind


def run_folder(args: argparse.Namespace, problem: Problem) -> Path:
    """The run folder, chosen here: --run-dir as given, the latest run for --resume, else a new one."""
    if args.run_dir:
        path = Path(args.run_dir)
        if (path / "run.json").exists() and not args.resume:
            raise UsageError("--run-dir", f"{path} already holds a run", "pass --resume to continue it, or choose "
                             "another --run-dir")
        return path.resolve()
    if args.resume:
        return RunStore.latest(Path(args.runs_dir), problem.name).root.resolve()
    return RunStore.create(Path(args.runs_dir), problem.name).root.resolve()


def child_argv(args: argparse.Namespace, kind: str, run_dir: Path) -> list[str]:
    argv = [sys.executable, "-m", "xeforge", "port", str(Path(args.problem).resolve()), "--device", kind,
            "--run-dir", str(run_dir), "--resume", "--json"]
    for flag, attr in FORWARDED:
        value = getattr(args, attr, None)
        if value is not None:
            argv += [flag, str(value)]
    if args.patch:
        argv.append("--patch")
    return argv


def port_on_cluster(args: argparse.Namespace, problem: Problem, say: Callable[[str], None]) -> dict:
    """Run the port as one task on the cluster ``--cluster`` names; the child's report, with the task's record
    under ``cluster``. A ClusterError when the task did not run to an end or wrote no report (its log's end in the
    message)."""
    if args.dry_run:
        raise UsageError("--cluster", "--dry-run runs nothing on a device", "drop --cluster (the plan is made here)")
    address = parse_cluster(args.cluster)
    kind = device_kind(args.device, say)
    lanes = args.check_lanes if args.check_lanes is not None else load_settings().check_lanes
    cluster = RayScheduler(address, kind, say=say, gpus=max(1, lanes))  # each lane on a GPU of its own
    cluster.connect()  # before a run folder is made: a cluster that cannot be used leaves nothing behind
    run_dir = run_folder(args, problem)
    job = Job(0, problem.name, child_argv(args, kind, run_dir), run_dir, result="report.json", keep=True)
    say(f"ray: porting {problem.name} in one task ({cluster.num_gpus:g} GPU); run folder {run_dir}")
    outcomes: list[Outcome] = []
    cluster.run([job], outcomes.append, None)
    (outcome,) = outcomes
    log = job.log.read_text(errors="replace") if job.log.exists() else ""
    if log:
        sys.stderr.write(log if log.endswith("\n") else log + "\n")
    where = outcome.where or {}
    if outcome.attempts > 1:
        say(f"ray: the port took {outcome.attempts} attempts: {'; '.join(outcome.lost)}")
    # the report as the child printed it; a long one comes back cut (a task returns the end of its stdout): then
    # the run folder's report.json, which this run wrote when the child ended well
    texts = [job.stdout] + ([run_dir / "report.json"] if outcome.exit_code in (0, 3) else [])
    try:
        report = _first_json(texts)
    except (OSError, json.JSONDecodeError, ValueError):
        tail = " ".join(log[-600:].split())
        why = outcome.error or f"the port's child on {where.get('host', 'its node')} exited with code " \
                               f"{outcome.exit_code} and printed no report"
        raise ClusterError("--cluster", why + (f"; its log ends: {tail}" if tail else ""),
                           f"see {job.log}; the run folder {run_dir} keeps every finished trial: run again with "
                           "--resume") from None
    report["cluster"] = {**(cluster.describe() or {}), **where, "attempts": outcome.attempts, "lost": outcome.lost,
                         "elapsed_s": outcome.elapsed_s}  # the child's own time inside the task that finished
    return report


def _first_json(paths: list[Path]) -> dict:
    for path in paths:
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
    raise ValueError("no report")
