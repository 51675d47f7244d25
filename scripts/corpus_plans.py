#!/usr/bin/env python3
"""The Intel dry-run plan of every real-world corpus kernel, as one markdown table: which tactics apply for a
target (default arc-b580) per stage. Runs on the CPU: each kernel is brought in with ``xeforge new`` and planned
with ``xeforge port --device xpu --dry-run --json`` (nothing is verified or timed; ``--device xpu`` plans as for an
Intel GPU, so the tactics that only a timing device ranks, such as per-shape-config, are listed too).
BENCHMARKS.md's corpus section shows it beside the GPU figures.

Usage (repo root):
    .venv/bin/python scripts/corpus_plans.py [--target arc-b580] [--device xpu] [--corpus examples/realworld] [NAME ...] > plans.md
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def plan(new_yaml: Path, target: str, work: Path, device: str = "xpu") -> dict:
    prob = work / new_yaml.parent.name
    subprocess.run([sys.executable, "-m", "xeforge", "new", str(new_yaml), "-o", str(prob), "--force"],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([sys.executable, "-m", "xeforge", "port", str(prob), "--device", device, "--target", target,
                          "--dry-run",
                          "--json", "--runs-dir", str(work / "runs")], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--target", default="arc-b580")
    ap.add_argument("--device", default="xpu", help="the kind of device to plan for (xpu, cuda, cpu)")
    ap.add_argument("--corpus", default="examples/realworld")
    args = ap.parse_args()
    entries = sorted(Path(args.corpus).glob("*/new.yaml"))
    if args.names:
        entries = [e for e in entries if e.parent.name in args.names]
    print(f"| kernel | tactics that apply for `{args.target}` (stage: tactic) |")
    print("|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for e in entries:
            print(f"planning {e.parent.name}", file=sys.stderr)
            try:
                got = plan(e, args.target, Path(tmp), args.device)
            except subprocess.CalledProcessError as exc:
                got = {"error": f"xeforge new failed: {(exc.stderr or '').strip().splitlines()[-1:]}"}
            if "error" in got:
                print(f"| `{e.parent.name}` | (no plan: {got['error']}) |")
                continue
            applies = [f"{s['name']}: {t['name']}" for s in got["stages"] for t in s["tactics"] if t.get("applies")]
            print(f"| `{e.parent.name}` | {', '.join(applies) or '(none)'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
