"""Where a port's wall time goes: gate seconds summed over every verdict of each run under a runs folder.

Usage: python3 scripts/port_time.py RUNS_DIR [--json]

Reads ``RUNS_DIR/<problem>/<stamp>/{baseline,trials/*,final}/verdict.json`` (every gate records its seconds) and
the run folder's own file times; prints one row per run: trials, seconds in gate 1 (static), gate 0+2 (load,
compile, correctness), gate 3 (timing), their sum, and the run's wall time (first to last file written), so the
rest (prewarm compiles, stage analysis, reports) is the difference. Gate 2's seconds are split too, where the
verdict records them: the candidate's first call per variant (load and compile), its other calls, the oracle, and
the comparisons and runtime checks; and, within those, the seconds its workers spent starting (the sandbox, torch's
import, the device context) and waiting for the device while another lane timed on it. Last, from a finished
port's report.json, every wait of its workers for a GPU shared with other lanes (gate 3's as well). Dry runs are
skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tabulate import tabulate

GATE_KEYS = {"1-static": "static_s", "2-correctness": "correct_s", "3-performance": "timing_s"}
# gate 2's details["seconds_in"]: four parts, then what of them went to starting workers and waiting for the device
SPLIT_KEYS = ("first_calls", "calls", "oracle", "checks", "starting", "waiting")


def run_row(run: Path) -> dict:
    verdicts = [run / "baseline" / "verdict.json", run / "final" / "verdict.json",
                *sorted((run / "trials").glob("*/verdict.json"))]
    row = {"run": f"{run.parent.name}/{run.name}", "trials": 0, "static_s": 0.0, "correct_s": 0.0,
           **{f"{k}_s": 0.0 for k in SPLIT_KEYS}, "timing_s": 0.0}
    for path in verdicts:
        if not path.exists():
            continue
        row["trials"] += path.parent.parent.name == "trials"
        for gate in json.loads(path.read_text()).get("gates", []):
            key = GATE_KEYS.get(gate.get("gate"))
            if key:
                row[key] += float(gate.get("details", {}).get("seconds", 0.0))
            for part, seconds in (gate.get("details", {}).get("seconds_in") or {}).items():
                if part in SPLIT_KEYS:
                    row[f"{part}_s"] += float(seconds)
    row["gates_s"] = row["static_s"] + row["correct_s"] + row["timing_s"]
    times = [p.stat().st_mtime for p in run.rglob("*") if p.is_file()]
    row["wall_s"] = (max(times) - min(times)) if times else 0.0
    # every request's wait for a GPU shared with other lanes (gate 3's too), from the report of a finished port
    report = run / "report.json"
    shared = json.loads(report.read_text()).get("shared_device") if report.exists() else None
    row["lane_wait_s"] = float(shared["waited_s"]) if shared else 0.0
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    root = Path(argv[0])
    runs = [r for r in sorted(root.glob("*/*")) if (r / "run.json").exists() and not r.name.endswith("dry-run")]
    rows = [run_row(r) for r in runs]
    if "--json" in argv:
        print(json.dumps(rows, indent=1))
    else:
        print(tabulate(rows, headers="keys", floatfmt=".1f"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
