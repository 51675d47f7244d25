"""The CoVeR loop driven by a scripted model through the REAL verifier on the CPU interpreter.

Each test scripts the model's answers (cover_agent.scripted, a DSPy engine behind a real dspy.LM and the real
chat adapter), runs one stage of the llm engine with the pipeline's own evaluate/choose (trial store + verifier
cascade), and checks what was verified, what the model was told, and what landed in the run folder. One
Verifier is shared by the module; each test gets its own run folder.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from dspy import lm15

import stages
from cover_agent.client import LMClient
from cover_agent.config import LMConfig
from cover_agent.engine import LLMEngine
from cover_agent.scripted import answer, kernel_answer, scripted
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
        defaults = {"max_iters": 3, "best_k": 1, "retries": 0, "timeout_s": 30.0}
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
        self.engine = LLMEngine(self.config, LMClient(self.config, progress=self.log.append), progress=self.log.append)
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
    # retry_after=0: DSPy's retry loop waits what the provider says (here nothing) instead of its 1 s backoff
    boom = lm15.ServerError("upstream 500", retry_after=0.0)
    model = scripted([kernel_answer(WRONG), boom, boom, kernel_answer(GOOD)])
    run = Run(shared, tmp_path, model, retries=1)
    rec = run.go()
    # DSPy retried once (XEFORGE_LLM_RETRIES=1), then the stage stops honestly; nothing adopted
    assert model.remaining == 1 and rec.best is None and len(rec.outcomes) == 1
    assert "stopped: the model stopped answering (server)" in rec.note and "upstream 500" in rec.note
    assert rec.tally["call server"] == 1 and run.engine.client.usage.failed == 1


def test_rate_limit_is_retried_by_dspy(shared, tmp_path):
    slow = lm15.RateLimitError("slow down", retry_after=0.0)
    model = scripted([slow, slow, kernel_answer(GOOD)])
    run = Run(shared, tmp_path, model, retries=3)
    rec = run.go()
    # the two rate limits were retried inside one call: one call answered, no failure recorded
    assert rec.best is not None and model.remaining == 0
    usage = run.engine.client.usage
    assert (usage.calls, usage.answered, usage.failed) == (2, 2, 0) and "call rate-limit" not in rec.tally


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


def test_provider_context_overflow_is_handled(shared, tmp_path):
    too_long = lm15.ContextLengthError("maximum context length is 4096 tokens")
    model = scripted([too_long, too_long], analysis=too_long)
    run = Run(shared, tmp_path, model, max_iters=1)
    rec = run.go()
    # the analysis is skipped, the proposal is retried with a tighter trim (nothing left to trim), then given up
    assert rec.outcomes == [] and "does not fit the model's context window" in rec.note
    assert "XEFORGE_LLM_CONTEXT_TOKENS" in rec.note


# ------------------------------------------------------------------------------------------------ real HTTP
# A small OpenAI-compatible server on 127.0.0.1 (the way vLLM, llama.cpp and Ollama serve models) drives the
# real client (dspy.LM on the route LMConfig chooses) through both ways a user configures it. Bounded: at most
# MAX_REQUESTS requests per test, a hang lasts at most HANG_MAX_S and ends early when the client goes away.
MAX_REQUESTS = 30
HANG_MAX_S = 4.0
VLLM_OVERFLOW = {"error": {"message": "This model's maximum context length is 4096 tokens. However, you requested "
                                      "9000 tokens (8000 in the messages, 1000 in the completion). Please reduce the "
                                      "length of the messages or completion.", "type": "BadRequestError",
                           "param": None, "code": 400}}
OPENAI_OVERFLOW = {"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages "
                                        "resulted in 130000 tokens. Please reduce the length of the messages.",
                             "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
LLAMACPP_OVERFLOW = {"error": {"code": 400, "message": "the request exceeds the available context size, try "
                               "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 9000,
                               "n_ctx": 4096}}


class Status:
    """Script item: answer with this HTTP status, JSON body and headers."""

    def __init__(self, code: int, body: dict, headers: dict | None = None):
        self.code, self.body, self.headers = code, body, headers or {}


class Hang:
    """Script item: send nothing for ``seconds`` (then an answer, if the client is still there)."""

    def __init__(self, seconds: float, then: str = "too late"):
        self.seconds, self.then = min(seconds, HANG_MAX_S), then


class _FakeOpenAI(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: list = []  # str (the answer's text) | Status | Hang, one per POST /v1/chat/completions
    bodies: list[dict] = []  # every chat request's JSON
    times: list[float] = []  # when each chat request arrived (time.monotonic())
    headers_seen: list[dict] = []
    paths: list[str] = []  # "GET /v1/models", "POST /v1/chat/completions", ...
    cancelled: list[float] = []  # hangs whose client closed the connection before the answer (seconds in)
    served: list[str] = ["test-coder"]

    def _reply(self, code: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _bounded(self, what: str) -> bool:
        _FakeOpenAI.paths.append(what)
        _FakeOpenAI.headers_seen.append(dict(self.headers))
        if len(_FakeOpenAI.paths) > MAX_REQUESTS:
            self._reply(503, {"error": {"message": "test server: too many requests"}})
            return False
        return True

    def do_GET(self):  # noqa: N802 (http.server naming)
        if not self._bounded(f"GET {self.path}"):
            return
        if self.path.rstrip("/") == "/v1/models":
            return self._reply(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.served]})
        self._reply(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if not self._bounded(f"POST {self.path}"):
            return
        if self.path != "/v1/chat/completions":
            return self._reply(404, {"detail": "Not Found"})
        _FakeOpenAI.bodies.append(body)
        _FakeOpenAI.times.append(time.monotonic())
        item = _FakeOpenAI.script.pop(0) if _FakeOpenAI.script else "no more answers"
        if isinstance(item, Hang):
            t0 = time.monotonic()
            while time.monotonic() - t0 < item.seconds:
                ready, _, _ = select.select([self.connection], [], [], 0.05)
                if ready and self.connection.recv(1, socket.MSG_PEEK) == b"":
                    _FakeOpenAI.cancelled.append(round(time.monotonic() - t0, 2))
                    self.close_connection = True
                    return
            item = item.then
        if isinstance(item, Status):
            return self._reply(item.code, item.body, item.headers)
        self._reply(200, {"id": "x", "object": "chat.completion", "created": 0, "model": body.get("model"),
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": item}}],
                          "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}})

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    server.daemon_threads = True
    for name in ("script", "bodies", "times", "headers_seen", "paths", "cancelled"):
        setattr(_FakeOpenAI, name, [])
    _FakeOpenAI.served = ["test-coder"]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield server
    server.shutdown()
    server.server_close()


#: the two ways a user configures a local server: the README's environment recipe, and the flags
CONFIGS = ["env", "flags"]


def _http_config(how: str, base: str, monkeypatch, model: str = "hosted_vllm/test-coder", **env) -> LMConfig:
    import argparse

    settings = {"XEFORGE_LLM_RETRIES": "0", "XEFORGE_LLM_TIMEOUT": "1.5", "XEFORGE_LLM_MAX_ITERS": "2",
                "XEFORGE_LLM_BEST_K": "1", **env}
    if how == "env":  # XEFORGE_MODEL=hosted_vllm/<model> OPENAI_API_BASE=http://host:port/v1, as DSPy also sees it
        monkeypatch.setenv("OPENAI_API_BASE", base)
        args = argparse.Namespace(model=None, api_base=None, max_iters=None, best_k=None)
        return LMConfig.from_args(args, env={"XEFORGE_MODEL": model, "OPENAI_API_BASE": base, **settings})
    if how == "litellm":  # the flags, through LiteLLM (XEFORGE_LLM_ROUTE=litellm; its import takes seconds: slow)
        settings["XEFORGE_LLM_ROUTE"] = "litellm"
    args = argparse.Namespace(model=model, api_base=base, max_iters=None, best_k=None)  # --model ... --api-base ...
    return LMConfig.from_args(args, env=settings)


def _http_run(shared, tmp_path, cfg: LMConfig, **kw) -> Run:
    """A Run whose engine is built as the pipeline builds it (LLMEngine.from_options: client, then the probe)."""
    import argparse

    run = Run(shared, tmp_path, scripted([]), **kw)
    run.config = cfg
    run.engine = LLMEngine.from_options(argparse.Namespace(llm=cfg), progress=run.log.append)
    return run


@pytest.mark.parametrize("how", CONFIGS)
def test_http_good_answer(shared, tmp_path, fake_server, monkeypatch, how):
    _FakeOpenAI.script = [answer(bottlenecks=["tiny blocks"], plan="bigger blocks", worth_trying=True, reason="ok"),
                          kernel_answer(GOOD, "BLOCK 128")]
    cfg = _http_config(how, fake_server.base, monkeypatch)
    assert cfg.api_base == fake_server.base and cfg.client_route == "dspy"
    run = _http_run(shared, tmp_path, cfg)
    rec = run.go()
    assert rec.best is not None and rec.best.verdict.correct
    # the probe came first, then the two calls, all on the configured server's OpenAI paths
    assert _FakeOpenAI.paths == ["GET /v1/models", "POST /v1/chat/completions", "POST /v1/chat/completions"]
    assert any("the server at" in line and "answers via DSPy's own client" in line for line in run.log)
    assert _FakeOpenAI.bodies[-1]["model"] == "test-coder" and "tiny blocks" in _FakeOpenAI.bodies[-1]["messages"][-1]["content"]
    call = run.llm_json(rec)[0]["calls"][0]
    assert call["total_tokens"] == 1200 and call["tokens_estimated"] is False
    assert rec.tally == {"correct-unmeasured": 1}


@pytest.mark.parametrize("how", CONFIGS)
def test_http_wrong_then_right_feedback_reaches_the_second_request(shared, tmp_path, fake_server, monkeypatch, how):
    _FakeOpenAI.script = [kernel_answer(WRONG, "subtract by mistake"), kernel_answer(GOOD, "fixed the sign")]
    run = _http_run(shared, tmp_path, _http_config(how, fake_server.base, monkeypatch, XEFORGE_LLM_ANALYZE="0"))
    rec = run.go()
    assert [o.verdict.correct for o in rec.outcomes] == [False, True] and rec.best is rec.outcomes[1]
    second = _FakeOpenAI.bodies[1]["messages"][-1]["content"]
    assert "REJECTED at gate 2-correctness" in second and "worst at index" in second and "x - y, mask=mask" in second
    assert rec.tally == {"rejected: 2-correctness": 1, "correct-unmeasured": 1}


@pytest.mark.parametrize("how", CONFIGS)
def test_http_garbage_is_feedback(shared, tmp_path, fake_server, monkeypatch, how):
    _FakeOpenAI.script = ["I am sorry, I cannot help with GPU kernels.", kernel_answer(GOOD)]
    run = _http_run(shared, tmp_path, _http_config(how, fake_server.base, monkeypatch, XEFORGE_LLM_ANALYZE="0"))
    rec = run.go()
    assert len(rec.outcomes) == 1 and rec.outcomes[0].verdict.correct
    assert "NO KERNEL in the answer" in _FakeOpenAI.bodies[1]["messages"][-1]["content"]
    assert rec.tally == {"no-code": 1, "correct-unmeasured": 1}


@pytest.mark.parametrize("how", CONFIGS)
def test_http_500_then_success_is_retried(shared, tmp_path, fake_server, monkeypatch, how):
    _FakeOpenAI.script = [Status(500, {"error": {"message": "upstream exploded"}}), kernel_answer(GOOD)]
    cfg = _http_config(how, fake_server.base, monkeypatch, XEFORGE_LLM_ANALYZE="0", XEFORGE_LLM_RETRIES="2")
    run = _http_run(shared, tmp_path, cfg)
    assert run.engine.client.lm.num_retries == 2  # XEFORGE_LLM_RETRIES is DSPy's own retry count
    rec = run.go()
    # DSPy retried the 500 inside the one call, after its first backoff (1 s); the call counts as answered
    assert rec.best is not None and _FakeOpenAI.paths.count("POST /v1/chat/completions") == 2
    assert 0.9 <= _FakeOpenAI.times[1] - _FakeOpenAI.times[0] < 1.9
    assert rec.tally == {"correct-unmeasured": 1} and run.engine.client.usage.calls == 1


@pytest.mark.parametrize("how", CONFIGS)
def test_http_500_without_retries_is_the_failure(shared, tmp_path, fake_server, monkeypatch, how):
    """The retries are DSPy's: with XEFORGE_LLM_RETRIES=0 the same 500 is not retried, and is reported."""
    _FakeOpenAI.script = [Status(500, {"error": {"message": "upstream exploded"}}), kernel_answer(GOOD)]
    cfg = _http_config(how, fake_server.base, monkeypatch, XEFORGE_LLM_ANALYZE="0", XEFORGE_LLM_RETRIES="0")
    run = _http_run(shared, tmp_path, cfg)
    assert run.engine.client.lm.num_retries == 0
    with pytest.raises(EngineError) as err:
        run.go()
    assert "did not answer its first call (server)" in err.value.render() and "upstream exploded" in err.value.render()
    assert _FakeOpenAI.paths.count("POST /v1/chat/completions") == 1


@pytest.mark.parametrize("how", CONFIGS)
def test_http_429_honours_retry_after(shared, tmp_path, fake_server, monkeypatch, how):
    _FakeOpenAI.script = [Status(429, {"error": {"message": "slow down", "type": "rate_limit_error"}},
                                 {"Retry-After": "1.5"}), kernel_answer(GOOD)]
    cfg = _http_config(how, fake_server.base, monkeypatch, XEFORGE_LLM_ANALYZE="0", XEFORGE_LLM_RETRIES="1")
    run = _http_run(shared, tmp_path, cfg)
    rec = run.go()
    # DSPy waited the server's Retry-After (1.5 s), not its own first backoff (1 s)
    assert rec.best is not None and len(_FakeOpenAI.times) == 2
    assert 1.45 <= _FakeOpenAI.times[1] - _FakeOpenAI.times[0] < 2.5
    assert run.engine.client.usage.calls == 1 and run.engine.client.usage.failed == 0


@pytest.mark.parametrize("how", CONFIGS)
def test_http_hang_past_the_timeout_at_first_call(shared, tmp_path, fake_server, monkeypatch, how):
    _FakeOpenAI.script = [Hang(3.0)]
    cfg = _http_config(how, fake_server.base, monkeypatch, XEFORGE_LLM_ANALYZE="0", XEFORGE_LLM_TIMEOUT="0.8")
    run = _http_run(shared, tmp_path, cfg)
    with pytest.raises(EngineError) as err:
        run.go()
    text = err.value.render()
    # reported as a timeout with the setting that controls it, not as a dead server
    assert "did not answer its first call (timeout)" in text and "XEFORGE_LLM_TIMEOUT" in text
    assert "no answer within 0.8 s" in text and "is running" not in text
    # the call given up was cancelled: the server saw the client close the connection, well before its answer
    deadline = time.monotonic() + 2.0
    while not _FakeOpenAI.cancelled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _FakeOpenAI.cancelled and _FakeOpenAI.cancelled[0] < 2.0
    failed = json.loads((run.store.root / "llm" / "04-memory_access" / "c1-r1-failed.json").read_text())
    assert [c["error_kind"] for c in failed["calls"]] == ["timeout"] and failed["calls"][0]["elapsed_s"] < 1.6


@pytest.mark.parametrize("how", CONFIGS)
def test_http_timeout_later_stops_the_stage(shared, tmp_path, fake_server, monkeypatch, how):
    _FakeOpenAI.script = [kernel_answer(WRONG), Hang(2.0), Hang(2.0)]
    cfg = _http_config(how, fake_server.base, monkeypatch, XEFORGE_LLM_ANALYZE="0", XEFORGE_LLM_TIMEOUT="0.6",
                       XEFORGE_LLM_RETRIES="1")
    run = _http_run(shared, tmp_path, cfg)
    rec = run.go()
    assert rec.best is None and len(rec.outcomes) == 1
    assert "stopped: the model stopped answering (timeout)" in rec.note and "XEFORGE_LLM_TIMEOUT" in rec.note
    # DSPy retried the timed-out request once inside the call (the server saw both), then the call failed
    assert len(_FakeOpenAI.bodies) == 3
    assert rec.tally == {"rejected: 2-correctness": 1, "call timeout": 1, "stopped: timeout": 1}


@pytest.mark.parametrize("how", [*CONFIGS, pytest.param("litellm", marks=pytest.mark.slow)])
@pytest.mark.parametrize("overflow", [VLLM_OVERFLOW, OPENAI_OVERFLOW, LLAMACPP_OVERFLOW], ids=["vllm", "openai", "llamacpp"])
def test_http_context_length_400_trims_and_goes_on(shared, tmp_path, fake_server, monkeypatch, how, overflow):
    from cover_agent.prompts import render_stage

    second_wrong = WRONG.replace("x - y, mask", "x * y, mask")
    _FakeOpenAI.script = [kernel_answer(WRONG, "attempt A"), kernel_answer(second_wrong, "attempt B"),
                          Status(400, overflow), kernel_answer(GOOD, "attempt C")]
    cfg = _http_config(how, fake_server.base, monkeypatch, XEFORGE_LLM_ANALYZE="0", XEFORGE_LLM_MAX_ITERS="3")
    run = _http_run(shared, tmp_path, cfg)
    base = len(render_stage(run.stage, run.ctx, run.stage.detect(run.ctx), run.kbc, []).text)
    # a window that holds the brief and both attempts; half of it (the first trim) holds neither attempt's code
    run.engine.config = replace(cfg, context_tokens=int((base + 6000) / 3.5) + cfg.max_tokens + 1200)
    rec = run.go()
    assert rec.best is not None and rec.best.verdict.correct
    overflowed, trimmed = (b["messages"][-1]["content"] for b in _FakeOpenAI.bodies[2:4])
    assert len(trimmed) < len(overflowed) and "attempt B" in trimmed
    assert (run.store.root / "llm" / "04-memory_access" / "c1-r3-overflow.json").exists()
    assert any("does not fit the model's context" in line and "trimming" in line for line in run.log)


@pytest.mark.parametrize("how", CONFIGS)
def test_http_dead_server_is_found_by_the_probe(shared, tmp_path, monkeypatch, how):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _http_config(how, f"http://127.0.0.1:{port}/v1", monkeypatch)
    with pytest.raises(EngineError) as err:
        _http_run(shared, tmp_path, cfg)
    text = err.value.render()
    assert f"nothing answers at http://127.0.0.1:{port}/v1" in text and "start the model server" in text
    assert ("OPENAI_API_BASE" if how == "env" else "--api-base") in text


@pytest.mark.parametrize("how", CONFIGS)
def test_http_base_url_without_v1_is_named(shared, tmp_path, fake_server, monkeypatch, how):
    bare = fake_server.base[: -len("/v1")]
    with pytest.raises(EngineError) as err:
        _http_run(shared, tmp_path, _http_config(how, bare, monkeypatch))
    text = err.value.render()
    assert "the base URL lacks /v1" in text and f"--api-base {bare}/v1" in text and bare in text
    assert not _FakeOpenAI.bodies  # no model call was spent on it


@pytest.mark.parametrize("how", CONFIGS)
def test_http_unknown_model_lists_the_served_ones(shared, tmp_path, fake_server, monkeypatch, how):
    _FakeOpenAI.served = ["Qwen/Qwen2.5-Coder-32B-Instruct", "test-coder-7b"]
    with pytest.raises(EngineError) as err:
        _http_run(shared, tmp_path, _http_config(how, fake_server.base, monkeypatch))
    text = err.value.render()
    assert "does not serve 'test-coder'" in text and "Qwen/Qwen2.5-Coder-32B-Instruct, test-coder-7b" in text
    assert "--model hosted_vllm/Qwen/Qwen2.5-Coder-32B-Instruct" in text


def _doc_example(name: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The ``xeforge port`` command and environment of the docs/llm.md example marked ``<!-- example: name -->``,
    with its server's host and port replaced by the test server's."""
    import re
    import shlex

    doc = (ROOT / "docs" / "llm.md").read_text()
    m = re.search(rf"<!-- example: {name} -->\s*```\w*\n(.*?)```", doc, re.DOTALL)
    assert m, f"docs/llm.md has no example {name!r}"
    text = re.sub(r"http://(?:localhost|host):\d+", f"http://127.0.0.1:{port}", m.group(1).replace("\\\n", " "))
    env, argv = {}, None
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            words = words[1:]
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        if words[:2] == ["xeforge", "port"]:
            argv = words[1:]
    assert argv, f"the {name} example has no xeforge port command"
    return argv, env


@pytest.mark.parametrize("name,served", [("vllm", "Qwen/Qwen2.5-Coder-32B-Instruct"), ("llamacpp", "qwen.gguf"),
                                         ("ollama", "qwen2.5-coder:32b"), ("hosted", "gpt-4o")])
def test_docs_llm_examples_work_against_a_server(fake_server, tmp_path, monkeypatch, name, served):
    import argparse

    from xeforge.cli import build_parser

    port = fake_server.server_address[1]
    argv, env = _doc_example(name, port)
    if name == "hosted":  # the hosted API's own endpoint is not reachable here: the same call through a gateway URL
        env["OPENAI_API_BASE"] = fake_server.base
    for key in ("OPENAI_API_BASE", "OLLAMA_API_BASE", "HOSTED_VLLM_API_BASE", "XEFORGE_MODEL"):
        monkeypatch.delenv(key, raising=False)
    _FakeOpenAI.served = [served]
    _FakeOpenAI.script = [answer(bottlenecks=["x"], plan="y", worth_trying=True, reason="z")]
    args = build_parser().parse_args(argv)
    cfg = LMConfig.from_args(args, env={**env, "XEFORGE_LLM_RETRIES": "0", "XEFORGE_LLM_TIMEOUT": "2"})
    log: list[str] = []
    engine = LLMEngine.from_options(argparse.Namespace(llm=cfg), progress=log.append)
    result = engine.client.call("analysis", "the brief", f"{name} example")
    assert result.fields is not None and result.fields["plan"] == "y"
    assert _FakeOpenAI.paths == ["GET /v1/models", "POST /v1/chat/completions"]
    assert _FakeOpenAI.bodies[0]["model"] == cfg.model.split("/", 1)[1]
    if name == "hosted":  # the key reached the server, and nothing else
        assert _FakeOpenAI.headers_seen[-1].get("Authorization") == f"Bearer {env['OPENAI_API_KEY']}"
        assert env["OPENAI_API_KEY"] not in cfg.describe() + json.dumps(cfg.public_dict())


def test_failures_mean_the_same_on_the_litellm_route():
    """DSPy maps LiteLLM's exceptions to the same DSPy errors the HTTP tests meet on DSPy's own client; classify
    reads both alike (the LiteLLM route is driven over HTTP by the slow tests marked litellm below: importing
    litellm takes seconds)."""
    from dspy.utils.exceptions import (ContextWindowExceededError, LMInvalidRequestError, LMTimeoutError,
                                       LMTransportError)

    from cover_agent.client import _message, classify

    cfg = LMConfig(timeout_s=2.0, api_base="http://h:1/v1")
    vllm = ("litellm.BadRequestError: Hosted_vllmException - {\"object\": \"error\", \"message\": \"This model's "
            "maximum context length is 4096 tokens.\"}")
    assert classify(LMTimeoutError("litellm.Timeout: Read timed out", model="m", status=408)) == "timeout"
    assert classify(ContextWindowExceededError(message="too long", model="m", status=400)) == "context"
    assert classify(LMInvalidRequestError(vllm, model="m", status=400)) == "context"
    assert classify(LMInvalidRequestError("bad temperature", model="m", status=400)) == "request"
    assert classify(LMTransportError("Connection refused", model="m")) == "transport"
    assert classify(LMInvalidRequestError("", model="m", status=404)) == "not-found"
    text = _message(LMInvalidRequestError("", model="m", status=404), cfg)
    assert "HTTP 404" in text and "http://h:1/v1" in text
    assert "XEFORGE_LLM_TIMEOUT" in _message(LMTimeoutError("x", model="m"), cfg)


@pytest.mark.slow  # importing litellm takes seconds on 2 cores: make test-slow
def test_the_litellm_route_over_http_retries_a_500(shared, tmp_path, fake_server, monkeypatch):
    """XEFORGE_LLM_ROUTE=litellm, driven over HTTP like DSPy's own client: the same retry of a 500 inside one call
    (its context overflows: test_http_context_length_400_trims_and_goes_on[litellm-...])."""
    _FakeOpenAI.script = [Status(500, {"error": {"message": "upstream exploded"}}), kernel_answer(GOOD)]
    cfg = _http_config("litellm", fake_server.base, monkeypatch, XEFORGE_LLM_ANALYZE="0", XEFORGE_LLM_RETRIES="1")
    assert cfg.client_route == "litellm"
    run = _http_run(shared, tmp_path, cfg)
    rec = run.go()
    assert rec.best is not None and rec.best.verdict.correct and rec.tally == {"correct-unmeasured": 1}
    assert _FakeOpenAI.paths.count("POST /v1/chat/completions") == 2  # the 500, then the answer (one call)
    assert _FakeOpenAI.bodies[-1]["model"] == "test-coder" and run.engine.client.usage.calls == 1


# ------------------------------------------------------------------------------------------------ whole runs over HTTP
def _port(tmp_path, monkeypatch, base: str, *extra: str, model: str = "hosted_vllm/test-coder") -> int:
    """``xeforge port`` in this process, configured the README's way (XEFORGE_MODEL + OPENAI_API_BASE)."""
    from xeforge.cli import main

    for var, value in {"XEFORGE_MODEL": model, "OPENAI_API_BASE": base, "XEFORGE_LLM_RETRIES": "0",
                       "XEFORGE_LLM_TIMEOUT": "2", "XEFORGE_LLM_ANALYZE": "0", "XEFORGE_ROUNDS": "2"}.items():
        monkeypatch.setenv(var, value)
    return main(["port", str(VADD), "--device", "cpu", "--stages", "memory_access", "--max-iters", "2",
                 "--best-k", "1", "--run-dir", str(tmp_path / "run"), *extra])


def test_port_whose_model_never_gives_a_kernel_says_so_and_exits_3(tmp_path, fake_server, monkeypatch, capsys):
    _FakeOpenAI.script = ["I cannot help with that.", "Still no."]
    assert _port(tmp_path, monkeypatch, fake_server.base, "--engine", "llm") == 3
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["outcome"] == "no-usable-answer" and report["exit_code"] == 3
    assert report["final"]["claim"] == ("starting kernel returned: nothing adopted — the model's answers: 2 answer(s) "
                                        "with no kernel")
    md = (tmp_path / "run" / "report.md").read_text()
    assert "| no candidate: 2 answer(s) with no kernel |" in md and "none adopted (search results" not in md
    assert "exit status 3" in capsys.readouterr().err


def test_port_with_a_dead_server_stops_before_the_baseline(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert _port(tmp_path, monkeypatch, f"http://127.0.0.1:{port}/v1", "--engine", "llm") == 1
    assert not (tmp_path / "run" / "baseline" / "verdict.json").exists()  # no device time was spent


def test_port_auto_falls_back_and_the_report_says_why(tmp_path, fake_server, monkeypatch):
    bare = fake_server.base[: -len("/v1")]  # the server is up, but the base URL lacks /v1
    assert _port(tmp_path, monkeypatch, bare, "--engine", "auto") == 3
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["engine"] == "rules" and "lacks /v1" in report["engine_fallback"]
    assert "the llm engine fell back to the rules engine" in report["summary"]
    md = (tmp_path / "run" / "report.md").read_text()
    engine_line = next(line for line in md.splitlines() if line.startswith("| engine |"))
    assert "fell back from the llm engine" in engine_line and "lacks /v1" in engine_line


# ------------------------------------------------------------------------------------------------ compiling the prompts
def test_compile_with_bootstrap_fewshot_end_to_end(shared, tmp_path):
    """docs/llm.md's compile (scripts/compile_prompts.py -> cover_agent.optimize), against the scripted model and
    the real verifier: the brief is the stage's real one, the verifier judges the answer, the metric reads its
    verdict, and the answer it passed becomes the optimize predictor's demo (the other predictors get none)."""
    import importlib.util

    from cover_agent import optimize

    spec = importlib.util.spec_from_file_location("compile_prompts", ROOT / "scripts" / "compile_prompts.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    device, kbc, verifier = shared
    trainset, problems = script.trainset_for([VADD], "memory_access", device, kbc, SETTINGS)
    assert list(problems) == ["00-vadd"]
    verify_code = script.verify_with({"00-vadd": verifier}, tmp_path)
    verdicts = []

    def recording(problem, code):
        verdicts.append(verify_code(problem, code))
        return verdicts[-1]

    model = scripted([kernel_answer(WRONG, "subtract"), kernel_answer(GOOD, "bigger blocks")])
    log = optimize.MetricLog()
    compiled = optimize.compile_cover(trainset, recording, model.lm(), rounds=2, log=log)
    assert "# Stage 4 of 9: memory_access" in model.prompts()[0]  # the brief xeforge port would send
    # the real verifier rejected the subtraction at gate 2; the refine round read it and was correct
    assert [v.correct for v in verdicts] == [False, True] and verdicts[0].failed_gate.gate == "2-correctness"
    assert "REJECTED at gate 2-correctness" in model.prompts()[1]
    assert log.scores == [("00-vadd", 5 / 6)]  # the metric read the verdict on the best answer (correct)
    demos = compiled.optimize.demos
    assert len(demos) == 1 and demos[0].changes == "bigger blocks" and "BLOCK=128" in demos[0].kernel_code
    assert all(not p.demos for name, p in compiled.named_predictors() if name != "optimize")
    compiled.save(str(tmp_path / "compiled.json"))
    assert len(json.loads((tmp_path / "compiled.json").read_text())["optimize"]["demos"]) == 1
