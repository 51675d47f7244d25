"""The split-k tactic's first candidate (sized per call) on a given kernel of a problem."""
import sys
from pathlib import Path
from stages.device_tuning_splitk import SplitK
from tests.conftest import tactic_context
from xeforge.problem import load_problem
p = load_problem(sys.argv[1])
src = Path(sys.argv[2]).read_text()
ctx = tactic_context(p, src, kind="cuda", cores=132)
app = SplitK().check(ctx)
print(app.applies, app.reason, file=sys.stderr)
cands = SplitK().propose(ctx)
print([c.description[-200:] for c in cands], file=sys.stderr)
open(sys.argv[3], "w").write(cands[0].source)
