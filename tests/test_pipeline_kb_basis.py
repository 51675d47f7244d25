"""A KB pattern's ``basis_for``: an earlier stage's rewrite that lost alone is the basis of a later stage's candidates.

Scripted timing (no GPU here): the real stages and rules engine propose the real rewrites of
kernels/kb97_matmul_batchnorm_biasadd_divide_swish on the H200's knowledge-base entry; a cost model stands in for
gate 3. Fusing the bias + divide + swish kernel into the GEMM's epilogue is slower with one tile per program (the
H200 measured 0.83x) and free once the GEMM is persistent, which is what KB
``fusion-chain-pays-in-persistent-kernels-on-hopper`` says: the fusion stage rejects it, the persistent stage must
propose its tile loop on top of it too, and the port must end with one kernel.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.base import TrialOutcome
from tests.conftest import ROOT
from xeforge import devices
from xeforge.pipeline import Pipeline, PortOptions, _kb_bases, _new_at, kb_context
from xeforge.problem import load_problem, source_hash
from xeforge.verifier import Verdict

MARGIN = 0.02
PATTERN = "fusion-chain-pays-in-persistent-kernels-on-hopper"
H200 = devices.DeviceInfo("cuda", "NVIDIA H200", cores=132)


def cost_ms(src: str) -> float:
    """GEMM 1.2 ms with fp32 up-casts, 1.0 without, 0.9 as a persistent tile loop; the batch_norm as a torch op
    0.1; the chain as its own kernel 0.05, fused into a one-tile-per-program GEMM 0.25 (its epilogue is not
    hidden), fused into the persistent GEMM nothing."""
    persistent = "tl.num_programs(0)" in src
    gemm = 1.2 if "other=0.0).to(tl.float32)\n" in src.split("def bias_div_swish_kernel")[0] else 1.0
    gemm *= 0.9 if persistent else 1.0
    torch_ops = 0.1 if "F.batch_norm(" in src else 0.0
    chain_fused = "bias_div_swish_kernel[" not in src
    chain = (0.0 if persistent else 0.25) if chain_fused else 0.05
    return gemm + torch_ops + chain


def run_scripted(tmp_path: Path, monkeypatch, bases: bool = True):
    problem = load_problem(ROOT / "kernels" / "kb97_matmul_batchnorm_biasadd_divide_swish")
    pipe = Pipeline(problem, PortOptions(device="cuda", stages=["dtype", "fusion", "persistent"]),
                    progress=lambda msg: None)
    kbc = kb_context(H200)
    assert kbc.device_id == "h200"
    store = _new_at(tmp_path / "run")
    trials = []

    def evaluate(store, verifier, stage, cand, inc_path, inc_src):
        s = cost_ms(inc_src) / cost_ms(cand.source)
        trials.append((stage.name, cand.description, round(s, 4)))
        v = Verdict(source_hash(cand.source), [], correct=True, accepted=s > 1 + MARGIN, timed=True, speedup=s)
        name = f"{len(trials):04d}-{stage.name}-{cand.tactic}"
        folder = store.root / "trials" / name
        folder.mkdir(parents=True)
        (folder / "candidate.py").write_text(cand.source)
        return TrialOutcome(name, cand, v)

    pipe._evaluate = evaluate
    pipe._baseline = lambda store, verifier, start: {}
    pipe._final = lambda store, verifier, device, history, start, records=(), **kw: {"path": str(history[-1])}
    pipe._report = lambda store, device, kbc, engine, baseline, records, final: {"records": records, "final": final}
    monkeypatch.setattr("xeforge.pipeline.write_reports", lambda root, report: None)
    if not bases:
        monkeypatch.setattr("xeforge.pipeline._kb_bases", lambda stage, ctx, kbc, *rest: [])
    no_prewarm = type("Verifier", (), {"prewarm": lambda self, sources: 0})()
    return pipe._run(store, no_prewarm, H200, kbc, "rules"), trials


@pytest.mark.slow  # ~16 s: the real stages propose and rewrite every candidate of three stages
def test_the_rejected_chain_fusion_is_the_persistent_stages_basis(tmp_path, monkeypatch):
    out, trials = run_scripted(tmp_path, monkeypatch)
    chain = [s for st, d, s in trials if st == "fusion" and d.startswith("fused bias_div_swish_kernel")]
    assert chain and all(s < 1.0 for s in chain), trials  # the fusion stage saw it lose alone
    final = Path(out["final"]["path"]).read_text()
    assert "tl.num_programs(0)" in final and "bias_div_swish_kernel[" not in final, trials
    persistent = next(r for r in out["records"] if r.name == "persistent")
    on_basis = [t for t in persistent.tactics if PATTERN in t.note]
    assert on_basis and on_basis[0].best is not None
    assert all("[on top of fusion's fuse-elementwise-chain rewrite" in o.candidate.description
               for o in on_basis[0].outcomes)


@pytest.mark.slow  # ~17 s, the control of the slow test above: make test-slow
def test_without_the_basis_the_two_kernels_stay(tmp_path, monkeypatch):
    """The control: the same run without KB bases keeps the chain's own kernel."""
    out, _ = run_scripted(tmp_path, monkeypatch, bases=False)
    final = Path(out["final"]["path"]).read_text()
    assert "tl.num_programs(0)" in final and "bias_div_swish_kernel[" in final


def test_no_basis_where_the_kb_names_none_or_the_tactic_no_longer_applies():
    """Off the H200 (no pattern names the persistent stage) there is no basis; on it, the chain's rewrite of an
    incumbent that still has the chain kernel is one (kb09: the GEMM, then its sub-mul-relu kernel), and an
    incumbent without it (fused already) has none."""
    import stages as registry
    from xeforge.pipeline import Pipeline as P

    problem = load_problem(ROOT / "kernels" / "kb09_matmul_subtract_multiply_relu")
    pipe = P(problem, PortOptions(device="cuda"), progress=lambda m: None)
    persistent = registry.get("persistent")
    kbc = kb_context(H200)
    ctx = pipe.context(H200, kbc, problem.kernel_source, None)
    bases = _kb_bases(persistent, ctx, kbc)
    assert [what for _, what in bases] == [f"fusion's fuse-elementwise-chain rewrite of the incumbent (KB {PATTERN})"]
    assert "sub_mul_relu_kernel[" in problem.kernel_source and "sub_mul_relu_kernel[" not in bases[0][0]
    assert _kb_bases(persistent, ctx.with_source(bases[0][0]), kbc) == []  # fused already: nothing to carry
    assert _kb_bases(registry.get("fusion"), ctx, kbc) == []  # not a later stage
    assert _kb_bases(persistent, ctx, kbc, {"persistent"}) == []  # --stages persistent: no fusion rewrite
    other = devices.DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", cores=108)
    okbc = kb_context(other)
    assert okbc.device_id != "h200"
    assert _kb_bases(persistent, pipe.context(other, okbc, problem.kernel_source, None), okbc) == []
