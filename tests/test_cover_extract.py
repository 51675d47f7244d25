"""Extraction (lenient), validation (strict, never a repair), verdict feedback (honest) and attempt trimming."""

from __future__ import annotations

import pytest

from cover_agent.extract import extract_code, validate_code
from cover_agent.feedback import Attempt, best_attempt, trim_attempts, verdict_feedback
from xeforge.verifier import GateResult, Verdict

KERNEL = '''import torch
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class Model(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        k[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
        return out
'''
OTHER = KERNEL.replace("128", "256")


# ------------------------------------------------------------------------------------------------ extraction
def test_field_with_fenced_block():
    ext = extract_code(f"```python\n{KERNEL}```", None)
    assert ext.code == KERNEL and "kernel_code field" in ext.how


def test_largest_complete_block_wins_over_snippets():
    raw = f"Idea:\n```python\nx = 1\n```\nThe file:\n```python\n{KERNEL}```\nAnd a helper:\n```py\n@triton.jit\ndef f(): pass\n```"
    ext = extract_code(None, raw)
    assert ext.code == KERNEL and "largest complete python block of 3" in ext.how


def test_unfenced_code_and_field_markers_in_raw_answer():
    raw = f"[[ ## changes ## ]]\nbigger block\n\n[[ ## kernel_code ## ]]\n{KERNEL}\n[[ ## completed ## ]]"
    ext = extract_code(None, raw)
    assert ext.code.strip() == KERNEL.strip() and "kernel_code section" in ext.how


def test_unterminated_fence_is_taken_as_is():
    ext = extract_code(None, "```python\n" + KERNEL)
    assert ext.code.strip() == KERNEL.strip()


def test_split_blocks_are_not_glued_together():
    kernel_part, model_part = KERNEL.split("class Model")
    ext = extract_code(None, f"```python\n{kernel_part}```\n```python\nclass Model{model_part}```")
    assert ext.code is None and "ONE ```python block" in ext.problem


@pytest.mark.parametrize("raw", ["", "I cannot do that.", "```python\nprint('hello')\n```"])
def test_no_kernel_found(raw):
    ext = extract_code(None, raw)
    assert ext.code is None and "```python" in ext.problem


# ------------------------------------------------------------------------------------------------ validation
def test_valid_kernel():
    assert validate_code(OTHER, KERNEL) == []


def test_syntax_error_names_the_line_and_truncation():
    problems = validate_code(KERNEL.rsplit("\n", 4)[0] + "\n        k[(triton.cdiv(x.numel(), 128),)](x,", KERNEL)
    assert len(problems) == 1 and "does not parse: line" in problems[0] and "cut off" in problems[0]


@pytest.mark.parametrize("code,expected", [
    (KERNEL.replace("@triton.jit\n", ""), "no top-level @triton.jit kernel"),
    (KERNEL.replace("class Model", "class Net"), "no top-level class Model"),
    (KERNEL.replace("def forward", "def run"), "no forward method"),
    (KERNEL.replace("k[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)", "out.copy_(x)"),
     "is launched"),
])
def test_structural_problems(code, expected):
    problems = validate_code(code, "")
    assert any(expected in p for p in problems), problems


def test_identical_to_current_is_invalid_even_with_whitespace_changes():
    problems = validate_code(KERNEL.replace("\n", "   \n") + "\n\n", KERNEL)
    assert problems and "identical to the current kernel" in problems[0]


def test_validation_never_edits_the_code():
    code = KERNEL.replace("def forward", "def run")
    before = code
    validate_code(code, KERNEL)
    assert code == before


# ------------------------------------------------------------------------------------------------ feedback
OK0 = GateResult("0-isolation", "pass", "ran")
OK1 = GateResult("1-static", "pass", "ok")
OK2 = GateResult("2-correctness", "pass", "matches the float64 PyTorch reference on 9 rounds over ci")


def test_accepted_only_when_the_verifier_accepted():
    perf = GateResult("3-performance", "pass", "faster", {"speedup": 1.2, "margin": 0.02,
                                                         "incumbent": {"median_ms": 1.2, "iqr_ms": 0.01},
                                                         "candidate": {"median_ms": 1.0, "iqr_ms": 0.01}})
    status, headline, text = verdict_feedback(Verdict("h", [OK0, OK1, OK2, perf], True, True, True, 1.2, 0.02), True)
    assert status == "accepted" and headline.startswith("ACCEPTED") and "1.200x" in text and "1.020x" in text


def test_correct_on_the_interpreter_is_not_accepted():
    skipped = GateResult("3-performance", "skipped", "not timed: the CPU interpreter measures nothing about GPU speed")
    v = Verdict("h", [OK0, OK1, OK2, skipped], correct=True)
    status, headline, text = verdict_feedback(v, can_time=False)
    assert status == "correct-unmeasured" and headline == "CORRECT; speed not measured"
    assert "ACCEPTED" not in headline + text and "Speed not measured" in text
    # no gate 3 at all (no incumbent to time against): still not "accepted"
    status, headline, _ = verdict_feedback(Verdict("h", [OK0, OK1, OK2], correct=True), can_time=True)
    assert status == "correct-unmeasured"


def test_slower_candidate_is_rejected_with_timing_and_margin():
    timing = {"variant": "bench-gpu", "speedup": 0.97, "margin": 0.025, "incumbent": {"median_ms": 3.0, "iqr_ms": 0.03},
              "candidate": {"median_ms": 3.093, "iqr_ms": 0.05}}
    v = Verdict("h", [OK0, OK1, OK2, GateResult("3-performance", "fail", "not faster", timing)], correct=True,
                timed=True, speedup=0.97, margin=0.025)
    status, headline, text = verdict_feedback(v, can_time=True)
    assert status == "slower" and headline.startswith("REJECTED") and "not faster" in headline
    assert "median speedup 0.970x" in text and "needed more than 1.025x" in text
    assert "current kernel 3.0000 ms (IQR 0.0300), this candidate 3.0930 ms (IQR 0.0500)" in text


def test_implausibly_fast_candidate_is_explained():
    timing = {"speedup": 40.0, "margin": 0.02, "floor_ms": 1.0, "incumbent": {"median_ms": 4.0}, "candidate": {"median_ms": 0.1}}
    gate = GateResult("3-performance", "fail", "candidate median 0.1000 ms is below the roofline floor 1.0000 ms", timing)
    v = Verdict("h", [OK0, OK1, OK2, gate], correct=True, timed=True, speedup=40.0, margin=0.02)
    _, _, text = verdict_feedback(v, can_time=True)
    assert "below the roofline floor" in text


def test_failed_gates_carry_their_evidence():
    g0 = GateResult("0-isolation", "fail", "variant ci: timed out: no reply in 30 s", {"kind": "timeout"})
    s, h, t = verdict_feedback(Verdict("h", [g0]), True)
    assert h == "REJECTED at gate 0-isolation" and "timed out" in t and "unbounded loop" in t
    g1 = GateResult("1-static", "fail", "x", {"findings": [{"rule": "S020-torch-compute", "line": 19,
                                                            "message": "forward computes with torch", "fix": "use Triton"}]})
    _, h, t = verdict_feedback(Verdict("h", [GateResult("0-isolation", "skipped", "-"), g1]), True)
    assert h == "REJECTED at gate 1-static" and "line 19: [S020-torch-compute] forward computes with torch (fix: use Triton)" in t
    g2 = GateResult("2-correctness", "fail", "variant ci-ragged-17 (N=17): worst at index (16,): expected 1, got 0",
                    {"variant": "ci-ragged-17"})
    _, _, t = verdict_feedback(Verdict("h", [OK0, OK1, g2]), True)
    assert "worst at index (16,)" in t and "ragged shape" in t
    _, h, t = verdict_feedback(Verdict("h", [], note="identical to the incumbent"), True)
    assert h == "NOT VERIFIED" and "identical" in t


# ------------------------------------------------------------------------------------------------ trimming
def _att(i, status, gate=None, code=True, speedup=None):
    return Attempt(1, i, status, f"H{i}", f"feedback {i} " + "x" * 50, code=f"code {i} " + "y" * 200 if code else None,
                   failed_gate=gate, speedup=speedup)


def test_best_attempt_ranking():
    atts = [_att(1, "rejected", "1-static"), _att(2, "rejected", "2-correctness"), _att(3, "invalid"),
            _att(4, "slower", "3-performance", speedup=0.9), _att(5, "no-code", code=False)]
    assert best_attempt(atts).round == 4
    assert best_attempt(atts[:3]).round == 2


def test_trimming_drops_oldest_first_and_keeps_best_and_latest():
    atts = [_att(1, "rejected", "1-static"), _att(2, "rejected", "2-correctness"), _att(3, "rejected", "1-static"),
            _att(4, "invalid"), _att(5, "rejected", "0-isolation")]

    def size(shown):
        return sum(len(a.feedback) + (len(a.code) if a.show_code else 0) for a in shown)

    shown, notes = trim_attempts(atts, lambda s: True)
    assert [a.round for a in shown] == [1, 2, 3, 4, 5] and [a.show_code for a in shown] == [False, True, False, False, True]
    shown, notes = trim_attempts(atts, lambda s: size(s) <= 650)
    assert [a.round for a in shown] == [2, 4, 5] and len(notes) == 2 and "attempt 1" in notes[0]
    shown, notes = trim_attempts(atts, lambda s: size(s) <= 300)
    assert [a.round for a in shown] == [2, 5] and not shown[0].show_code and shown[1].show_code
    shown, notes = trim_attempts(atts, lambda s: False)
    assert [a.round for a in shown] == [2, 5] and "still larger" in notes[-1]
    assert all(not a.show_code for a in atts), "trimming must not change the caller's attempts"
