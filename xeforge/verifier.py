"""The verification cascade: gate 0 (isolation), 1 (static), 2 (correctness), 3 (performance), and the final gate.

Owns: running one candidate through the gates in order, stopping at the first failure, and producing a
:class:`Verdict` with the evidence and the feedback an engine can learn from. Specification:
``verification.md``. Siblings: :mod:`xeforge.isolation` (worker process), :mod:`xeforge.static_checks`
(gate 1), :mod:`xeforge.compare` (gate 2 comparisons), :mod:`xeforge.timing` (gate 3 statistics). The oracle
(the PyTorch reference in float64 with the same weights) is computed here, in the parent process; the worker
never sees it.
"""

from __future__ import annotations

import importlib.util
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xeforge.compare import compare_outputs
from xeforge.devices import DeviceInfo
from xeforge.errors import ProblemError
from xeforge.isolation import Worker, WorkerFailure
from xeforge.problem import (DISTRIBUTIONS, Problem, Variant, default_tolerance, generate_inputs, plan_inputs,
                             source_hash)
from xeforge.settings import Settings
from xeforge.static_checks import ConstraintHook, StaticChecker
from xeforge.store import atomic_write
from xeforge.timing import decide, noise_margin, paired_ratios, roofline_floor
from xeforge.kernel_model import parse_kernel

GATES = ("0-isolation", "1-static", "2-correctness", "3-performance")


@dataclass
class GateResult:
    gate: str
    status: str  # pass | fail | skipped
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass
class Verdict:
    source_hash: str
    gates: list[GateResult] = field(default_factory=list)
    correct: bool = False
    accepted: bool = False  # correct and (faster beyond the margin, or adopted unmeasured on the interpreter)
    timed: bool = False
    speedup: float | None = None
    margin: float | None = None
    note: str = ""

    @property
    def failed_gate(self) -> GateResult | None:
        return next((g for g in self.gates if g.status == "fail"), None)

    def feedback(self) -> str:
        """What an engine (or a user) should read: the gate that failed and why, or the timing result."""
        failed = self.failed_gate
        if failed is not None:
            return f"rejected at gate {failed.gate}: {failed.summary}"
        if not self.gates:
            return f"not verified: {self.note}" if self.note else "not verified"
        perf = next((g for g in self.gates if g.gate == "3-performance"), None)
        if perf is not None and perf.status == "pass":
            return f"accepted: {perf.summary}"
        if perf is not None and perf.status == "skipped":
            return f"correct on every variant; {perf.summary}"
        return "correct on every variant"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        gates = [GateResult(**g) for g in d.get("gates", [])]
        return cls(**{**d, "gates": gates})


def _import_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Verifier:
    """Verifies candidates of one problem on one device. Use as a context manager (owns a worker)."""

    def __init__(self, problem: Problem, device: DeviceInfo, settings: Settings, workdir: Path,
                 constraint_hooks: list[ConstraintHook] | None = None, device_entry: Any = None) -> None:
        self.problem = problem
        self.device = device
        self.settings = settings
        self.workdir = Path(workdir).resolve()  # the worker runs in it: every path it is given must be absolute
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.device_entry = device_entry
        self.static_checker = StaticChecker(parse_kernel(problem.kernel_source, str(problem.kernel_path)),
                                            constraint_hooks)
        self.worker = Worker(device.kind, self.workdir)
        self.weight_seed = secrets.randbits(31)
        self._slots: dict[tuple[str, str], int] = {}  # (path, variant) -> worker generation it was loaded in
        self._ref_models: dict[str, Any] = {}
        self._weights: dict[str, Path] = {}
        self._margins: dict[str, tuple[float, dict]] = {}
        self.last_timing: dict = {}  # launch-overhead delay of the latest timing request (see timing.delay_flushes)
        self._oracle_device = device.kind if (device.kind != "xpu" or device.has_fp64) else "cpu"
        self._oracle_models: dict[str, tuple[Any, list]] = {}  # variant -> (float64 reference on the device, dtypes)

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.worker.close()

    # ------------------------------------------------------------------------------------------ gates
    def verify(self, cand_path: Path, incumbent_path: Path | None = None, *, time_it: bool = True,
               source_hash: str = "") -> Verdict:
        """Run the cascade. ``incumbent_path`` is what gate 3 times against (None: no gate 3)."""
        cand_path = Path(cand_path).resolve()
        source = cand_path.read_text()
        verdict = Verdict(source_hash=source_hash)
        t0 = time.monotonic()
        g1 = self.static(source, str(cand_path))
        g1.details["seconds"] = round(time.monotonic() - t0, 3)  # where a port's time goes, per gate
        # gate 0 runs around everything below; gate 1 is purely static and reported first in order
        if not g1.passed:
            verdict.gates += [GateResult(GATES[0], "skipped", "not run: static checks failed"), g1]
            return verdict
        t0 = time.monotonic()
        g0, g2 = self.correctness(cand_path)
        if g2 is not None:
            g2.details["seconds"] = round(time.monotonic() - t0, 3)  # load and compile (gate 0) included
        verdict.gates += [g0, g1]
        if g2 is not None:
            verdict.gates.append(g2)
        if not (g0.passed and g2 is not None and g2.passed):
            return verdict
        verdict.correct = True
        if incumbent_path is None or not time_it:
            return verdict
        t0 = time.monotonic()
        g3 = self.performance(Path(incumbent_path), cand_path)
        g3.details["seconds"] = round(time.monotonic() - t0, 3)
        verdict.gates.append(g3)
        if g3.status == "fail" and g3.details.get("phase") == "isolation":
            verdict.gates[0] = GateResult(GATES[0], "fail", g3.summary, g3.details)
        verdict.timed = g3.status != "skipped"
        verdict.speedup = g3.details.get("speedup")
        verdict.margin = g3.details.get("margin")
        verdict.accepted = g3.status == "pass"
        return verdict

    def static(self, source: str, path: str = "candidate.py") -> GateResult:
        _, findings = self.static_checker.check(source, path)
        if findings:
            return GateResult(GATES[1], "fail", "; ".join(f.render() for f in findings),
                              {"findings": [asdict(f) for f in findings]})
        return GateResult(GATES[1], "pass", "static checks and knowledge-base constraints passed")

    # ------------------------------------------------------------------------------------------ gate 2
    def correctness_variants(self) -> list[tuple[Variant, int]]:
        """(variant, rounds) for every variant small enough for the device, then the ragged shapes."""
        out = [(v, self.settings.correctness_rounds) for v in self.problem.variants_for(self.device.kind)]
        if self.settings.ragged_shapes and out:
            out += [(v, 2) for v in self.problem.ragged_variants(out[0][0])]
        return out

    def correctness(self, cand_path: Path) -> tuple[GateResult, GateResult | None]:
        rounds_done, seeds = 0, []
        for variant, rounds in self.correctness_variants():
            rtol, atol = self._tolerances(variant)
            for r in range(rounds):
                seed = secrets.randbits(62)
                dist = DISTRIBUTIONS[r % len(DISTRIBUTIONS)]
                seeds.append(seed)
                try:
                    outs, facts = self._run(cand_path, variant, seed, dist, rerun=(r == 0))
                except WorkerFailure as exc:
                    return self._isolation_failure(exc, variant), None
                except ProblemError:
                    raise
                problem = self._worker_facts(facts, variant)
                if problem:
                    return self._ok0(), GateResult(GATES[2], "fail", problem, {"variant": variant.name, "seed": seed,
                                                                                 "distribution": dist})
                refs, dtypes = self.oracle(variant, seed, dist)
                # compared where the oracle lives: on a GPU the float64 arithmetic over bench-sized outputs takes
                # milliseconds there and seconds on the host
                outs = [o.to(self._oracle_device) if hasattr(o, "to") else o for o in outs]
                mm = compare_outputs(outs, refs, dtypes, rtol, atol)
                del outs, refs
                if mm is not None:
                    return self._ok0(), GateResult(
                        GATES[2], "fail", f"variant {variant.describe()}, {dist} inputs: {mm.message}",
                        {"variant": variant.name, "dims": variant.dims, "seed": seed, "distribution": dist,
                         "reason": mm.reason, **mm.details})
                unstable = self._stability(facts, variant)
                if unstable:
                    return self._ok0(), GateResult(GATES[2], "fail", unstable, {"variant": variant.name, "seed": seed,
                                                                                  "reason": "unstable"})
                rounds_done += 1
        names = [v.name for v, _ in self.correctness_variants()]
        return self._ok0(), GateResult(GATES[2], "pass", f"matches the {self._oracle_name()} on {rounds_done} rounds over "
                                       f"{', '.join(names)}", {"rounds": rounds_done, "variants": names,
                                                               "oracle": self._oracle_name()})

    def _ok0(self) -> GateResult:
        return GateResult(GATES[0], "pass", f"ran in an isolated worker on {self.device.kind}",
                          {"worker_restarts": self.worker.restarts})

    def _isolation_failure(self, exc: WorkerFailure, variant: Variant) -> GateResult:
        what = {"crash": "crashed the worker", "timeout": "timed out", "exception": "raised",
                "start": "could not start the worker"}[exc.kind]
        return GateResult(GATES[0], "fail", f"variant {variant.name}: {what}: {exc.detail}"
                          + (f" (at {exc.where})" if exc.where else ""),
                          {"kind": exc.kind, "detail": exc.detail, "where": exc.where, "variant": variant.name})

    def _worker_facts(self, facts: dict, variant: Variant) -> str | None:
        if not all(facts.get("exact_tensor", [True])):
            return f"returned {facts['types']} — outputs must be plain torch.Tensor"
        if facts.get("inputs_mutated"):
            return f"mutated its input(s) {', '.join(facts['inputs_mutated'])} (variant {variant.name})"
        if facts.get("weights_mutated"):
            return f"changed model weights {', '.join(facts['weights_mutated'][:5])} during forward"
        if facts.get("canary_overwritten"):
            return f"wrote outside the bounds of input(s) {', '.join(facts['canary_overwritten'])}"
        if any(facts.get("aliases_input", [])):
            return "an output aliases an input's memory (return a fresh tensor)"
        return None

    def _stability(self, facts: dict, variant: Variant) -> str | None:
        if facts.get("bit_stable") is False and not self.problem.spec.nondeterministic:
            return (f"two runs on the same inputs gave different bits (variant {variant.name}); mark the spec "
                    "'nondeterministic: true' only if that is intended")
        return None

    def _tolerances(self, variant: Variant) -> tuple[float, float]:
        dt = variant.dtype or next((i.dtype for i in self.problem.input_specs(variant)), None)
        default = default_tolerance(dt, self.settings)
        return (variant.rtol if variant.rtol is not None else default,
                variant.atol if variant.atol is not None else default)

    # ------------------------------------------------------------------------------------------ worker
    def _ensure_loaded(self, path: Path, variant: Variant, compile_mode: str | None = None) -> str:
        path = Path(path).resolve()
        key = (str(path), variant.name) + ((compile_mode,) if compile_mode else ())
        slot = f"{path.stem}@{variant.name}#{abs(hash(key)) % 10**8}"
        if self._slots.get(key) == self.worker.generation and self.worker.alive():
            return slot
        weights = self._weights_file(variant)
        self.worker.request("load", self.settings.compile_timeout_s, slot=slot, path=str(path),
                            init_args=self.problem.init_args(variant), weights_file=str(weights) if weights else None,
                            dtype=variant.dtype, compile_mode=compile_mode)
        self._slots[key] = self.worker.generation
        self._slots[key + ("first",)] = True
        return slot

    def _run(self, path: Path, variant: Variant, seed: int, dist: str, rerun: bool):
        import torch

        path = Path(path).resolve()
        slot = self._ensure_loaded(path, variant)
        first = self._slots.pop((str(path), variant.name, "first"), False)
        timeout = self.settings.compile_timeout_s if first else self.settings.run_timeout_s
        out_file = self.workdir / "io" / f"out-{secrets.token_hex(6)}.pt"
        out_file.parent.mkdir(parents=True, exist_ok=True)
        facts = self.worker.request("run", timeout, slot=slot, plan=plan_inputs(self.problem, variant), seed=seed,
                                    distribution=dist, out_file=str(out_file), rerun=rerun)
        outs = torch.load(out_file, weights_only=True)
        out_file.unlink(missing_ok=True)
        return outs, facts

    # ------------------------------------------------------------------------------------------ oracle
    def _oracle_name(self) -> str:
        return "float64 PyTorch reference" if self.problem.has_reference else "starting kernel (no reference.py)"

    def _model_module(self):
        if self.problem.has_reference:
            return _import_file(self.problem.reference_path, f"xeforge_reference_{self.problem.name}")
        return _import_file(self.problem.kernel_path, f"xeforge_start_{self.problem.name}")

    def _reference_model(self, variant: Variant):
        """The reference Model for ``variant`` with weights rounded to the variant dtype (cached)."""
        import torch

        if variant.name not in self._ref_models:
            module = self._model_module()
            if not hasattr(module, "Model"):
                raise ProblemError(str(self.problem.reference_path or self.problem.kernel_path),
                                   "defines no class Model", "define class Model(torch.nn.Module)")
            torch.manual_seed(self.weight_seed)
            try:
                model = module.Model(*self.problem.init_args(variant))
            except Exception as exc:  # user code: report with the fix instead of a traceback
                raise ProblemError(str(self.problem.reference_path or self.problem.kernel_path),
                                   f"Model(*inits) failed for variant {variant.name}: {type(exc).__name__}: {exc}",
                                   "make 'inits' in spec.yaml match Model.__init__'s arguments") from None
            if variant.dtype:
                model = model.to(dtype=getattr(torch, variant.dtype))
            model.eval()
            self._ref_models[variant.name] = model
        return self._ref_models[variant.name]

    def _weights_file(self, variant: Variant) -> Path | None:
        import torch

        if variant.name not in self._weights:
            state = self._reference_model(variant).state_dict()
            if not state:
                self._weights[variant.name] = None
            else:
                path = self.workdir / "weights" / f"{variant.name}-{self.weight_seed}.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save({k: v.detach().cpu() for k, v in state.items()}, path)
                self._weights[variant.name] = path
        return self._weights[variant.name]

    def oracle(self, variant: Variant, seed: int, dist: str) -> tuple[list, list]:
        """Expected outputs (float64, on the oracle device) and the dtypes the kernel must return, for these inputs."""
        import torch

        plan = plan_inputs(self.problem, variant)
        dev = self._oracle_device
        if not self.problem.has_reference:
            outs, _ = self._run(self.problem.kernel_path, variant, seed, dist, rerun=False)
            return ([o.to(dev, torch.float64) if o.dtype.is_floating_point else o.to(dev) for o in outs],
                    [o.dtype for o in outs])
        inputs = generate_inputs(plan, seed, dist, self.device.kind)
        with torch.no_grad():
            if variant.name not in self._oracle_models:
                # the output dtypes come from one run of the reference in the variant's dtype; the float64 copy
                # (weights rounded to that dtype, then cast up) stays on the oracle device for every later round
                model = self._reference_model(variant)
                low = model.to(dev)(*[x.to(dev) for x in inputs])
                lows = list(low) if isinstance(low, (tuple, list)) else [low]
                self._oracle_models[variant.name] = (_double_copy(model).to(dev), [o.dtype for o in lows])
                model.to("cpu")
                del low, lows
            m64, dtypes = self._oracle_models[variant.name]
            prev = torch.backends.cuda.matmul.allow_tf32 if dev == "cuda" else None
            if dev == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
            try:
                x64 = [x.to(dev).to(torch.float64) if x.dtype.is_floating_point else x.to(dev) for x in inputs]
                ref = m64(*x64)
            finally:
                if dev == "cuda":
                    torch.backends.cuda.matmul.allow_tf32 = prev
            refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        return [r.detach() for r in refs], dtypes

    # ------------------------------------------------------------------------------------------ gate 3
    def performance(self, inc_path: Path, cand_path: Path) -> GateResult:
        if not self.device.can_time:
            return GateResult(GATES[3], "skipped", "not timed: the CPU interpreter measures nothing about GPU speed "
                              "(correctness only)", {"reason": "interpreter"})
        variant = self.problem.timing_variant(self.device.kind)
        try:
            margin, aa = self.margin_for(inc_path, variant)
            times = self._time([inc_path, cand_path], variant)
        except WorkerFailure as exc:
            return GateResult(GATES[3], "fail", f"timing failed: {exc}", {"phase": "isolation", "kind": exc.kind})
        inc_t, cand_t = times
        floor = self._floor(variant)
        d = decide(inc_t, cand_t, margin, floor, self.settings.speedup_flag)
        details = {"variant": variant.name, "speedup": d.speedup, "margin": margin, "incumbent": d.incumbent.as_dict(),
                   "candidate": d.candidate.as_dict(), "aa": aa, "floor_ms": None if floor is None else floor * 1e3,
                   "flagged_over_10x": d.flagged, "method": self._method(), "launch_delay": dict(self.last_timing)}
        if d.implausible:
            return GateResult(GATES[3], "fail", d.implausible, details)
        return GateResult(GATES[3], "pass" if d.accepted else "fail", d.summary(), details)

    def _method(self) -> str:
        return (f"{self.device.kind} events, full sync, L2 flush (2x L2) repeated to cover the host's launch overhead, "
                f"rotated inputs, interleaved A/B, {self.settings.timed_pairs} pairs after "
                f"{self.settings.warmup_calls} warm-ups; median and IQR")

    def margin_for(self, inc_path: Path, variant: Variant) -> tuple[float, dict]:
        """The A/A noise margin of the incumbent against itself (cached per incumbent source)."""
        key = Path(inc_path).read_text()
        if key not in self._margins:
            a, b = self._time([inc_path, inc_path], variant, aa=True)
            ratios = paired_ratios(a, b)
            margin = noise_margin(a, b, self.settings.min_noise_margin)
            d = decide(a, b, 0.0, None, self.settings.speedup_flag)
            self._margins[key] = (margin, {"aa_speedup": d.speedup, "aa_ratios_median": sorted(ratios)[len(ratios) // 2],
                                           "margin": margin})
        return self._margins[key]

    def aa_test(self, path: Path) -> dict:
        """Time a kernel against itself; the result must never count as a win."""
        variant = self.problem.timing_variant(self.device.kind)
        a, b = self._time([path, path], variant, aa=True)
        margin = noise_margin(a, b, self.settings.min_noise_margin)
        d = decide(a, b, margin, None, self.settings.speedup_flag)
        return {"speedup": d.speedup, "margin": margin, "accepted": d.accepted, "a": d.incumbent.as_dict(),
                "b": d.candidate.as_dict(), "a_ms": a, "b_ms": b}

    def _time(self, paths: list[Path], variant: Variant, aa: bool = False) -> list[list[float]]:
        entries: list[tuple[Path, str | None]] = []
        for i, p in enumerate(paths):
            if (aa and i == 1) or (i == 1 and Path(p).resolve() == Path(paths[0]).resolve()):
                p = self.aa_alias(Path(p))
            entries.append((Path(p), None))
        return self.time_entries(entries, variant)

    def aa_alias(self, path: Path) -> Path:
        """A second file with ``path``'s source, for an independent load of it (A/A measures two identical slots).

        Named by the source's hash: the worker keeps a loaded module per path, so an alias named after the file
        (every trial's ``candidate.py``) would time an earlier incumbent's module against the new one.
        """
        text = Path(path).read_text()
        alias = self.workdir / "io" / f"aa-{source_hash(text)}.py"
        if not alias.exists():
            alias.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(alias, text)
        return alias

    def time_entries(self, entries: list[tuple[Path, str | None]], variant: Variant,
                     pairs: int | None = None) -> list[list[float]]:
        """Time several Models interleaved in one worker with the gate-3 method (events, L2 flush, rotation).

        Each entry is (a file defining ``Model`` — a kernel file or a plain-PyTorch reference —, a
        ``torch.compile`` mode or None). Used by ``xeforge bench`` for start / final / eager / torch.compile.
        """
        slots = []
        for path, mode in entries:
            p = Path(path).resolve()
            slots.append(self._ensure_loaded(p, variant, mode))
            self._slots.pop((str(p), variant.name, "first"), None)
        reply = self.worker.request("time", self.settings.compile_timeout_s + self.settings.run_timeout_s, slots=slots,
                                    plan=plan_inputs(self.problem, variant), seed=secrets.randbits(62),
                                    pairs=pairs or self.settings.timed_pairs, warmup=self.settings.warmup_calls,
                                    l2_bytes=self.device.l2_bytes, budget_bytes=self._rotation_budget())
        self.last_timing = {k: reply.get(k) for k in ("host_ms_max", "flush_ms", "delay_flushes")}
        return [reply["times_ms"][s] for s in slots]

    def _rotation_budget(self) -> int | None:
        if self.device.total_memory_bytes:
            return int(self.device.total_memory_bytes * self.settings.rotation_budget_fraction)
        return None

    def _floor(self, variant: Variant) -> float | None:
        entry = self.device_entry
        if entry is None:
            return None
        dtype = variant.dtype or "float32"
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}.get(dtype, dtype)
        try:
            peak = entry.peak_flops(short)
            bw = entry.bandwidth_bytes_per_s
        except AttributeError:
            return None
        return roofline_floor(variant.flop, variant.bytes, peak, bw)

    # ------------------------------------------------------------------------------------------ prewarm
    def prewarm(self, sources: list[str], jobs: int | None = None) -> int:
        """Compile candidates in parallel on the host before the cascade runs them one by one.

        Each source runs once on the timing variant and once on every correctness variant (each shape is its own
        specialization, so its own compile) in a throw-away worker; Triton's on-disk cache then makes the
        verifier's own first calls fast. Failures are ignored here: the cascade reports them. Interpreter: no-op.
        """
        import concurrent.futures
        import os

        if self.device.interpreter or not sources:
            return 0
        timing = self.problem.timing_variant(self.device.kind)
        variants = [timing] + [v for v, _ in self.correctness_variants() if v.name != timing.name]
        jobs = jobs or max(1, min(len(sources), (os.cpu_count() or 2) // 2, 8))
        folder = self.workdir / "io" / "prewarm"
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for src in sources:
            path = folder / f"c{source_hash_of(src)}.py"
            path.write_text(src)
            paths.append(path)
        setups = [(v, self._weights_file(v), plan_inputs(self.problem, v)) for v in variants]

        def one(path: Path) -> bool:
            w = Worker(self.device.kind, self.workdir, self.workdir / "prewarm.log")
            try:
                for i, (variant, weights, plan) in enumerate(setups):
                    w.request("load", self.settings.compile_timeout_s, slot=f"p{i}", path=str(path),
                              init_args=self.problem.init_args(variant),
                              weights_file=str(weights) if weights else None, dtype=variant.dtype)
                    out = self.workdir / "io" / f"prewarm-{path.stem}-{i}.pt"
                    w.request("run", self.settings.compile_timeout_s, slot=f"p{i}", plan=plan, seed=0,
                              distribution="normal", out_file=str(out), rerun=False)
                    out.unlink(missing_ok=True)
                return True
            except WorkerFailure:
                return False
            finally:
                w.close()

        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            return sum(pool.map(one, paths))

    # ------------------------------------------------------------------------------------------ final
    def restart_worker(self) -> None:
        """Start from scratch: a fresh worker and no cached slots (used by the final gate)."""
        self.worker.close()
        self._slots.clear()


def source_hash_of(text: str) -> str:
    from xeforge.problem import source_hash

    return source_hash(text)


def _double_copy(model):
    import copy

    import torch

    m = copy.deepcopy(model)
    return m.to(dtype=torch.float64)
