"""Check lanes: a stage's candidates checked for correctness side by side, before gate 3 times them one by one.

Owns: :class:`CheckLanes`. ``xeforge port --check-lanes K`` (``XEFORGE_CHECK_LANES``) checks with K verifiers
of its problem: the port's own and K - 1 more. When a tactic proposes several candidates, each lane takes them off
one queue and runs gates 1, 0 and 2 and the diagnosis (:meth:`xeforge.verifier.Verifier.check`); the port's own
verifier then times the correct ones, one after another, as before (:meth:`~xeforge.verifier.Verifier.verify`
with ``checked=``). What that keeps:

- **One timing at a time on a GPU.** :meth:`CheckLanes.check` returns once every lane is idle, and gate 3 runs
  after it on the port's verifier: no correctness run shares a GPU with a timing.
- **The same trust boundary.** A lane is a whole verifier: its own candidate and oracle workers in the same
  sandbox, which hides the whole run folder (the port's oracle files included) from the lane's candidates. Only the
  verdict (plain data) comes back. The final gate still re-verifies the result from scratch on the port's verifier.
- **Compiled once.** The lanes write the port's Triton cache, so gate 3's first load of a checked candidate finds
  its kernels compiled.

Where lanes run: on the GPUs this process sees (``CUDA_VISIBLE_DEVICES`` / ``ZE_AFFINITY_MASK``), lane ``i`` on
the ``i``-th modulo their number (with one GPU every lane shares it: their compiles still overlap); on the CPU
interpreter each lane is a pair of plain processes. What they gain is the checks' time, compiles above all (a
GPU search checks up to 24 candidates at several shapes each); on the 2-core CI host, at the interpreter's small
``ci`` shapes (a check takes 1-5 s), a port gained nothing measurable (docs/measurements/check-lanes-cpu-2026-12-05).
Not done here: lanes on other hosts (a port on a Ray cluster runs in one task, and its lanes share that task's
GPU).
"""

from __future__ import annotations

import concurrent.futures
import queue
from collections.abc import Callable
from pathlib import Path

from xeforge.problem import Code, source_hash
from xeforge.schedule import visible_gpus
from xeforge.verifier import Verdict, Verifier

MakeVerifier = Callable[[Path, dict[str, str]], Verifier]  # (lane folder, its environment) -> a verifier


def lane_envs(kind: str, n: int, env: dict[str, str] | None = None, count: int | None = None) -> list[dict[str, str]]:
    """The environment of each of ``n`` lanes: the GPU it sees (round-robin over the visible ones); nothing on the
    CPU interpreter."""
    if kind == "cpu":
        return [{} for _ in range(n)]
    var, ids = visible_gpus(kind, env, count)
    ids = ids or ["0"]
    return [{var: ids[i % len(ids)]} for i in range(n)]


class CheckLanes:
    """Lane 0 is the port's own verifier ``main``; lanes 1 to ``n - 1`` are made by ``make`` (on the first check),
    in ``folder/lane-<i>``."""

    def __init__(self, n: int, folder: Path, kind: str, main: Verifier, make: MakeVerifier, say=None) -> None:
        self.n, self.folder, self.kind, self.main, self.make = n, Path(folder), kind, main, make
        self.say = say or (lambda msg: None)
        self.verifiers: list[Verifier] = []
        self.envs: list[dict[str, str]] = []  # each lane's environment, once started
        self.checked = 0  # candidates checked in lanes, over the port

    def describe(self) -> dict:
        """What the report says of the lanes: how many, where each ran, how many candidates they checked."""
        return {"lanes": self.n, "checked": self.checked,
                "where": ["the port's verifier"] + [" ".join(f"{k}={v}" for k, v in e.items()) or self.kind
                                                   for e in self.envs[1:]]}

    def start(self) -> None:
        """Make the lanes and start their workers without waiting for them: their interpreters and torch load
        while the port verifies its start (a worker's start-up costs seconds, a check on the interpreter's ``ci``
        shapes about one)."""
        if self.verifiers:
            return
        self.envs = lane_envs(self.kind, self.n)
        self.verifiers = [self.main] + [self.make(self.folder / f"lane-{i}", self.envs[i]) for i in range(1, self.n)]
        for v in self.verifiers[1:]:
            v.worker.spawn()
            v.oracle_worker.spawn()
        self.say(f"check lanes: {self.n} (" + "; ".join(f"lane {i}: {w}" for i, w in
                                                      enumerate(self.describe()["where"])) + ")")

    def check(self, sources: list[str]) -> dict[str, Verdict]:
        """Each source (once) through gates 1, 0 and 2 on the first free lane; their verdicts by source hash, each
        gate-2 result naming its lane. Returns when every lane is idle."""
        todo = list(dict.fromkeys(sources))
        if not todo:
            return {}
        self.start()
        free: queue.Queue[int] = queue.Queue()
        for i in range(len(self.verifiers)):
            free.put(i)

        def one(src: str) -> tuple[str, Verdict | None]:
            i = free.get()
            h = source_hash(src)
            try:
                verdict = self.verifiers[i].check(Code(src, "candidate.py"), "candidate.py", h)
            except Exception as exc:  # noqa: BLE001 — the port's verifier checks it again and reports it as it would
                self.say(f"  check lane {i}: {h[:12]} left to the port's verifier ({type(exc).__name__}: {exc})")
                return h, None
            finally:
                free.put(i)
            for g in verdict.gates:
                if g.gate == "2-correctness":
                    g.details["lane"] = i
            return h, verdict

        with concurrent.futures.ThreadPoolExecutor(len(self.verifiers)) as pool:
            out = {h: v for h, v in pool.map(one, todo) if v is not None}
        self.checked += len(out)
        return out

    def close(self) -> None:
        """Closes the lanes it made (the port's verifier is the port's to close)."""
        for v in self.verifiers[1:]:
            v.close()

    def __enter__(self) -> "CheckLanes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
