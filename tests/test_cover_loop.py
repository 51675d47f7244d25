"""The CoVeR loop driven by a scripted model through the REAL verifier on the CPU interpreter.

Each test scripts the model's answers (cover_agent.scripted, a DSPy engine behind a real dspy.LM and the real
chat adapter), runs one stage of the llm engine with the pipeline's own evaluate/choose (trial store + verifier
cascade), and checks what was verified, what the model was told, and what landed in the run folder. One
Verifier is shared by the module; each test gets its own run folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from dspy import lm15

import stages
from cover_agent.client import LMClient
from cover_agent.config import LMConfig
from cover_agent.engine import LLMEngine
from cover_agent.scripted import Sleep, answer, kernel_answer, scripted
from tests.conftest import FIXTURES, ROOT
from xeforge.devices import DeviceInfo, describe
from xeforge.errors import EngineError
from xeforge.pipeline import Pipeline, PortOptions, constraint_hook, kb_context
from xeforge.problem import load_problem
from xeforge.settings import Settings
from xeforge.store import RunStore
from xeforge.verifier import GateResult, Verifier

VADD = FIXTURES / "problems" / "vadd"
PROBLEM = load_problem(VADD)
START = PROBLEM.kernel_source
GOOD = START.replace("cdiv(n, 64)", "cdiv(n, 128)").replace("BLOCK=64", "BLOCK=128")  # correct, different
GOOD_2 = START.replace("cdiv(n, 64)", "cdiv(n, 32)").replace("BLOCK=64", "BLOCK=32")
WRONG = GOOD.replace("x + y, mask=mask", "x - y, mask=mask")  # computes the wrong function
SETTINGS = Settings(compile_timeout_s=60.0, run_timeout_s=30.0, correctness_rounds=2)
GPU = DeviceInfo("cuda", "synthetic GPU (gate 3 simulated over the CPU verifier)", cores=132)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    device = describe("cpu")
    kbc = kb_context(device)
    hooks = [h for h in [constraint_hook(kbc)] if h]
    with Verifier(PROBLEM, device, SETTINGS, tmp_path_factory.mktemp("verifier"), hooks, kbc.entry) as verifier:
        yield device, kbc, verifier


class Run:
    """One stage of the llm engine with the pipeline's evaluate/choose, in a fresh run folder."""

    def __init__(self, shared, tmp_path: Path, model, stage: str = "memory_access", device=None, wrap=None, **cfg):
        cpu, self.kbc, self.verifier = shared
        self.device = device or cpu
        self.model = model
        defaults = {"max_iters": 3, "best_k": 1, "retries": 0, "backoff_s": 0.0, "timeout_s": 30.0}
        self.config = LMConfig(**{**defaults, **cfg}).with_lm(model.lm())
        self.pipe = Pipeline(PROBLEM, PortOptions(device="cpu", engine="llm", llm=self.config, settings=SETTINGS))
        self.store = RunStore(tmp_path / "run")
        self.store.root.mkdir(parents=True)
        start = self.store.root / "baseline" / "kernel.py"
        start.parent.mkdir(parents=True)
        start.write_text(START)
        self.stage = stages.BY_NAME[stage]
        self.ctx = self.pipe.context(self.device, self.kbc, START, self.store.root)
        self.wrap = wrap
        self.log: list[str] = []
        self.sleeps: list[float] = []
        self.engine = LLMEngine(self.config, LMClient(self.config, sleep=self.sleeps.append, progress=self.log.append),
                                progress=self.log.append)
        self.evaluated = 0

    def evaluate(self, cand):
        self.evaluated += 1
        out = self.pipe._evaluate(self.store, self.verifier, self.stage, cand, self.store.root / "baseline" / "kernel.py",
                                  START)
        return self.wrap(self.evaluated, out) if self.wrap else out

    def choose(self, outcomes):
        best = self.pipe._choose(outcomes, self.device)
        if best is not None:
            best.adopted = True
        return best

    def go(self):
        records = self.engine.run_stage(self.stage, self.ctx, self.evaluate, self.choose)
        assert len(records) == 1 and records[0].engine == "llm"
        return records[0]

    def llm_json(self, rec):
        return [json.loads((self.store.root / "trials" / o.trial / "llm.json").read_text()) for o in rec.outcomes]


# ------------------------------------------------------------------------------------------------ the loop
def test_correct_candidate_first_time(shared, tmp_path):
    model = scripted([kernel_answer(GOOD, "BLOCK 64 -> 128: fewer programs")])
    run = Run(shared, tmp_path, model)
    rec = run.go()
    assert [o.verdict.correct for o in rec.outcomes] == [True]
    assert rec.best is rec.outcomes[0] and rec.best.adopted
    assert rec.best.candidate.source.strip() == GOOD.strip() and rec.best.candidate.kind == "rewrite"
    # on the interpreter the model is never told "accepted"; it is told the speed was not measured
    rec_json = run.llm_json(rec)[0]
    assert rec_json["headline"] == "CORRECT; speed not measured" and "ACCEPTED" not in rec_json["feedback"]
    assert rec_json["status"] == "correct-unmeasured"
    # the record holds the exact messages, the answer, token counts; never a key
    call = rec_json["calls"][-1]
    assert call["messages"][0]["role"] == "system" and "[[ ## brief ## ]]" in call["messages"][-1]["content"]
    assert "BLOCK 64 -> 128" in call["response"] and call["total_tokens"] > 0
    assert (run.store.root / "llm" / "04-memory_access" / "analysis.json").exists()
    usage = json.loads((run.store.root / "llm" / "usage.json").read_text())
    assert usage["usage"]["calls"] == 2 and "api_key" not in json.dumps(usage)
    # one candidate sufficed; on a device that times nothing, no second round was asked for
    assert len(model.prompts()) == 1 and "model use in this stage: 2 call(s)" in rec.note


def test_wrong_candidate_then_fix_after_feedback(shared, tmp_path):
    model = scripted([kernel_answer(WRONG, "subtract by mistake"), kernel_answer(GOOD, "fixed the sign")])
    run = Run(shared, tmp_path, model)
    rec = run.go()
    assert [o.verdict.correct for o in rec.outcomes] == [False, True]
    assert rec.outcomes[0].verdict.failed_gate.gate == "2-correctness"
    assert rec.best is rec.outcomes[1]
    first, second = model.prompts()
    assert "Earlier attempts" not in first
    # the verifier's words reached the second prompt: gate, worst element, and the rejected code
    assert "REJECTED at gate 2-correctness" in second and "worst at index" in second and "expected" in second
    assert "subtract by mistake" in second and "x - y, mask=mask" in second
    assert rec.outcomes[0].verdict.feedback().split(":", 1)[1].strip()[:60] in second


def test_garbage_answer_is_feedback_not_a_crash(shared, tmp_path):
    lenient = "Sure! Here is the kernel:\n```python\n" + GOOD + "```\nHope this helps."
    model = scripted(["I am sorry, I cannot help with GPU kernels.", lenient])
    run = Run(shared, tmp_path, model)
    rec = run.go()
    # the garbage answer never reached the verifier; the next prompt says why
    assert len(rec.outcomes) == 1 and rec.outcomes[0].verdict.correct
    second = model.prompts()[1]
    assert "NO KERNEL in the answer" in second and "did not follow the field format" in second
    garbage = json.loads((run.store.root / "llm" / "04-memory_access" / "c1-r1.json").read_text())
    assert garbage["status"] == "no-code" and "cannot help" in garbage["calls"][0]["response"]
    # the second answer ignored the field format: extracted leniently from its fenced block, then verified
    assert run.llm_json(rec)[0]["extraction"].startswith("python block in the raw answer")


def test_invalid_code_is_rejected_before_the_verifier(shared, tmp_path):
    broken = GOOD.replace("def forward(self, x, y):", "def forward(self, x, y)")
    model = scripted([kernel_answer(broken), kernel_answer(START), kernel_answer(GOOD)])
    run = Run(shared, tmp_path, model)
    rec = run.go()
    assert run.evaluated == 1 and rec.outcomes[0].verdict.correct
    prompts = model.prompts()
    assert "INVALID kernel file (not verified)" in prompts[1] and "does not parse" in prompts[1]
    assert "identical to the current kernel" in prompts[2]
    assert len(list((run.store.root / "trials").glob("*"))) == 1


def test_exception_from_the_model_at_first_call_is_an_engine_error(shared, tmp_path):
    model = scripted([], analysis=RuntimeError("the provider exploded"))
    run = Run(shared, tmp_path, model)
    with pytest.raises(EngineError) as err:
        run.go()
    text = err.value.render()
    assert "did not answer its first call" in text and "the provider exploded" in text and "fix:" in text
    assert not (run.store.root / "trials").exists()
    failed = json.loads((run.store.root / "llm" / "04-memory_access" / "analysis-failed.json").read_text())
    assert "exploded" in failed["error"]


def test_exception_after_the_model_answered_stops_the_stage_with_a_note(shared, tmp_path):
    model = scripted([kernel_answer(WRONG), lm15.ServerError("upstream 500"), lm15.ServerError("upstream 500")])
    run = Run(shared, tmp_path, model, retries=1)
    rec = run.go()
    # one retry with backoff, then the stage stops honestly; nothing adopted
    assert run.sleeps == [0.0] and rec.best is None and len(rec.outcomes) == 1
    assert "stopped: the model stopped answering (server)" in rec.note and "upstream 500" in rec.note
    assert any("retry 1/1" in line for line in run.log)


def test_rate_limit_is_retried_with_backoff(shared, tmp_path):
    model = scripted([lm15.RateLimitError("slow down"), lm15.RateLimitError("slow down"), kernel_answer(GOOD)])
    run = Run(shared, tmp_path, model, retries=3, backoff_s=1.5, backoff_max_s=2.0)
    rec = run.go()
    assert run.sleeps == [1.5, 2.0]  # doubled, capped by XEFORGE_LLM_BACKOFF_MAX
    assert rec.best is not None and run.engine.client.usage.retries == 2


def test_timeout_at_first_call_is_an_engine_error(shared, tmp_path):
    model = scripted([], analysis=Sleep(1.5, dict(bottlenecks=[], plan="", worth_trying=True, reason="late")))
    run = Run(shared, tmp_path, model, timeout_s=0.2)
    with pytest.raises(EngineError) as err:
        run.go()
    assert "(timeout)" in err.value.render() and "XEFORGE_LLM_TIMEOUT" in err.value.render()


def test_timeout_later_stops_the_stage(shared, tmp_path):
    model = scripted([Sleep(1.5, kernel_answer(GOOD)), Sleep(1.5, kernel_answer(GOOD))])
    run = Run(shared, tmp_path, model, timeout_s=0.2, retries=1)
    rec = run.go()
    assert rec.outcomes == [] and rec.best is None
    assert "stopped: the model stopped answering (timeout)" in rec.note
    failed = json.loads((run.store.root / "llm" / "04-memory_access" / "c1-r1-failed.json").read_text())
    assert [c["error_kind"] for c in failed["calls"]] == ["timeout", "timeout"]


def test_budget_exhaustion_stops_the_loop_with_a_note(shared, tmp_path):
    model = scripted([kernel_answer(WRONG), kernel_answer(WRONG.replace("BLOCK=128", "BLOCK=256")),
                      kernel_answer(GOOD)])
    run = Run(shared, tmp_path, model, max_calls=3)
    rec = run.go()
    assert len(rec.outcomes) == 2 and rec.best is None and model.remaining == 1
    assert "stopped: the budget of 3 model calls per run is spent (XEFORGE_LLM_MAX_CALLS)" in rec.note
    # the next stage does not call the model at all
    run.stage = stages.BY_NAME["fusion"]
    rec2 = run.go()
    assert rec2.outcomes == [] and "budget" in rec2.note and run.engine.client.usage.calls == 3


def test_token_budget(shared, tmp_path):
    model = scripted([kernel_answer(WRONG), kernel_answer(GOOD)])
    run = Run(shared, tmp_path, model, max_total_tokens=1000)  # the analysis call alone uses more
    rec = run.go()
    assert rec.outcomes == [] and "tokens per run is spent" in rec.note


def test_correct_but_slower_is_rejected_and_the_model_is_told(shared, tmp_path):
    """Gate 3 cannot run on the CPU: the real verdict is extended with a simulated gate-3 result."""

    def simulate_gpu(n, outcome):
        v = outcome.verdict
        assert v.correct, v.feedback()
        speedup = 0.91 if n == 1 else 1.25
        timing = {"variant": "bench-gpu", "speedup": speedup, "margin": 0.03,
                  "incumbent": {"median_ms": 1.0, "iqr_ms": 0.01}, "candidate": {"median_ms": 1.0 / speedup, "iqr_ms": 0.02}}
        ok = speedup > 1.03
        v.gates = [g for g in v.gates if g.gate != "3-performance"] + [
            GateResult("3-performance", "pass" if ok else "fail", ("faster" if ok else "not faster beyond the noise margin")
                       + f": speedup {speedup:.3f}x", timing)]
        v.timed, v.speedup, v.margin, v.accepted = True, speedup, 0.03, ok
        return outcome

    model = scripted([kernel_answer(GOOD, "bigger tiles"), kernel_answer(GOOD_2, "smaller tiles"), kernel_answer(START)])
    run = Run(shared, tmp_path, model, device=GPU, wrap=simulate_gpu)
    rec = run.go()
    assert [o.verdict.accepted for o in rec.outcomes] == [False, True]
    assert rec.best is rec.outcomes[1] and model.remaining == 1  # stopped refining once accepted
    second = model.prompts()[1]
    assert "REJECTED: correct on every variant, but not faster than the current kernel" in second
    assert "median speedup 0.910x" in second and "needed more than 1.030x" in second
    assert "ACCEPTED" not in second
    assert run.llm_json(rec)[1]["headline"].startswith("ACCEPTED")


def test_best_k_independent_candidates_on_a_timing_device(shared, tmp_path):
    def slow(n, outcome):
        v = outcome.verdict
        v.gates.append(GateResult("3-performance", "fail", "not faster", {"speedup": 0.9, "margin": 0.02}))
        v.timed, v.speedup, v.margin = True, 0.9, 0.02
        return outcome

    model = scripted([kernel_answer(GOOD), kernel_answer(GOOD), kernel_answer(GOOD_2)])
    run = Run(shared, tmp_path, model, device=GPU, wrap=slow, max_iters=1, best_k=2)
    rec = run.go()
    # candidate 2 starts fresh (independent): its prompt shows no attempts of candidate 1
    p1, p2 = model.prompts()
    assert "Earlier attempts" not in p2
    assert len(rec.outcomes) == 1 and rec.best is None  # the second answer duplicated the first: not re-verified
    dup = json.loads((run.store.root / "llm" / "04-memory_access" / "c2-r1.json").read_text())
    assert dup["status"] == "duplicate"


def test_analysis_can_skip_a_stage_without_issues(shared, tmp_path):
    model = scripted([kernel_answer(GOOD)], analysis=dict(bottlenecks=[], plan="", worth_trying=False,
                                                          reason="already a single elementwise kernel"))
    run = Run(shared, tmp_path, model, stage="fusion")
    rec = run.go()
    assert rec.applies is False and "already a single elementwise kernel" in rec.reason
    assert rec.outcomes == [] and model.remaining == 1


def test_context_overflow_trims_the_oldest_attempts_keeping_the_best(shared, tmp_path):
    from cover_agent.prompts import render_stage

    static_fail = GOOD.replace("        return out", "        return torch.add(out, 0.0)")  # gate 1: torch compute
    model = scripted([kernel_answer(GOOD.replace("x + y, mask", "x * y, mask"), "attempt A"),  # reaches gate 2
                      kernel_answer(static_fail, "attempt B"),
                      kernel_answer(static_fail.replace("torch.add(out, 0.0)", "torch.mul(out, 1.0)"), "attempt C"),
                      kernel_answer(GOOD, "attempt D")])
    run = Run(shared, tmp_path, model, max_iters=4, analyze=False)
    base = len(render_stage(run.stage, run.ctx, run.stage.detect(run.ctx), run.kbc, []).text)
    # a context window that holds the brief, one attempt with its code (~1 kB) and one without, not more
    run.engine.config = replace(run.config, context_tokens=int((base + 1750) / 3.5) + 8192 + 1200)
    rec = run.go()
    assert rec.best is not None and rec.best.verdict.correct
    last = model.prompts()[-1]
    assert "1 older attempt(s) of 3 left out" in last
    assert "attempt A" in last and "attempt C" in last and "attempt B" not in last  # the best (A) is kept
    assert "x * y, mask" not in last and "torch.mul(out, 1.0)" in last  # ... without its code; the latest with it


# ------------------------------------------------------------------------------------------------ a real pipeline
def test_pipeline_runs_the_llm_engine_end_to_end(tmp_path):
    model = scripted([kernel_answer(WRONG, "first try"), kernel_answer(GOOD, "second try")])
    cfg = LMConfig(max_iters=2, best_k=1, retries=0).with_lm(model.lm())
    opts = PortOptions(device="cpu", engine="llm", stages=["memory_access"], llm=cfg, settings=SETTINGS,
                       run_dir=tmp_path / "run")
    report = Pipeline(PROBLEM, opts).run()
    st = report["stages"][0]
    assert report["engine"] == "llm" and st["name"] == "memory_access" and st["status"] == "ran"
    tactic = st["tactics"][0]
    assert tactic["engine"] == "llm" and [c["correct"] for c in tactic["candidates"]] == [False, True]
    assert tactic["candidates"][1]["adopted"] and "model use in this stage" in tactic["note"]
    assert report["final"]["claim"] == "correct on every variant; speed not measured on the CPU interpreter"
    assert (tmp_path / "run" / "final" / "kernel.py").read_text().strip() == GOOD.strip()


def test_cli_llm_engine_without_a_model_exits_nonzero_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "xeforge", "port", str(VADD), "--device", "cpu", "--engine", "llm",
                           "--run-dir", str(tmp_path / "r")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no LLM is configured" in proc.stderr and "XEFORGE_MODEL" in proc.stderr


# ------------------------------------------------------------------------------------------------ a real dspy.LM over HTTP
class _FakeOpenAI(BaseHTTPRequestHandler):
    answers: list[str] = []
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server naming)
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        _FakeOpenAI.bodies.append(body)
        text = _FakeOpenAI.answers.pop(0) if _FakeOpenAI.answers else "no more answers"
        data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body.get("model"),
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": text}}],
                           "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakeOpenAI.bodies.clear()
    yield server
    server.shutdown()
    server.server_close()


def _http_config(base: str, model: str = "hosted_vllm/test-coder", **env) -> LMConfig:
    import argparse

    args = argparse.Namespace(model=model, api_base=base, max_iters=2, best_k=1)
    return LMConfig.from_args(args, env={"XEFORGE_LLM_RETRIES": "0", **env})


@pytest.mark.parametrize("model", ["hosted_vllm/test-coder", "openai/test-coder"])
def test_openai_compatible_server_through_litellm_model_string(shared, tmp_path, fake_server, model):
    base = f"http://127.0.0.1:{fake_server.server_address[1]}/v1"
    _FakeOpenAI.answers = [answer(bottlenecks=["tiny blocks"], plan="bigger blocks", worth_trying=True, reason="ok"),
                           kernel_answer(GOOD, "BLOCK 128")]
    cfg = _http_config(base, model)
    run = Run(shared, tmp_path, scripted([]))
    run.config = cfg
    run.engine = LLMEngine(cfg, LMClient(cfg, progress=run.log.append), progress=run.log.append)
    rec = run.go()
    assert rec.best is not None and rec.best.verdict.correct
    assert _FakeOpenAI.bodies[-1]["model"] == "test-coder" and "tiny blocks" in _FakeOpenAI.bodies[-1]["messages"][-1]["content"]
    call = run.llm_json(rec)[0]["calls"][0]
    assert call["total_tokens"] == 1200 and call["tokens_estimated"] is False


def test_unreachable_server_is_an_engine_error(shared, tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _http_config(f"http://127.0.0.1:{port}/v1")
    run = Run(shared, tmp_path, scripted([]))
    run.engine = LLMEngine(cfg, LMClient(cfg, progress=run.log.append), progress=run.log.append)
    with pytest.raises(EngineError) as err:
        run.go()
    text = err.value.render()
    assert "did not answer its first call (transport)" in text and f"127.0.0.1:{port}" in text


def test_provider_context_overflow_is_handled(shared, tmp_path):
    too_long = lm15.ContextLengthError("maximum context length is 4096 tokens")
    model = scripted([too_long, too_long], analysis=too_long)
    run = Run(shared, tmp_path, model, max_iters=1)
    rec = run.go()
    # the analysis is skipped, the proposal is retried with a tighter trim (nothing left to trim), then given up
    assert rec.outcomes == [] and "does not fit the model's context window" in rec.note
    assert "XEFORGE_LLM_CONTEXT_TOKENS" in rec.note
