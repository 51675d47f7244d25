"""Writes .gpucall/so_{inc,early,half,early_half,ws}/several-outputs-wrapper.py for callZ.sh: call U's several-outputs
port before its dispatch (the incumbent at the persistent stage), the same with y stored where it is final, and the
persistent stage's first candidates over each where the incumbent spills. Run from the repository root after
`python3 scripts/epilogue_problems.py /tmp/ep several-outputs` and docs/measurements/ports-h100-2026-12-07f/finals.sh."""
from pathlib import Path
import sys
sys.path.insert(0, ".")
from tests.conftest import tactic_context
from stages import persistent as stage
from xeforge.problem import load_problem

p = load_problem(Path("/tmp/ep/several-outputs-wrapper"))
s = Path(".gpucall/finals2/several-outputs-wrapper.py").read_text()
i = s.index("        if M <= 256:\n"); k = s.index("        else:\n", i) + len("        else:\n")
e = s.index("        return y_out, y", k)
inc = s[:i] + "\n".join(l[4:] if l.startswith("    ") else l for l in s[k:e].splitlines()) + "\n" + s[e:]
a = inc.index("    if USE_BLOCK_IO:\n        y_out_desc.store("); b = inc.index("    if USE_BLOCK_IO:\n        y_desc.store(")
early = inc[:a] + inc[b:]
at = early.index("    y = acc\n") + len("    y = acc\n")
early = early[:at] + inc[a:b] + early[at:]
out = {"so_inc": inc, "so_early": early}
for name, src in (("so_half", inc), ("so_early_half", early)):
    ctx = tactic_context(p, src, "cuda", "h100", cores=132)
    ctx.diagnosis = {"available": True, "findings": [],
                     "kernels": [{"kernel": "_mm_bias", "facts": {"regs": 255, "spills": 46}}]}
    cands = stage.PersistentTileLoop().propose(ctx)
    out[name] = cands[0].source
    if name == "so_half":
        out["so_ws"] = cands[1].source
for name, src in out.items():
    Path(f".gpucall/{name}").mkdir(exist_ok=True)
    Path(f".gpucall/{name}/several-outputs-wrapper.py").write_text(src)
    print(name)
