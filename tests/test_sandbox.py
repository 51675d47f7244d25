"""The OS sandbox around workers (xeforge/sandbox.py): what a candidate cannot do, checked from outside.

Each probe is a correct vadd kernel that also tries one escape and swallows the error, so it passes gate 2: the
test then looks, from the xeforge side, for the escape's effect (a file outside the run's scratch, a connection to
a listener, a process left behind, a secret in any output) and finds none. Skipped, with the reason, where
bubblewrap cannot build its namespaces; then ``xeforge env`` and every verdict say the sandbox is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, skip_without_gpu
from xeforge import sandbox
from xeforge.devices import describe
from xeforge.problem import Code, load_problem
from xeforge.settings import Settings
from xeforge.verifier import Verifier

VADD = (FIXTURES / "problems" / "vadd" / "kernel.py").read_text()
SECRET = "sk-xeforge-test-" + uuid.uuid4().hex


def _probe(body: str) -> str:
    """vadd whose forward first runs ``body`` (inside try: every failure swallowed, the kernel still runs)."""
    block = "try:\n" + textwrap.indent(textwrap.dedent(body).strip() + "\n", "    ") + "except BaseException:\n    pass\n"
    return "import os, socket, subprocess, sys, time\n" + VADD.replace(
        "    def forward(self, x, y):\n", "    def forward(self, x, y):\n" + textwrap.indent(block, " " * 8))


@pytest.fixture(scope="module")
def isolated():
    rep = sandbox.report("cpu", "auto")
    if not rep.isolated:
        pytest.skip(f"bubblewrap cannot sandbox workers here: {'; '.join(rep.missing)}")
    return rep


@pytest.fixture(params=["cpu", "gpu"])
def env(request, tmp_path, monkeypatch, isolated):
    """(verifier, problem folder, tmp folder) on the interpreter, and on the GPU (its device files bound in)."""
    kind = "cpu" if request.param == "cpu" else skip_without_gpu()
    monkeypatch.setenv("XEFORGE_TEST_SECRET", SECRET)
    root = tmp_path / "vadd"
    shutil.copytree(FIXTURES / "problems" / "vadd", root)
    settings = Settings(compile_timeout_s=60.0, run_timeout_s=20.0, correctness_rounds=1, ragged_shapes=False,
                        sandbox="require", max_log_mib=1.0, max_tensor_file_gib=0.5)
    v = Verifier(load_problem(root), describe(kind), settings, tmp_path / "run")
    yield v, root, tmp_path
    v.close()


def _run(v: Verifier, source: str):
    g0, g2 = v.correctness(Code(source, "candidate.py"))
    return g0, g2


def _no_secret_under(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), f"the secret reached {p}"


def test_verdicts_name_the_sandbox(env):
    v, _, _ = env
    g0, g2 = _run(v, VADD)
    assert g0.passed and g2.passed, g2.summary
    assert "sandboxed by bubblewrap" in g0.summary and g0.details["sandbox"]["tool"].startswith("bubblewrap")
    assert g0.summary.endswith(v.device.kind + ", sandboxed by " + g0.details["sandbox"]["tool"])


def test_writes_outside_the_scratch_folder_change_nothing(env):
    v, root, tmp = env
    home = Path(os.path.expanduser("~"))
    targets = [root / "reference.py", root / "new.py", tmp / "outside.txt", home / f"xeforge-probe-{uuid.uuid4().hex}",
               Path(__file__).resolve().parent.parent / "probe-in-repo.txt", v.workdir / "run.json",
               v.workdir / "oracle" / "weights" / "planted.safetensors"]
    before = (root / "reference.py").read_bytes()
    body = "\n".join(f"try:\n    open({str(t)!r}, 'a').write('pwned')\nexcept OSError:\n    pass" for t in targets)
    g0, g2 = _run(v, _probe(body))
    assert g0.passed and g2.passed, (g0.summary, g2 and g2.summary)
    assert (root / "reference.py").read_bytes() == before
    for t in targets[1:]:
        assert not t.exists(), f"the candidate wrote {t}"


def test_no_network_not_even_the_hosts_loopback(env):
    v, _, _ = env
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    body = f"""
        for _ in range(12):
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"hello")
            except OSError:
                pass
    """
    g0, g2 = _run(v, _probe(body))
    assert g2 is not None and g2.passed
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


def test_children_die_with_the_worker_even_after_setsid(env):
    v, _, _ = env
    marker = "xeforge-orphan-" + uuid.uuid4().hex
    body = f"""
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
    """
    g0, g2 = _run(v, _probe(body))
    assert g2 is not None and g2.passed
    v.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _processes_with(marker):
        time.sleep(0.2)
    assert _processes_with(marker) == []


def _processes_with(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_the_parents_environment_and_processes_are_out_of_reach(env):
    v, _, _ = env
    me = os.getpid()  # this process stands for xeforge: its /proc entry holds its environment and memory
    body = f"""
        seen = []
        for what in ("environ", "cmdline", "mem"):
            try:
                open("/proc/{me}/" + what, "rb").read(64)
                seen.append(what)
            except OSError:
                pass
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
        open("probe.txt", "w").write(" ".join(seen) + "|" + str(len(pids)))
        sys.stderr.write(repr(dict(os.environ)))
    """
    g0, g2 = _run(v, _probe(body))
    assert g2 is not None and g2.passed
    v.close()
    seen, count = (v.workdir / "worker" / "probe.txt").read_text().split("|")
    assert seen == ""  # not one of the parent's /proc files could be read
    assert int(count) <= 3  # the namespace's reaper, the worker and at most a helper: no host process
    _no_secret_under(v.workdir)  # the worker's own (scrubbed) environment has no secret either


def test_a_chatty_candidate_gets_a_capped_log(env):
    v, _, _ = env
    g0, g2 = _run(v, _probe("sys.stderr.write('x' * (8 << 20)); sys.stderr.flush()"))
    assert g2 is not None and g2.passed
    v.close()
    log = v.workdir / "worker.log"
    assert log.stat().st_size < (1 << 20) + 4096
    assert "the rest is discarded" in log.read_text()


def test_file_size_and_memory_caps_stop_the_candidate_not_the_run(env):
    v, _, _ = env
    g0, g2 = _run(v, VADD.replace("        return out\n", "        open('big', 'wb').write(b'0' * (600 << 20))\n"
                                                            "        return out\n"))
    assert g0.status == "fail" and ("SIGXFSZ" in g0.summary or "File too large" in g0.summary), g0.summary
    g0, g2 = _run(v, VADD.replace("        return out\n", "        torch.empty(1 << 40, dtype=torch.uint8).fill_(1)\n"
                                                            "        return out\n"))
    assert g0.status == "fail", g0.summary
    g0, g2 = _run(v, VADD)
    assert g0.passed and g2.passed  # the run goes on with a fresh worker


def test_require_without_bubblewrap_refuses_with_the_fix(monkeypatch, tmp_path):
    from xeforge.errors import DeviceError

    monkeypatch.setenv("XEFORGE_BWRAP", str(tmp_path / "no-such-bwrap"))
    with pytest.raises(DeviceError) as info:
        sandbox.report("cpu", "require")
    assert "bubblewrap" in info.value.fix
    rep = sandbox.report("cpu", "auto", sandbox.limits_for(Settings(), "cpu"))
    assert not rep.isolated and "not installed" in rep.summary()
    assert "rlimits" in rep.summary()  # the limits still apply, and the report says which
