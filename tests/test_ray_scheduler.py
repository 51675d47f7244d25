"""The bench's schedulers: the local subprocess-per-slot one (fast, always run) and the Ray one (issue 35).

The Ray tests start a Ray cluster of this host and are skipped at run time, with the reason, when Ray is not
installed (``pip install -e '.[ray]'``). The scheduler tests drive :class:`RayScheduler` with small jobs whose
child kills itself or its Ray worker on the first attempt (deterministic retries); the CLI test runs
``xeforge bench --cluster ray`` on two bundled problems against a ``ray start --head`` cluster, kills one
problem's child and another problem's Ray worker mid-run, and compares the verdicts with ``--workers 2``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from xeforge import bench, port_cluster, ray_cluster
from xeforge.errors import ClusterError, UsageError
from xeforge.problem import load_problem
from xeforge.schedule import Job, LocalScheduler

PROBLEMS = ("kernels/vector_add", "kernels/softmax")
OBJECT_STORE = 200 << 20  # bytes of Ray's object store per test cluster (its default is 30% of the host's memory)


def _job(tmp: Path, idx: int, body: str) -> Job:
    """A job whose child runs ``body`` (Python) with PART set to its part folder, as the bench's child would."""
    part = tmp / "parts" / f"{idx:03d}-job{idx}"
    part.parent.mkdir(parents=True, exist_ok=True)
    code = ("import json, os, signal, sys, time\nfrom pathlib import Path\n"
            "PART = Path(sys.argv[1])\nPART.mkdir(parents=True, exist_ok=True)\n") + textwrap.dedent(body)
    return Job(idx, f"job{idx}", [sys.executable, "-c", code, str(part)], part)


WRITE_ROW = """
(PART / "bench.json").write_text(json.dumps({"problems": [{"problem": "p", "env": os.environ.get("SLOT", "")}]}))
(PART / "work").mkdir(exist_ok=True)
(PART / "work" / "note.txt").write_text("from the child")
print("child stdout")
print("child stderr", file=sys.stderr)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plain_types(value) -> set[str]:
    """The type names a value is built of (containers included), to assert only plain data crossed."""
    names = {type(value).__name__}
    if isinstance(value, dict):
        for k, v in value.items():
            names |= {type(k).__name__} | _plain_types(v)
    elif isinstance(value, list):
        for v in value:
            names |= _plain_types(v)
    return names


# ------------------------------------------------------------------------------------------------ local, fast
def test_local_scheduler_runs_each_job_once_in_a_slot_environment(tmp_path):
    jobs = [_job(tmp_path, i, WRITE_ROW) for i in range(3)]
    seen = []
    LocalScheduler([{"SLOT": "a"}, {"SLOT": "b"}]).run(jobs, seen.append, None)
    assert sorted(o.job.index for o in seen) == [0, 1, 2]
    for o in seen:
        assert o.exit_code == 0 and o.where is None and o.attempts == 1 and o.error is None
        row = json.loads((o.job.part / "bench.json").read_text())["problems"][0]
        assert row["env"] == o.env["SLOT"] and o.env["SLOT"] in {"a", "b"}  # the slot it ran in is the one reported
        assert o.job.log.read_text().strip() == "child stderr" and o.job.stdout.read_text().strip() == "child stdout"
    assert LocalScheduler([{}]).describe() is None  # the local default adds nothing to bench.json


def test_local_scheduler_starts_nothing_after_the_deadline(tmp_path):
    jobs = [_job(tmp_path, i, WRITE_ROW) for i in range(2)]
    seen = []
    LocalScheduler([{}]).run(jobs, seen.append, time.monotonic() - 1)
    assert seen == [] and not any(j.part.exists() for j in jobs)


def test_child_rows_read_back_and_an_unrun_job_is_an_error_row(tmp_path):
    job = _job(tmp_path, 0, WRITE_ROW)
    subprocess.run(job.argv, check=True, capture_output=True)
    row = bench._child_row(job.part, Path("kernels/x"), 0, job.log, {"SLOT": "a"})
    assert row["problem"] == "p" and row["worker"]["exit_code"] == 0
    job.log.write_text("the last words of the log")
    err = bench._child_row(job.part, Path("kernels/x"), None, job.log, {}, error="lost 3 time(s), not retried again")
    assert err["status"] == "error" and err["error"].startswith("lost 3 time(s)") and "last words" in err["error"]


def test_cluster_flag_parsing_and_its_refusals(tmp_path):
    assert ray_cluster.parse_cluster("ray", env={}) is None
    assert ray_cluster.parse_cluster("ray", env={"RAY_ADDRESS": "10.0.0.1:6379"}) == "10.0.0.1:6379"
    assert ray_cluster.parse_cluster("ray://head:10001", env={"RAY_ADDRESS": "x:1"}) == "ray://head:10001"
    for bad in ("ray://", "dask", "ray:head"):
        with pytest.raises(UsageError):
            ray_cluster.parse_cluster(bad, env={})
    with pytest.raises(UsageError) as err:
        bench.run_bench(bench.BenchOptions(problems=[str(ROOT / PROBLEMS[0])], device="cpu", cluster="ray",
                                           workers=2, out=tmp_path / "o"))
    assert "--workers" in str(err.value)
    port = _free_port()  # nothing listens there: refused at once, not after Ray's minutes of retries
    t0 = time.monotonic()
    with pytest.raises((ClusterError, UsageError)) as err:  # UsageError: Ray itself is not installed here
        bench.run_bench(bench.BenchOptions(problems=[str(ROOT / PROBLEMS[0])], device="cpu",
                                           cluster=f"ray://127.0.0.1:{port}", out=tmp_path / "o"))
    assert time.monotonic() - t0 < 30 and err.value.fix
    assert not (tmp_path / "o").exists()  # refused before anything was written
    # a driver without a GPU names the cluster's kind: refused for the cluster, not for this host's missing CUDA
    with pytest.raises((ClusterError, UsageError)) as err:
        bench.run_bench(bench.BenchOptions(problems=[str(ROOT / PROBLEMS[0])], device="cuda",
                                           cluster=f"ray://127.0.0.1:{port}", out=tmp_path / "o"))
    assert "nothing answers" in str(err.value) or "Ray is not installed" in str(err.value)


def _port_args(*extra: str):
    from xeforge.cli import build_parser

    return build_parser().parse_args(["port", str(ROOT / PROBLEMS[0]), *extra])


def test_a_port_on_a_cluster_gets_its_flags_and_always_continues_its_run_folder(tmp_path):
    """The child of ``xeforge port --cluster`` gets the port's own flags, the kind --device names (not what this
    host has), and --run-dir ... --resume: a retried attempt replays what the lost one recorded."""
    args = _port_args("--device", "cuda", "--stages", "persistent", "--engine", "rules", "--budget", "3",
                      "--target", "arc-b580", "--patch", "--check-lanes", "2", "--cluster", "ray", "--runs-dir",
                      str(tmp_path / "runs"))
    assert port_cluster.device_kind(args.device, print) == "cuda"  # no CUDA here: the cluster's nodes have it
    run_dir = port_cluster.run_folder(args, load_problem(ROOT / PROBLEMS[0]))
    assert run_dir.parent == (tmp_path / "runs" / "vector_add").resolve() and run_dir.is_dir()
    argv = port_cluster.child_argv(args, "cuda", run_dir)
    assert argv[1:5] == ["-m", "xeforge", "port", str((ROOT / PROBLEMS[0]).resolve())]
    text = " ".join(argv)
    for part in ("--device cuda", f"--run-dir {run_dir} --resume --json", "--stages persistent", "--engine rules",
                 "--budget 3", "--target arc-b580", "--patch", "--check-lanes 2"):
        assert part in text, part
    assert "--cluster" not in argv
    (run_dir / "run.json").write_text("{}")
    with pytest.raises(UsageError) as err:  # a folder that holds a run is continued only when asked
        port_cluster.run_folder(_port_args("--run-dir", str(run_dir), "--cluster", "ray"), None)
    assert "--resume" in err.value.fix
    assert port_cluster.run_folder(_port_args("--resume", "--runs-dir", str(tmp_path / "runs")),
                                   load_problem(ROOT / PROBLEMS[0])) == run_dir


def test_a_port_on_a_cluster_is_refused_before_it_makes_a_run_folder(tmp_path, capsys):
    from xeforge.cli import main

    runs = tmp_path / "runs"
    assert main(["port", str(ROOT / PROBLEMS[0]), "--cluster", "ray", "--dry-run", "--runs-dir", str(runs)]) == 1
    assert "--dry-run runs nothing on a device" in capsys.readouterr().err
    port = _free_port()  # nothing listens there
    assert main(["port", str(ROOT / PROBLEMS[0]), "--device", "cpu", "--cluster", f"ray://127.0.0.1:{port}",
                 "--runs-dir", str(runs)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and "Traceback" not in err
    assert not runs.exists()


def test_a_port_with_check_lanes_asks_the_cluster_for_a_gpu_per_lane(tmp_path, monkeypatch):
    asked = []

    class Refusing:  # stands in for the scheduler: records what it was made with, refuses to connect
        def __init__(self, address, kind, **kw):
            asked.append((kind, kw.get("gpus")))

        def connect(self):
            raise ClusterError("--cluster", "not here", "a test")

    monkeypatch.setattr(port_cluster, "RayScheduler", Refusing)
    for extra, gpus in ((["--check-lanes", "3"], 3), ([], 1)):
        with pytest.raises(ClusterError):
            port_cluster.port_on_cluster(_port_args("--device", "cuda", "--cluster", "ray", *extra), None, print)
        assert asked[-1] == ("cuda", gpus)
    monkeypatch.setenv("XEFORGE_CHECK_LANES", "2")  # the setting counts as the flag does
    with pytest.raises(ClusterError):
        port_cluster.port_on_cluster(_port_args("--device", "cuda", "--cluster", "ray"), None, print)
    assert asked[-1] == ("cuda", 2)
    with pytest.raises(ValueError):
        ray_cluster.RayScheduler(None, "cuda", lanes=2, gpus=2)


def test_a_gone_cluster_recorded_on_this_host_is_refused_at_once(tmp_path, monkeypatch):
    _ray()
    port = _free_port()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_cluster, "_recorded_address", lambda ray: f"127.0.0.1:{port}")  # `ray start` died
    t0 = time.monotonic()
    with pytest.raises(ClusterError) as err:
        bench.run_bench(bench.BenchOptions(problems=[str(ROOT / PROBLEMS[0])], device="cpu", cluster="ray",
                                           out=tmp_path / "o"))
    assert time.monotonic() - t0 < 30 and "ray stop" in err.value.fix and f":{port}" in err.value.fix
    assert not (tmp_path / "o").exists()


class _FlakyRay:
    """Stands for the ``ray`` module: ``init`` fails as ``failures`` says, then connects."""
    __version__ = "fake"

    def __init__(self, failures: list[Exception]):
        self.failures, self.calls, self.up = list(failures), 0, False

    def is_initialized(self):
        return self.up

    def init(self, **kw):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        self.up = True

    def cluster_resources(self):
        return {"CPU": 2.0}

    def nodes(self):
        return [{"Alive": True}]


SERVER_START_FAILED = ConnectionAbortedError(
    "Initialization failure from server:\nTraceback (most recent call last): RuntimeError: Starting Ray client "
    "server failed. See ray_client_server_23000.err for detailed logs.")


@pytest.mark.parametrize("failures, connects, calls", [
    ([SERVER_START_FAILED], True, 2),  # the proxy's server died at its start once: connected on the second try
    ([SERVER_START_FAILED] * 3, False, 3),  # it keeps failing: refused after CONNECT_ATTEMPTS, saying so
    ([ConnectionError("UNAUTHENTICATED: invalid token")], False, 1),  # anything else is not tried again
])
def test_a_ray_client_server_that_failed_to_start_is_tried_again(monkeypatch, failures, connects, calls):
    fake, said = _FlakyRay(failures), []
    monkeypatch.setattr(ray_cluster, "import_ray", lambda: fake)
    monkeypatch.setattr(ray_cluster, "_check_reachable", lambda *a: None)
    monkeypatch.setattr(ray_cluster, "CONNECT_PAUSE_S", 0.0)
    sched = ray_cluster.RayScheduler("ray://127.0.0.1:1", "cpu", say=said.append)
    if connects:
        assert sched.connect() is fake and sched.connected_here
    else:
        with pytest.raises(ClusterError) as err:
            sched.connect()
        assert type(failures[0]).__name__ in str(err.value)
        assert (f"({calls} attempts)" in str(err.value)) == (calls > 1)
    assert fake.calls == calls
    assert sum("connecting again" in line for line in said) == calls - 1  # one line per retry


def test_missing_ray_is_refused_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(UsageError) as err:
        bench.run_bench(bench.BenchOptions(problems=[str(ROOT / PROBLEMS[0])], device="cpu", cluster="ray",
                                           out=tmp_path / "o"))
    assert "Ray is not installed" in str(err.value) and ".[ray]" in err.value.fix
    assert not (tmp_path / "o").exists()


def test_what_a_task_returns_is_plain_data_and_stays_in_its_part_folder(tmp_path):
    assert ray_cluster.is_plain({"a": [1, 2.0, None, True, b"x", {"b": "c"}]})
    assert not ray_cluster.is_plain({"a": object()}) and not ray_cluster.is_plain({1: "int key"})
    assert not ray_cluster.is_plain({"a": (1, 2)})  # a tuple is not what the task builds: refused
    part = tmp_path / "parts" / "000-x"
    (part / "work").mkdir(parents=True)
    (part / "bench.json").write_text("{}")
    (part / "work" / "big.bin").write_bytes(b"0" * 2000)
    files, left = ray_cluster._collect(part, cap=1000)
    assert list(files) == ["bench.json"] and "big.bin" in left[0]
    job = Job(0, "x", [sys.executable], tmp_path / "driver" / "000-x")
    ray_cluster._write_back(job, {"files": {"bench.json": b"{}", "../../escaped.txt": b"no"}, "log": b"l",
                                  "stdout": b"s"})
    assert (job.part / "bench.json").read_bytes() == b"{}" and job.log.read_bytes() == b"l"
    assert not (tmp_path / "escaped.txt").exists()
    job.log.write_bytes(b"the whole log, of which a task returns the tail")  # the task ran on this host
    ray_cluster._write_back(job, {"files": {}, "log": b"the tail", "stdout": b"s"})
    assert job.log.read_bytes().startswith(b"the whole log")  # not cut down to the tail it came back with


def test_a_task_child_gets_the_drivers_thread_limit_not_the_one_ray_set_for_the_task():
    worker = {"OMP_NUM_THREADS": "1", "PATH": "/bin", "RAY_NODE": "n"}
    assert ray_cluster.child_env(worker, {}) == {"PATH": "/bin", "RAY_NODE": "n"}
    assert ray_cluster.child_env(worker, {"OMP_NUM_THREADS": "8", "XEFORGE_X": "y"}) == {
        "PATH": "/bin", "RAY_NODE": "n", "OMP_NUM_THREADS": "8", "XEFORGE_X": "y"}


def test_a_ray_task_sees_the_gpu_ray_gave_it_and_lanes_share_its_lock(tmp_path):
    """The environment a task gives its child, from the GPU ids Ray assigned (no GPU needed to check it)."""
    from xeforge import device_lock

    assert ray_cluster._gpu_env("cpu", 1, [], {}) == {}
    assert ray_cluster._gpu_env("cuda", 1, ["3"], {}) == {"CUDA_VISIBLE_DEVICES": "3"}  # a whole GPU: no lock
    two = ray_cluster._gpu_env("cuda", 2, ["1"], {})
    assert two["CUDA_VISIBLE_DEVICES"] == "1" and two[device_lock.ENV].endswith("xeforge-gpu-locks/cuda-1.lock")
    assert ray_cluster._gpu_env("cuda", 2, ["1"], {}) == two  # the other lane on GPU 1 takes the same lock
    assert ray_cluster._gpu_env("cuda", 2, ["0"], {})[device_lock.ENV] != two[device_lock.ENV]
    xpu = ray_cluster._gpu_env("xpu", 2, ["0"], {device_lock.ENV: str(tmp_path / "given.lock")})
    assert xpu == {"ZE_AFFINITY_MASK": "0", device_lock.ENV: str(tmp_path / "given.lock")}  # a given lock is kept
    assert ray_cluster.RayScheduler(None, "cuda", lanes=4).num_gpus == 0.25
    assert ray_cluster.RayScheduler(None, "cpu", lanes=1).num_gpus == 0


# ------------------------------------------------------------------------------------------------ Ray
def _ray():
    try:
        import ray
    except ImportError:
        pytest.skip("Ray is not installed: pip install -e '.[ray]' (the optional extra; CI's make setup installs it)")
    return ray


@pytest.fixture(scope="class")
def ray_here():
    """A Ray instance of this process (2 CPUs, about 6 s to start), which the scheduler finds connected; ended with
    its class, before the CLI tests start their head: one Ray at a time on CI's 2 cores."""
    ray = _ray()
    # a new one (not one found on this host), with a small object store: CI machines are small
    # two GPUs declared (Ray hands out their ids; nothing here uses a GPU): a port's check lanes hold both
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=OBJECT_STORE)
    yield ray
    ray.shutdown()


class TestRayScheduler:
    """The scheduler in this process, driving small jobs on :func:`ray_here`."""

    @pytest.mark.slow  # a few one-second jobs
    def test_ray_scheduler_retries_a_lost_child_and_a_lost_ray_worker(self, ray_here, tmp_path):
        marker = tmp_path / "attempts"
        marker.mkdir()
        first_attempt = textwrap.dedent(f"""
            n = len(list(Path({str(marker)!r}).glob(PART.name + "-*")))
            (Path({str(marker)!r}) / f"{{PART.name}}-{{n}}").touch()
            """)
        jobs = [
            _job(tmp_path, 0, WRITE_ROW),
            _job(tmp_path, 1, first_attempt + "if n == 0:\n    os.kill(os.getpid(), signal.SIGKILL)\n" + WRITE_ROW),
            _job(tmp_path, 2, first_attempt
                 + "if n == 0:\n    os.kill(os.getppid(), signal.SIGKILL)\n    time.sleep(30)\n" + WRITE_ROW),
        ]
        said, seen = [], []
        sched = ray_cluster.RayScheduler(None, "cpu", retries=2, say=said.append)
        sched.run(jobs, seen.append, None)
        by = {o.job.index: o for o in seen}
        assert sorted(by) == [0, 1, 2]
        assert by[0].attempts == 1 and by[0].lost == [] and by[0].exit_code == 0
        assert by[1].attempts == 2 and "killed by signal 9" in by[1].lost[0]
        assert by[2].attempts == 2 and "Ray worker was lost" in by[2].lost[0]
        for o in seen:  # every job's files came back and its row reads as the local path's
            assert o.error is None and o.where["host"] == socket.gethostname()
            assert json.loads((o.job.part / "bench.json").read_text())["problems"][0]["problem"] == "p"
            assert (o.job.part / "work" / "note.txt").read_text() == "from the child"
        assert any("job1" in m and "retrying (attempt 2 of 3)" in m for m in said)
        assert any("job2" in m and "retrying" in m for m in said)
        assert sched.describe()["nodes"] == 1 and sched.describe()["ray"] == ray_here.__version__


    @pytest.mark.slow  # three short jobs
    def test_ray_task_returns_only_plain_data_and_gives_up_after_its_retries(self, ray_here, tmp_path):
        job = _job(tmp_path, 0, WRITE_ROW + 'Path(PART, "threads").write_text(os.environ.get("OMP_NUM_THREADS", "-"))')
        ctx = {"cwd": str(ROOT), "kind": "cpu", "lanes": 1, "env": {}, "not_after": None}
        result = ray_here.get(ray_here.remote(ray_cluster.run_on_node).options(num_cpus=1).remote(
            {"argv": job.argv, "part": str(job.part)}, ctx))
        assert _plain_types(result) <= {"dict", "str", "bytes", "int", "float", "list", "NoneType", "bool"}
        assert result["exit_code"] == 0 and set(result["files"]) == {"bench.json", "work/note.txt", "threads"}
        # Ray sets OMP_NUM_THREADS=1 in a one-CPU task's worker; the child runs as it would locally
        assert result["files"]["threads"] == os.environ.get("OMP_NUM_THREADS", "-").encode()
        always = _job(tmp_path, 1, "os.kill(os.getpid(), signal.SIGKILL)\n")
        seen = []
        ray_cluster.RayScheduler(None, "cpu", retries=1, say=lambda m: None).run([always], seen.append, None)
        (o,) = seen
        assert o.attempts == 2 and len(o.lost) == 2 and o.error.startswith("lost 2 time(s)")
        skipped = []
        ray_cluster.RayScheduler(None, "cpu", say=lambda m: None).run([_job(tmp_path, 2, WRITE_ROW)], skipped.append,
                                                                      time.monotonic() - 1)
        assert skipped == []  # --stop-after passed: the task starts nothing

    @pytest.mark.slow  # two short jobs
    def test_a_task_for_check_lanes_holds_that_many_gpus_of_one_node(self, ray_here, tmp_path):
        """``--check-lanes 2`` on a cluster: the port's task sees two GPUs, so each lane checks on one of its own;
        more than the largest node has is capped to it, with a line that says so (never a task that waits)."""
        said = []
        for gpus, idx in ((2, 0), (3, 1)):
            seen = []
            sched = ray_cluster.RayScheduler(None, "cuda", gpus=gpus, say=said.append)
            sched.run([_job(tmp_path, idx, WRITE_ROW)], seen.append, None)
            (o,) = seen
            assert o.exit_code == 0 and sorted(o.env["CUDA_VISIBLE_DEVICES"].split(",")) == ["0", "1"], o
            assert sched.describe()["num_gpus_per_task"] == 2
        assert any("3 GPUs of one node were asked for; the largest node has 2" in m for m in said), said


# ------------------------------------------------------------------------------------------------ the CLI on a cluster
@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """``ray start --head`` on this host (2 CPUs, token authentication with a token of its own), in a session of
    its own that teardown ends by its id. Yields its address, its Ray Client address and the environment that
    reaches it."""
    _ray()
    exe = Path(sys.executable).with_name("ray")
    if not exe.exists():
        pytest.skip(f"no ray command beside {sys.executable}")
    port, client = _free_port(), _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0"}
    log = open(tmp_path_factory.mktemp("ray-head") / "head.log", "w")
    proc = subprocess.Popen([str(exe), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", f"--ray-client-server-port={client}",
                             f"--object-store-memory={OBJECT_STORE}"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        for listening in (port, client):  # the GCS, then the Ray Client server, which starts after it
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", listening), timeout=1).close()
                    break
                except OSError:
                    assert proc.poll() is None, "ray start --head exited"
                    time.sleep(0.5)
        yield {"address": f"127.0.0.1:{port}", "client": f"ray://127.0.0.1:{client}", "env": env,
               "session": proc.pid}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the head's session: its GCS, raylet and workers, nothing else
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
        # `ray start` records its address for a later ray.init() to find; ended by a signal, the head leaves it
        current = Path("/tmp/ray/ray_current_cluster")
        if current.is_file() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()


def _session_processes(session: int):
    """(pid, argv, parent pid) of each process in the Ray head's session."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            if os.getsid(int(d.name)) != session:
                continue
            stat = (d / "stat").read_text()
        except (OSError, ProcessLookupError):
            continue
        yield int(d.name), argv, int(stat.rsplit(")", 1)[1].split()[1])


def _children_of_session(session: int, problem: str) -> list[tuple[int, int]]:
    """(pid, parent pid) of the bench children for ``problem`` in the Ray head's session."""
    return [(pid, parent) for pid, argv, parent in _session_processes(session)
            if b"xeforge" in argv and b"--json" in argv and any(a.endswith(b"/" + problem.encode()) for a in argv)]


def _verdicts(rep: dict) -> list[tuple]:
    return [(r["problem"], r["status"], r["entries"]["start"]["verified"],
             [(g["gate"], g["status"]) for g in r["entries"]["start"]["gates"]], r["entries"]["start"]["rounds"])
            for r in rep["problems"]]


@pytest.mark.slow  # a local --workers 2 bench and a Ray bench with two retried problems (about 90 s on 2 cores)
def test_bench_on_a_ray_cluster_matches_the_local_path_and_survives_lost_workers(ray_head, tmp_path):
    local = subprocess.run([sys.executable, "-m", "xeforge", "bench", *PROBLEMS, "--device", "cpu", "--workers", "2",
                            "--out", str(tmp_path / "local")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    out = tmp_path / "ray"
    env = {**ray_head["env"], "RAY_ADDRESS": ray_head["address"]}
    proc = subprocess.Popen([sys.executable, "-m", "xeforge", "bench", *PROBLEMS, "--device", "cpu",
                             "--cluster", "ray", "--out", str(out), "--json"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # mid-run: vector_add's child is killed, and softmax's Ray worker (the child's parent)
    killed: dict[str, int] = {}
    deadline = time.monotonic() + 120
    while len(killed) < 2 and time.monotonic() < deadline and proc.poll() is None:
        for problem, whom in (("vector_add", "child"), ("softmax", "ray worker")):
            if problem in killed:
                continue
            found = _children_of_session(ray_head["session"], problem)
            if found:
                time.sleep(1.0)  # let it start its work
                pid, parent = found[0]
                os.kill(pid if whom == "child" else parent, signal.SIGKILL)
                killed[problem] = pid
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=300)
    assert set(killed) == {"vector_add", "softmax"}, f"could not find both children to kill: {killed}\n{stderr}"
    assert proc.returncode == 0, stderr
    rep = json.loads(stdout)  # stdout holds the data and nothing else (Ray's logs stay on stderr)
    assert rep == json.loads((out / "bench.json").read_text())
    local_rep = json.loads((tmp_path / "local" / "bench.json").read_text())
    assert rep["status"] == "done" and _verdicts(rep) == _verdicts(local_rep)
    assert rep["cluster"]["scheduler"] == "ray" and rep["cluster"]["address"] == ray_head["address"]
    retried = {r["problem"]: r for r in rep["retried"]}
    assert set(retried) == {"vector_add", "softmax"} and all(r["attempts"] == 2 for r in retried.values())
    assert "killed by signal 9" in retried["vector_add"]["lost"][0]
    assert "Ray worker was lost" in retried["softmax"]["lost"][0]
    assert "2 problem(s) retried after a lost worker" in rep["summary"]
    assert "retried after a lost worker: vector_add (2 attempts" in stderr
    for r in rep["problems"]:
        assert r["worker"]["attempts"] == 2 and r["worker"]["pid"] != killed[r["problem"]]
    assert "retried" not in local_rep and "cluster" not in local_rep  # the local record is as it was


@pytest.mark.slow  # one problem ported and benched through Ray Client (about 25 s)
def test_a_port_through_ray_client(ray_head, tmp_path):
    """``xeforge bench --port`` on the cluster: the problem's port runs inside its task's child, and its result is
    verified there like any port result."""
    proc = subprocess.run([sys.executable, "-m", "xeforge", "bench", PROBLEMS[0], "--device", "cpu", "--port",
                           "--engine", "rules", "--stages", "memory_access", "--runs-dir", str(tmp_path / "runs"),
                           "--cluster", ray_head["client"], "--out", str(tmp_path / "o"), "--json"], cwd=ROOT,
                          env=ray_head["env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["cluster"]["address"] == ray_head["client"] and rep["retried"] == []
    (row,) = rep["problems"]
    assert row["worker"]["attempts"] == 1 and row["port_run"]["ported_now"] is True
    assert row["entries"]["start"]["verified"] == "verified" and row["entries"]["final"]["verified"] == "verified"
    assert Path(row["port_run"]["report"]).is_file()  # one host: the port's run folder is where the row says


def _port_child(session: int, run_dir: Path) -> int | None:
    """The pid of the ``xeforge port`` child for ``run_dir`` in the Ray head's session."""
    return next((pid for pid, argv, _ in _session_processes(session)
                 if b"port" in argv and str(run_dir).encode() in argv), None)


@pytest.mark.slow  # a local port and one on the cluster whose child is killed once (about 90 s on 2 cores)
def test_a_port_on_a_ray_cluster_resumes_after_its_child_is_killed(ray_head, tmp_path):
    """``xeforge port --cluster``: the port's child is killed once its first trial is recorded; the retried
    attempt continues the run folder (the trial replayed, not run again) and ends with the local port's result."""
    flags = ["--device", "cpu", "--engine", "rules", "--stages", "persistent", "--json"]
    local = subprocess.run([sys.executable, "-m", "xeforge", "port", PROBLEMS[0], *flags,
                            "--run-dir", str(tmp_path / "local")], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert local.returncode == 0, local.stderr
    run_dir = tmp_path / "ray"
    env = {**ray_head["env"], "RAY_ADDRESS": ray_head["address"]}
    proc = subprocess.Popen([sys.executable, "-m", "xeforge", "port", PROBLEMS[0], *flags, "--cluster", "ray",
                             "--run-dir", str(run_dir)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 180
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        if list(run_dir.glob("trials/*/verdict.json")):
            killed = _port_child(ray_head["session"], run_dir.resolve())
            if killed:
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=300)
    assert killed, f"the port's child was not found to kill\n{stderr}"
    assert proc.returncode == 0, stderr
    rep = json.loads(stdout)
    assert rep["cluster"]["attempts"] == 2 and "killed by signal 9" in rep["cluster"]["lost"][0]
    assert "the port took 2 attempts" in stderr
    assert "resuming: 1 recorded trial(s) will be replayed" in stderr and "(replayed)" in stderr
    assert len(list(run_dir.glob("trials/*/meta.json"))) == 1  # the trial was not run a second time
    local_rep = json.loads(local.stdout)
    assert rep["summary"] == local_rep["summary"]
    assert [g["status"] for g in rep["final"]["verdict"]["gates"]] == \
        [g["status"] for g in local_rep["final"]["verdict"]["gates"]]
