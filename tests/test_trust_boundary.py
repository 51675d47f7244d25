"""The trust boundary (verification.md, gate 0): nothing a worker writes can run code in the xeforge process.

Hostile candidates here go straight to gate 2 (``Verifier.correctness``), past gate 1's name checks, and with the
OS sandbox off (``tests/test_sandbox.py`` tests it), because the boundary must hold by itself: a forged pickle on
the protocol stream, a forged reply, a forged tensor file, a patched torch in the worker, an appended
``reference.py``. Each is rejected, and the marker file its payload would write in the parent never appears.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tests.conftest import FIXTURES
from xeforge import wire
from xeforge.devices import describe
from xeforge.errors import ProblemError
from xeforge.problem import Code, load_problem
from xeforge.settings import Settings
from xeforge.verifier import Verifier

VADD = (FIXTURES / "problems" / "vadd" / "kernel.py").read_text()


def _hostile(prelude: str, in_forward: str = "") -> str:
    """The vadd kernel with ``prelude`` at module level and ``in_forward`` run first in forward."""
    src = VADD.replace("    def forward(self, x, y):\n",
                       "    def forward(self, x, y):\n" + textwrap.indent(textwrap.dedent(in_forward), " " * 8))
    return textwrap.dedent(prelude) + "\n" + src


@pytest.fixture
def problem_copy(tmp_path):
    root = tmp_path / "vadd"
    shutil.copytree(FIXTURES / "problems" / "vadd", root)
    return root


SETTINGS = Settings(compile_timeout_s=60.0, run_timeout_s=20.0, correctness_rounds=2, sandbox="off")


@pytest.fixture
def verifier(problem_copy, tmp_path):
    v = Verifier(load_problem(problem_copy), describe("cpu"), SETTINGS, tmp_path / "run")
    yield v
    v.close()


def _gate2(v: Verifier, source: str):
    g0, g2 = v.correctness(Code(source, "candidate.py"))
    return g0, g2


PICKLE_FORGERY = """
    import gc, io, os, pickle, struct

    class _Payload:
        def __reduce__(self):
            return (os.system, ("touch {marker}",))

    def _forge():
        # the protocol stream is the worker's only binary writer that is not stdout/stderr
        for obj in gc.get_objects():
            if isinstance(obj, io.BufferedWriter) and obj.fileno() > 2:
                data = pickle.dumps({{"ok": True, "pwned": _Payload()}})
                obj.write(struct.pack("<Q", len(data)) + data)
                obj.flush()
"""


def test_a_pickle_on_the_protocol_stream_is_data_not_code(verifier, tmp_path):
    marker = tmp_path / "parent-ran-the-payload"
    g0, g2 = _gate2(verifier, _hostile(PICKLE_FORGERY.format(marker=marker), "_forge()\n"))
    assert g0.status == "fail" and g2 is None
    assert "protocol" in g0.details["kind"] and "not a valid message" in g0.summary
    assert not marker.exists()
    # the run goes on: the next candidate gets a fresh worker and passes
    g0, g2 = _gate2(verifier, VADD)
    assert g0.passed and g2.passed, g2.summary


def test_a_forged_reply_with_no_outputs_behind_it_is_rejected(verifier):
    forged = """
        import gc, io, json, struct

        def _forge():
            for obj in gc.get_objects():
                if isinstance(obj, io.BufferedWriter) and obj.fileno() > 2:
                    data = json.dumps({"ok": True, "n_outputs": 1, "exact_tensor": [True]}).encode()
                    obj.write(struct.pack("<Q", len(data)) + data)
                    obj.flush()
    """
    g0, g2 = _gate2(verifier, _hostile(forged, "_forge()\n"))
    # the forged reply arrives first; the parent reads the outputs file, which was never written
    assert g0.status == "fail" and g0.details["kind"] == "protocol", g0.summary
    assert "outputs file" in g0.summary


def test_a_forged_tensor_file_is_rejected(verifier):
    forged = """
        import xeforge.wire as _w

        def _junk(path, tensors):
            with open(path, "wb") as fh:
                fh.write(b"\\x80\\x04not a tensor file")
        _w.save_tensors = _junk
    """
    g0, g2 = _gate2(verifier, _hostile(forged))
    assert g0.status == "fail" and g0.details["kind"] == "protocol"
    assert "not a valid tensor file" in g0.summary


def test_patching_torch_in_the_worker_does_not_hide_a_mutated_input(verifier):
    """The worker's own bit checks could be forged (torch.equal = lambda *a: True); the parent decides."""
    src = _hostile("import torch\ntorch.equal = lambda *a, **k: True\n",
                   "x.mul_(2.0)\nx.div_(2.0)\ny.add_(1.0)\n")
    g0, g2 = _gate2(verifier, src)
    assert g0.passed and g2.status == "fail"
    assert "mutated its input(s) Y" in g2.summary


def test_a_write_past_an_input_is_caught_from_the_returned_buffer(verifier):
    oob = VADD.replace("add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64, num_warps=4)",
                       "add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64, num_warps=4)\n"
                       "        add_kernel[(1,)](x, y, y[n - 8:], 64, BLOCK=64)")
    g0, g2 = _gate2(verifier, oob)
    assert g0.passed and g2.status == "fail" and "outside the bounds of input(s) Y" in g2.summary


def test_an_appended_reference_never_runs_and_the_oracle_keeps_its_snapshot(verifier, problem_copy, tmp_path):
    marker = tmp_path / "reference-payload-ran"
    ref = problem_copy / "reference.py"
    tamper = f"""
        def _tamper():
            with open({str(ref)!r}, "a") as fh:
                fh.write("\\nimport os\\nos.system('touch {marker}')\\n"
                         "class Model(__import__('torch').nn.Module):\\n"
                         "    def forward(self, x, y):\\n        return x * 0 + 12345.0\\n")
    """
    g0, g2 = _gate2(verifier, _hostile(tamper, "_tamper()\n"))
    assert g0.passed and g2.passed  # the kernel itself is right; what it did to reference.py is the attack
    assert "12345" in ref.read_text()  # (no sandbox in this test: the file could be written)
    # a kernel returning 12345.0 everywhere would now match the tampered reference; it must not match the snapshot
    cheat = VADD.replace("        return out\n", "        return out * 0 + 12345.0\n")
    g0, g2 = _gate2(verifier, cheat)
    assert g2 is not None and g2.status == "fail", "the oracle re-read the tampered reference"
    # a fresh verifier (the final gate restarts workers) still uses the problem as loaded
    verifier.restart_worker()
    verifier.oracle_worker.close()
    g0, g2 = _gate2(verifier, cheat)
    assert g2.status == "fail"
    assert not marker.exists()


def test_the_xeforge_process_imports_no_problem_or_run_file(verifier, problem_copy):
    g0, g2 = _gate2(verifier, VADD)
    assert g2.passed
    roots = (str(problem_copy.resolve()), str(verifier.workdir))
    loaded = [m for m in list(sys.modules.values())
              if str(getattr(m, "__file__", "") or "").startswith(roots)]
    assert loaded == []


def test_a_kernelbench_problem_runs_get_inputs_in_a_worker(tmp_path):
    root = tmp_path / "kb"
    root.mkdir()
    # get_inputs() tells which process ran it through the shape it returns
    (root / "kernel.py").write_text(VADD + textwrap.dedent("""

        def get_inputs():
            import os
            return [torch.randn(os.getpid() % 100000 + 1), torch.randn(128)]


        def get_init_inputs():
            return []
    """))
    p = load_problem(root)
    assert [i.shape for i in p.spec.inputs.values()] == [("X0_0",), ("X1_0",)]
    assert p.spec.variants["ci"].dims["X1_0"] == 128
    assert p.spec.variants["ci"].dims["X0_0"] != os.getpid() % 100000 + 1  # get_inputs() ran in another process


def test_an_oracle_that_never_returns_is_a_problem_error_not_a_hang(tmp_path, problem_copy):
    (problem_copy / "reference.py").write_text(textwrap.dedent("""
        import torch

        class Model(torch.nn.Module):
            def forward(self, x, y):
                while True:
                    pass
    """))
    v = Verifier(load_problem(problem_copy), describe("cpu"),
                 SETTINGS.replace(compile_timeout_s=8.0, run_timeout_s=4.0, correctness_rounds=1), tmp_path / "run")
    with v, pytest.raises(ProblemError) as info:
        _gate2(v, VADD)
    assert "did not finish within" in info.value.what and "reference.py" in info.value.where


def test_a_reference_that_returns_none_is_named(tmp_path, problem_copy):
    (problem_copy / "reference.py").write_text(textwrap.dedent("""
        import torch

        class Model(torch.nn.Module):
            def forward(self, x, y):
                return None
    """))
    v = Verifier(load_problem(problem_copy), describe("cpu"), SETTINGS.replace(correctness_rounds=1), tmp_path / "run")
    with v, pytest.raises(ProblemError) as info:
        _gate2(v, VADD)
    assert "NoneType" in info.value.what and info.value.fix


# -------------------------------------------------------------------------------------------- the wire itself
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
def test_decoding_any_bytes_gives_an_object_or_a_protocol_error(data):
    try:
        obj = wire.decode(data)
    except wire.ProtocolError:
        return
    assert isinstance(obj, dict)


def test_the_wire_refuses_oversized_deep_and_non_object_messages():
    with pytest.raises(wire.ProtocolError, match="bytes"):
        wire.message_length(wire.HEADER.pack(wire.MAX_MESSAGE_BYTES + 1))
    with pytest.raises(wire.ProtocolError, match="nested"):
        wire.decode(("[" * 100000 + "]" * 100000).encode())
    with pytest.raises(wire.ProtocolError, match="not an object"):
        wire.decode(b"[1, 2]")
    with pytest.raises(wire.ProtocolError, match="not UTF-8"):
        wire.decode(b"\x80\x04K\x01.")  # a pickle
    with pytest.raises(wire.ProtocolError, match="not JSON"):
        wire.decode(b"{'a': 1}")
    assert wire.decode(wire.encode({"a": [1, {"b": "]"}]})[wire.HEADER.size:]) == {"a": [1, {"b": "]"}]}


def test_tensor_files_are_checked_for_size_and_names(tmp_path):
    import torch

    path = tmp_path / "t.safetensors"
    wire.save_tensors(path, {"out.0": torch.arange(6.0).view(2, 3)[:, 1:]})  # a non-contiguous view
    got = wire.load_tensors(path, 1 << 20, expect={"out.0"})
    assert torch.equal(got["out.0"], torch.tensor([[1.0, 2.0], [4.0, 5.0]]))
    with pytest.raises(wire.TensorFileError, match="more than"):
        wire.load_tensors(path, 8)
    with pytest.raises(wire.TensorFileError, match="lacks"):
        wire.load_tensors(path, 1 << 20, expect={"out.0", "out.1"})
    with pytest.raises(wire.TensorFileError, match="not written"):
        wire.load_tensors(tmp_path / "missing", 1 << 20)
