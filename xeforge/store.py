"""The trial store: one run folder per port, written as the run goes, so a killed run can resume.

Owns: the run folder layout (``runs/<problem>/<timestamp>/``), atomic writes, and the memo of verdicts that
``--resume`` replays. Layout::

    run.json                 the command, problem, device, versions, settings; status (running/done/failed)
    baseline/kernel.py       the starting kernel as verified; baseline/verdict.json
    trials/NNNN-<stage>-<tactic>/candidate.py, verdict.json, meta.json   (written before the next starts)
    final/<kernel>.py        the result; final/verdict.json
    report.json, report.md   per stage: candidates, gates reached, speedups with spread, provenance
    worker.log, io/, weights/  worker scratch

A trial is keyed by (stage, tactic, incumbent hash, candidate hash): a resumed run proposes the same
candidates (the rules engine is deterministic) and replays their recorded verdicts instead of re-running them.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from xeforge.errors import RunError


def atomic_write(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def make_run_folder(root: Path) -> None:
    """Create a run folder, or say why it cannot be (a file in the way, no permission) with the fix."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise RunError(str(root), "is a file, not a folder", "pass a folder for --run-dir / --runs-dir")
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".xeforge-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise RunError(str(root), f"cannot write the run folder here ({exc.strerror})",
                       "pass a writable --runs-dir (or --run-dir)") from None


class RunStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._memo: dict[str, Path] = {}
        self._next = 1
        self.resumed = False

    # -- creation / resume -----------------------------------------------------------------------------
    @classmethod
    def create(cls, runs_dir: Path, problem: str) -> "RunStore":
        stamp = time.strftime("%Y%m%d-%H%M%S")
        root = Path(runs_dir) / problem / stamp
        n = 1
        while root.exists():
            n += 1
            root = Path(runs_dir) / problem / f"{stamp}-{n}"
        make_run_folder(root)
        return cls(root)

    @classmethod
    def latest(cls, runs_dir: Path, problem: str) -> "RunStore":
        base = Path(runs_dir) / problem
        runs = sorted((p for p in base.glob("*") if (p / "run.json").exists()), key=lambda p: p.name)
        if not runs:
            raise RunError(str(base), "no earlier run of this problem to resume",
                           "run without --resume first (or pass --run-dir to the folder of the run to continue)")
        return cls.open(runs[-1])

    @classmethod
    def open(cls, root: Path) -> "RunStore":
        store = cls(root)
        if not (store.root / "run.json").exists():
            raise RunError(str(root), "not a run folder (no run.json)", "pass a folder made by 'xeforge port'")
        store.resumed = True
        for trial in sorted((store.root / "trials").glob("*/meta.json")):
            meta = read_json(trial)
            if (trial.parent / "verdict.json").exists():
                store._memo[meta["key"]] = trial.parent
            store._next = max(store._next, int(trial.parent.name.split("-", 1)[0]) + 1)
        return store

    # -- run metadata -------------------------------------------------------------------------------------
    def write_run(self, data: dict[str, Any]) -> None:
        write_json(self.root / "run.json", data)

    def read_run(self) -> dict[str, Any]:
        return read_json(self.root / "run.json")

    def update_run(self, **changes: Any) -> None:
        data = self.read_run() if (self.root / "run.json").exists() else {}
        data.update(changes)
        self.write_run(data)

    # -- trials -------------------------------------------------------------------------------------------
    @staticmethod
    def key(stage: str, tactic: str, incumbent_hash: str, candidate_hash: str) -> str:
        return f"{stage}|{tactic}|{incumbent_hash}|{candidate_hash}"

    def recorded(self, key: str) -> tuple[Path, dict] | None:
        folder = self._memo.get(key)
        if folder is None:
            return None
        return folder, read_json(folder / "verdict.json")

    def new_trial(self, key: str, stage: str, tactic: str, source: str, meta: dict[str, Any]) -> Path:
        """Create the trial folder with its candidate source; the verdict is written by :meth:`finish_trial`."""
        folder = self.root / "trials" / f"{self._next:04d}-{stage}-{tactic}"
        self._next += 1
        atomic_write(folder / "candidate.py", source)
        write_json(folder / "meta.json", {"key": key, "stage": stage, "tactic": tactic, **meta})
        return folder

    def finish_trial(self, folder: Path, key: str, verdict: dict[str, Any]) -> None:
        write_json(folder / "verdict.json", verdict)
        self._memo[key] = folder

    def trials(self) -> list[tuple[dict, dict | None]]:
        out = []
        for meta_path in sorted((self.root / "trials").glob("*/meta.json")):
            v = meta_path.parent / "verdict.json"
            out.append((read_json(meta_path), read_json(v) if v.exists() else None))
        return out
