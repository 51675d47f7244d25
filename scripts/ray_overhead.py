"""What Ray adds to a port: ``xeforge port`` run locally and through ``--cluster ray``, interleaved, on one host.

Usage (repo root; on the GPU machine for the issue-35 figure, ``--device cuda``):

    python scripts/ray_overhead.py OUTDIR [--device cuda] [--stages S] [--repeats 2] PROBLEM [PROBLEM ...]

Starts one Ray head on this host (``ray start --head``, one GPU when ``--device`` names one; stopped at the end), so
each port pays what a port on a running cluster pays: the driver's connection, the task's submission, the child's
start on the node and its run folder returned. Each repeat runs the local port and then the cluster port of every
problem into fresh run folders. Per port: the wall time of the local ``xeforge port`` process, of the ``--cluster``
one, the child's own time inside the task (``cluster.elapsed_s``), and the trials the port ran. The overhead is
the cluster wall minus the local wall, per port and per trial, and as a share of the local port's time (the issue's
target: under 3%). Writes ``OUTDIR/ray-overhead.json`` and ``OUTDIR/ray-overhead.md``; the table also goes to
stdout. The figures hold for the device, problems and stages they were taken with, and the markdown names them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(device: str, log: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0"}
    gpus = "0" if device == "cpu" else "1"
    # `python -m ray.scripts.scripts`, not the `ray` script: wheels installed with `--target` have no script beside
    # the interpreter
    proc = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             f"--port={port}", "--num-cpus=2", f"--num-gpus={gpus}", "--include-dashboard=false"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"ray start --head exited; see {log}")
            time.sleep(0.5)
    time.sleep(3)  # the raylet registers after the GCS listens
    return proc, {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}


def stop_head(proc: subprocess.Popen, port: str) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    # `ray start` records its address for a later ray.init() to find; ended by a signal, the head leaves it behind,
    # and a later `--cluster ray` without an address would be refused for a cluster that is gone
    record = Path("/tmp/ray/ray_current_cluster")
    if record.is_file() and record.read_text().strip().endswith(f":{port}"):
        record.unlink()


def port(problem: str, run_dir: Path, flags: list[str], env: dict[str, str], cluster: bool) -> dict:
    argv = [sys.executable, "-m", "xeforge", "port", problem, *flags, "--run-dir", str(run_dir), "--json"]
    if cluster:
        argv += ["--cluster", "ray"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 3):
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    rep = json.loads(proc.stdout)
    trials = len(list((run_dir / "trials").glob("*/meta.json")))
    return {"wall_s": round(wall, 2), "trials": trials, "summary": rep.get("summary"),
            "child_s": (rep.get("cluster") or {}).get("elapsed_s"),
            "attempts": (rep.get("cluster") or {}).get("attempts")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("problems", nargs="+")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "xpu"])
    ap.add_argument("--stages", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    flags = ["--device", args.device, "--engine", "rules"] + (["--stages", args.stages] if args.stages else [])
    head, ray_env = start_head(args.device, out / "ray-head.log")
    runs: list[dict] = []
    try:
        for r in range(args.repeats):
            for problem in args.problems:
                name = Path(problem).name
                for where, env in (("local", dict(os.environ)), ("ray", ray_env)):
                    res = port(problem, out / "runs" / f"{name}-{where}-{r}", flags, env, where == "ray")
                    runs.append({"problem": name, "where": where, "repeat": r, **res})
                    with open(out / "ray-overhead-runs.jsonl", "a") as f:  # kept if a later port is cut off
                        f.write(json.dumps(runs[-1]) + "\n")
                    print(f"{name} {where} #{r}: {res['wall_s']} s, {res['trials']} trial(s)", file=sys.stderr)
    finally:
        stop_head(head, ray_env["RAY_ADDRESS"].rsplit(":", 1)[1])
    rows = []
    for problem in dict.fromkeys(x["problem"] for x in runs):
        local = [x for x in runs if x["problem"] == problem and x["where"] == "local"]
        ray = [x for x in runs if x["problem"] == problem and x["where"] == "ray"]
        lw, rw = statistics.median(x["wall_s"] for x in local), statistics.median(x["wall_s"] for x in ray)
        trials = max(x["trials"] for x in local + ray)
        lw, rw = round(lw, 2), round(rw, 2)
        rows.append({"problem": problem, "local_s": lw, "ray_s": rw, "overhead_s": round(rw - lw, 2),
                     "share": round((rw - lw) / lw, 4), "trials": trials,
                     "per_trial_s": round((rw - lw) / trials, 3) if trials else None,
                     # Ray's own part of each cluster port: its wall time less the child's time inside the task
                     "ray_own_s": [round(x["wall_s"] - x["child_s"], 2) for x in ray if x["child_s"] is not None],
                     "child_s": round(statistics.median(x["child_s"] for x in ray if x["child_s"] is not None), 2),
                     "spread_local_s": [x["wall_s"] for x in local], "spread_ray_s": [x["wall_s"] for x in ray]})
    import importlib.metadata as md  # the versions the figures hold for

    meta = {"device": args.device, "stages": args.stages, "repeats": args.repeats, "argv": sys.argv,
            "ray": md.version("ray"), "torch": md.version("torch"), "triton": md.version("triton"),
            "host": socket.gethostname(), "date": time.strftime("%Y-%m-%d %H:%M")}
    (out / "ray-overhead.json").write_text(json.dumps({"meta": meta, "rows": rows, "runs": runs}, indent=2))
    lines = [f"Ray overhead per port on {meta['host']} ({args.device}; Ray {meta['ray']}, torch {meta['torch']}, "
             f"Triton {meta['triton']}; stages {args.stages or 'all'}; median of {args.repeats}):", "",
             "| problem | local port (s) | port --cluster ray (s) | overhead (s) | share of the local port | trials | "
             "overhead per trial (s) | child inside the task (s) | Ray's own part per run (s) | local / ray runs (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        per_trial = "—" if x["per_trial_s"] is None else x["per_trial_s"]
        lines.append(f"| {x['problem']} | {x['local_s']} | {x['ray_s']} | {x['overhead_s']} | {x['share']:.1%} | "
                     f"{x['trials']} | {per_trial} | {x['child_s']} | {x['ray_own_s']} | {x['spread_local_s']} / "
                     f"{x['spread_ray_s']} |")
    text = "\n".join(lines) + "\n"
    (out / "ray-overhead.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
