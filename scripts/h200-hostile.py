"""Issue 31 on a GPU: the hostile list rejected on cuda, honest port results not rejected, the account's cost.

Usage (repo root, GPU machine; wheels in .whl and bubblewrap in .deb as BENCHMARKS.md says):
    python3 scripts/h200-hostile.py OUT hostile            the hostile list (tests/hostile.py) on kernels/gemm_relu
    python3 scripts/h200-hostile.py OUT finals [PROBLEM..]  each committed port result (docs/measurements/h200-ports)
                                                            through gate 2 against its start, the account on
    python3 scripts/h200-hostile.py OUT cost [PROBLEM..]    gate 2 of a port result with the account on and off,
                                                            interleaved in one worker (the account's cost)
    python3 scripts/h200-hostile.py OUT init                the profiler's one-time start-up in a fresh process
Writes OUT/<part>.json and prints one line per case.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import hostile  # noqa: E402
from xeforge.analysis.account import account_problems  # noqa: E402
from xeforge.analysis.trace import Trace  # noqa: E402
from xeforge.devices import describe  # noqa: E402
from xeforge.isolation import WorkerFailure  # noqa: E402
from xeforge.problem import Code, load_problem  # noqa: E402
from xeforge.settings import Settings  # noqa: E402
from xeforge.verifier import Verifier  # noqa: E402

FINALS = ROOT / "docs" / "measurements" / "h200-ports"
DEVICE = os.environ.get("DEVICE", "cuda")  # DEVICE=cpu: a smoke run on the interpreter (its figures mean nothing)


def verifier(problem: str, work: Path, rounds: int = 1) -> Verifier:
    return Verifier(load_problem(ROOT / "kernels" / problem), describe(DEVICE),
                    Settings(correctness_rounds=rounds), work / problem)


def part_hostile(work: Path) -> list[dict]:
    rows = []
    with verifier("gemm_relu", work) as v:
        start = v.verify(v.problem.kernel_path)
        rows.append({"case": "start", "correct": start.correct, "feedback": start.feedback()[:400]})
        variant = v.correctness_variants()[0][0]
        for name in sorted(hostile.CASES):
            src = hostile.source(name)
            g1 = v.static(src, f"{name}.py")
            t0 = time.monotonic()
            g0, g2 = v.correctness(Code(src, f"{name}.py"))
            seconds = time.monotonic() - t0
            try:
                _, facts = v._run(Code(src, f"{name}.py"), variant, 7, "normal", rerun=False)
            except WorkerFailure as exc:  # the candidate broke itself there (numpy has no bfloat16)
                facts = {"trace": {"events": []}, "account": None, "failure": f"{exc.kind}: {exc.detail[:200]}"}
            launches = len(Trace.from_json(variant.name, facts["trace"]).launches)
            alone = facts.get("failure") or account_problems(facts.get("account"), v._start_account(variant),
                                                             set(v.static_checker.starting.functions), launches)
            row = {"case": name, "gate1": [f["rule"] for f in g1.details.get("findings", [])],
                   "gate1_summary": g1.summary[:600], "gate0": g0.summary[:300],
                   "gate2": (g2.status, g2.summary[:600]) if g2 else None, "gate2_s": round(seconds, 2),
                   "account_alone": alone, "account": facts.get("account")}
            rows.append(row)
            print(f"{name:24} gate1 {row['gate1']} | gate2 {row['gate2'][0] if g2 else '-'}: "
                  f"{(g2.summary if g2 else g0.summary)[:160]} | account: {(alone or 'NOTHING')[:200]}", flush=True)
    return rows


def part_finals(work: Path, problems: list[str]) -> list[dict]:
    rows = []
    for p in problems:
        final = FINALS / p / "final-kernel.py"
        if not final.exists():
            continue
        with verifier(p, work) as v:
            t0 = time.monotonic()
            start = v.verify(v.problem.kernel_path)
            t1 = time.monotonic()
            g0, g2 = v.correctness(Code(final.read_text(), "final-kernel.py"))
            t2 = time.monotonic()
            row = {"problem": p, "start_correct": start.correct, "start_s": round(t1 - t0, 2),
                   "final": g2.status if g2 else "gate0 " + g0.status, "final_s": round(t2 - t1, 2),
                   "summary": (g2.summary if g2 else g0.summary)[:500], "notes": v.runtime_notes[:4],
                   "start_account": {k: v._start_accounts[k] for k in list(v._start_accounts)[:1]}}
        rows.append(row)
        print(f"{p:52} start {start.correct} {row['start_s']:7.1f}s | final {row['final']} {row['final_s']:7.1f}s "
              f"{row['summary'][:150]}", flush=True)
    return rows


def part_cost(work: Path, problems: list[str], reps: int = 3) -> list[dict]:
    rows = []
    for p in problems:
        final = FINALS / p / "final-kernel.py"
        code = Code(final.read_text(), "final-kernel.py")
        with verifier(p, work, rounds=5) as v:
            v.verify(v.problem.kernel_path)  # the start's accounts, and every slot compiled
            v.correctness(code)  # warm: the candidate's compiles are not the account's cost
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(reps):
                for on in (True, False):
                    v.settings = v.settings.replace(runtime_account=on)
                    t0 = time.monotonic()
                    _, g2 = v.correctness(code)
                    times[on].append(time.monotonic() - t0)
                    assert g2 is not None and g2.passed, g2.summary if g2 else "gate 0"
        on, off = statistics.median(times[True]), statistics.median(times[False])
        row = {"problem": p, "gate2_on_s": times[True], "gate2_off_s": times[False], "median_on": on,
               "median_off": off, "cost": on / off - 1}
        rows.append(row)
        print(f"{p:52} gate 2 with the account {on:7.2f}s, without {off:7.2f}s: {100 * (on / off - 1):+.1f}% "
              f"(on {['%.2f' % t for t in times[True]]}, off {['%.2f' % t for t in times[False]]})", flush=True)
    return rows


def part_init(work: Path) -> list[dict]:
    """The profiler's one-time start-up in a fresh process (a worker pays it once, at its first accounted call)."""
    import torch  # lazy: only this part needs torch in the script's own process

    from xeforge.analysis.account import Recorder

    rows = []
    x = torch.ones(1 << 20, device=DEVICE)
    for i in range(3):
        t0 = time.perf_counter()
        with Recorder(torch, DEVICE) as acct:
            with acct.scope("launch"):
                (x * 2).sum()
        rows.append({"profile": i, "seconds": time.perf_counter() - t0, "ranges": acct.data.get("ranges")})
        print(f"accounted call {i}: {rows[-1]['seconds']:.3f} s", flush=True)
    return rows


def main() -> None:
    out, part, *problems = sys.argv[1:]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("WORK", "/tmp/xeforge-h200-hostile"))  # the run folders: never under OUT
    everything = sorted(d.name for d in FINALS.iterdir() if (d / "final-kernel.py").exists())
    rows = {"init": lambda: part_init(work), "hostile": lambda: part_hostile(work),
            "finals": lambda: part_finals(work, problems or everything),
            "cost": lambda: part_cost(work, problems or ["gemm_relu", "kb09_matmul_subtract_multiply_relu",
                                                        "softmax", "layernorm"])}[part]()
    (out / f"{part}.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
