"""The brief the model reads for one stage: rendered from the stage's Jinja2 template.

Owns: :func:`render_stage_prompt` (the exact text the llm engine sends as the ``brief`` field, and what
``xeforge port --dry-run --engine llm`` prints) and the facts it is built from — the device, the problem
(shapes, dtype, FLOPs, bytes, arithmetic intensity, roofline bound, compute- or memory-bound), the precision
contract and tolerances, the detected issues and knowledge-base findings on the current kernel, every
knowledge-base entry that applies to the stage (never cut), the PyTorch reference where the template asks
for it, the starting and current kernels, the analysis plan and the attempts so far with their verdicts
(the oldest trimmed first when the context budget is short, the best one always kept).

Templates: ``stages/<stage>.md.j2`` extends ``cover_agent/templates/stage.md.j2`` and may set
``signature`` (``optimization``, ``algorithmic`` or ``discovery``; default ``optimization``) and
``include_reference``. No dspy here: the dry run renders prompts without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import jinja2

import stages as registry
from cover_agent.feedback import Attempt, compiler_lines, trim_attempts
from stages.base import TEMPLATE_DIR as STAGE_DIR
from xeforge.problem import default_tolerance

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
#: characters per token assumed when fitting a prompt into the context window (code tokenises densely)
CHARS_PER_TOKEN = 3.5
SIGNATURE_KINDS = ("optimization", "algorithmic", "discovery")

PRECISION_MEANING = {
    "strict": "Keep the inputs' precision. Accumulate in fp32; fp32 data must not be computed in TF32 or 16-bit "
              "(a tl.dot on fp32 operands needs input_precision=\"ieee\"); 16-bit inputs may feed tl.dot directly "
              "with an fp32 accumulator. The output keeps the reference's dtype.",
    "tf32": "A tl.dot on fp32 operands may use TF32 (input_precision=\"tf32\"); everything else keeps the inputs' "
            "precision, with fp32 accumulation. The output keeps the reference's dtype.",
    "bf16": "Operands in fp32 may be rounded to bfloat16 for tl.dot, with an fp32 accumulator; elementwise math and "
            "reductions stay fp32. The output keeps the reference's dtype.",
    "fp16": "Operands in fp32 may be rounded to float16 for tl.dot, with an fp32 accumulator; elementwise math and "
            "reductions stay fp32. The output keeps the reference's dtype.",
}


@dataclass
class RenderedPrompt:
    text: str
    signature: str  # optimization | algorithmic | discovery (the analysis call reuses the brief)
    trimmed: list[str] = field(default_factory=list)
    kb_ids: list[str] = field(default_factory=list)
    shown_attempts: int = 0

    @property
    def approx_tokens(self) -> int:
        return int(len(self.text) / CHARS_PER_TOKEN) + 1


# ------------------------------------------------------------------------------------------------ public API
def render_stage_prompt(stage: Any, ctx: Any, issues: Sequence[Any], kbc: Any, feedback: Sequence[Any] = (),
                        *, plan: str | None = None, purpose: str = "propose", budget_chars: int | None = None) -> str:
    """The exact brief for ``stage``. ``feedback``: earlier :class:`Attempt` s of this stage (or plain strings);
    ``kbc``: an object with ``kb``, ``device_id``, ``triton``, ``entry`` (and ``note``); ``kb`` may be None."""
    return render_stage(stage, ctx, issues, kbc, feedback, plan=plan, purpose=purpose, budget_chars=budget_chars).text


def render_stage(stage: Any, ctx: Any, issues: Sequence[Any], kbc: Any, feedback: Sequence[Any] = (), *,
                 plan: str | None = None, purpose: str = "propose", budget_chars: int | None = None) -> RenderedPrompt:
    template = _env().get_template(Path(stage.template).name)
    base = stage_vars(stage, ctx, issues, kbc, plan=plan, purpose=purpose)
    attempts = [_as_attempt(f, i) for i, f in enumerate(feedback)]

    def render(shown: list[Attempt]) -> tuple[str, str]:
        module = template.make_module({**base, "attempts": shown, "attempts_total": len(attempts),
                                       "trimmed": len(attempts) - len(shown)})
        kind = getattr(module, "signature", "optimization")
        return str(module).strip() + "\n", kind

    if budget_chars is None:
        shown, notes = trim_attempts(attempts, lambda s: True)
    else:
        shown, notes = trim_attempts(attempts, lambda s: len(render(s)[0]) <= budget_chars)
    text, kind = render(shown)
    if kind not in SIGNATURE_KINDS:
        raise jinja2.TemplateError(f"{stage.template}: signature must be one of {', '.join(SIGNATURE_KINDS)}, not {kind!r}")
    return RenderedPrompt(text, kind, notes, base["kb_ids"], len(shown))


def budget_chars_for(context_tokens: int, max_tokens: int, overhead_tokens: int = 1200) -> int:
    """Characters the brief may use: the context window less the answer and DSPy's framing."""
    return int(max(context_tokens - max_tokens - overhead_tokens, 1024) * CHARS_PER_TOKEN)


# ------------------------------------------------------------------------------------------------ facts
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(STAGE_DIR)),
                                                         jinja2.FileSystemLoader(str(TEMPLATE_DIR))]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, autoescape=False)
    env.filters["si"] = si
    return env


def stage_vars(stage: Any, ctx: Any, issues: Sequence[Any], kbc: Any, *, plan: str | None = None,
               purpose: str = "propose") -> dict[str, Any]:
    kb_text, kb_ids, kb_note = _kb_section(stage, kbc)
    problem = ctx.problem
    return {
        "stage": stage,
        "n_stages": len(registry.ALL),
        "purpose": purpose,
        "device": device_facts(ctx.device, kbc),
        "interpreter": bool(getattr(ctx.device, "interpreter", False)),
        "problem": problem_facts(ctx, kbc),
        "precision": precision_facts(ctx),
        "issues": [i.render() if hasattr(i, "render") else str(i) for i in issues],
        "kb_findings": _kb_findings(ctx, kbc),
        "compiler": compiler_lines(getattr(ctx, "diagnosis", None)),
        "kb_text": kb_text,
        "kb_ids": kb_ids,
        "kb_note": kb_note,
        "reference": getattr(problem, "reference_source", None),
        "original": ctx.original_source,
        "current": ctx.source,
        "same_as_original": ctx.source.strip() == ctx.original_source.strip(),
        "plan": plan,
    }


def si(value: float | None, unit: str = "") -> str:
    """1.5e12 -> '1.50 T' + unit; None -> 'unknown'."""
    if value is None:
        return "unknown"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def device_facts(device: Any, kbc: Any) -> dict[str, Any]:
    entry = getattr(kbc, "entry", None)
    lines = [f"kind: {device.kind}" + (" (Triton's CPU interpreter: correctness only, nothing is timed)"
                                       if getattr(device, "interpreter", False) else "")]
    lines.append(f"name: {device.name}")
    for attr, label in (("cores", "compute units (SMs / Xe-cores / CPU cores)"), ("l2_bytes", "L2 bytes"),
                        ("shared_mem_bytes", "shared memory / SLM bytes per work-group"),
                        ("subgroup_sizes", "sub-group (warp) sizes"), ("architecture", "architecture")):
        value = getattr(device, attr, None)
        if value not in (None, [], ""):
            lines.append(f"{label}: {value}")
    if getattr(device, "kind", "") != "cpu":
        lines.append(f"native fp64: {'yes' if getattr(device, 'has_fp64', True) else 'no (do not use fp64)'}")
    triton = getattr(kbc, "triton", None)
    return {
        "lines": lines,
        "kb_id": getattr(kbc, "device_id", None),
        "kb_name": getattr(entry, "name", None),
        "triton": str(triton) if triton is not None else None,
        "target": (entry.name if entry is not None and getattr(entry, "backend", "cpu") != "cpu"
                   else "an Intel GPU" if device.kind == "cpu" else device.name),
    }


def _target_kind(ctx: Any, kbc: Any) -> str:
    """The device kind whose problem variant matters: the KB target's backend when planning for a GPU."""
    entry = getattr(kbc, "entry", None)
    backend = getattr(entry, "backend", None)
    if backend in ("xpu", "cuda"):
        return backend
    return ctx.device.kind


def problem_facts(ctx: Any, kbc: Any) -> dict[str, Any]:
    problem = ctx.problem
    spec = problem.spec
    kind = _target_kind(ctx, kbc)
    variant = problem.timing_variant(kind)
    inputs = problem.input_specs(variant)
    dtype = variant.dtype or (inputs[0].dtype if inputs else "float32")
    shown_inputs = []
    for inp in inputs:
        dims = ", ".join(f"{d}={variant.dims[d]}" if isinstance(d, str) and d in variant.dims else str(d)
                         for d in inp.shape)
        in_dtype = variant.dtype if (variant.dtype and inp.dtype.startswith(("float", "bfloat"))) else inp.dtype
        shown_inputs.append(f"{inp.name}: [{dims}] {in_dtype}")
    flop, nbytes = _safe(lambda: variant.flop), _safe(lambda: variant.bytes)
    entry = getattr(kbc, "entry", None)
    peak = _safe(lambda: entry.peak_flops(dtype)) if entry is not None else None
    bw = _safe(lambda: entry.bandwidth_bytes_per_s) if entry is not None else None
    t_compute = flop / peak if flop and peak else None
    t_memory = nbytes / bw if nbytes and bw else None
    ai = flop / nbytes if flop and nbytes else None
    ridge = peak / bw if peak and bw else None
    if t_compute is not None and t_memory is not None:
        bound = "compute-bound" if t_compute >= t_memory else "memory-bound"
    elif ai is not None and ridge is not None:
        bound = "compute-bound" if ai >= ridge else "memory-bound"
    else:
        bound = None
    floor = max(t for t in (t_compute, t_memory) if t is not None) if (t_compute or t_memory) else None
    checked = problem.variants_for(ctx.device.kind)
    ragged = problem.ragged_variants(checked[0]) if checked else []
    return {
        "name": problem.name,
        "description": spec.description,
        "kind": spec.kind,
        "origin": spec.origin,
        "variant": variant.name,
        "variant_for": kind,
        "gpu_variant": _gpu_variant(problem, variant),
        # gate 3 on a GPU times these too (after the first), and adopts nothing that is slower at one of them
        "also_timed": [v.describe() for v in problem.timed_variants("xpu")[1:]],
        "dims": ", ".join(f"{k}={v}" for k, v in variant.dims.items()),
        "dtype": dtype,
        "inputs": shown_inputs,
        "inits": ", ".join(str(a) for a in problem.init_args(variant)) or "none",
        "flop": flop,
        "flop_expr": variant.flop_expr,
        "bytes": nbytes,
        "bytes_expr": variant.bytes_expr,
        "intensity": ai,
        "peak": peak,
        "bandwidth": bw,
        "ridge": ridge,
        "t_compute": _fmt_time(t_compute),
        "t_memory": _fmt_time(t_memory),
        "floor": _fmt_time(floor),
        "bound": bound,
        "kb_device": getattr(kbc, "device_id", None),
        "checked": [v.describe() for v in checked],
        "ragged": [v.describe() for v in ragged],
        "fixed": sorted(spec.fixed),
        "nondeterministic": spec.nondeterministic,
        "has_reference": problem.has_reference,
    }


def _gpu_variant(problem: Any, shown: Any) -> str | None:
    """On the interpreter: the variant a GPU would time (shapes and dtype), so the model sees the real size."""
    gpu = problem.timing_variant("xpu")
    if gpu.name == shown.name:
        return None
    dtype = gpu.dtype or ""
    return f"{gpu.name}: " + ", ".join(f"{k}={v}" for k, v in gpu.dims.items()) + (f"; dtype {dtype}" if dtype else "")


def precision_facts(ctx: Any) -> dict[str, Any]:
    problem = ctx.problem
    contract = problem.spec.precision
    tolerances = []
    settings = ctx.settings
    for v in problem.variants_for(ctx.device.kind) + ([problem.timing_variant("xpu")] if ctx.device.kind == "cpu" else []):
        dt = v.dtype or next((i.dtype for i in problem.input_specs(v)), None)
        if settings is not None:
            default = default_tolerance(dt, settings)
            rtol = v.rtol if v.rtol is not None else default
            atol = v.atol if v.atol is not None else default
            line = f"{v.name} ({dt}): rtol={rtol:g}, atol={atol:g}"
        else:
            line = f"{v.name} ({dt})"
        if line not in tolerances:
            tolerances.append(line)
    return {"contract": contract, "meaning": PRECISION_MEANING.get(contract, contract), "tolerances": tolerances}


def _kb_section(stage: Any, kbc: Any) -> tuple[str | None, list[str], str]:
    kb = getattr(kbc, "kb", None)
    if kb is None:
        note = getattr(kbc, "note", "") or "no knowledge base was loaded"
        return None, [], note
    device_id = getattr(kbc, "device_id", None)
    if not device_id:
        note = getattr(kbc, "note", "") or "no knowledge-base device entry matches this device"
        return None, [], note
    sel = kb.select(stage.name, device_id, kbc.triton)
    return sel.render_text(), list(sel.ids()), ""


def _kb_findings(ctx: Any, kbc: Any) -> list[str]:
    kb = getattr(kbc, "kb", None)
    device_id = getattr(kbc, "device_id", None)
    if kb is None or not device_id:
        return []
    try:
        found = kb.check(ctx.model, device_id, kbc.triton)
    except Exception as exc:  # a KB check bug must not hide the prompt; the model and the user see it
        return [f"(the knowledge-base check could not run on the current kernel: {type(exc).__name__}: {exc})"]
    return [f"line {v.line}: {v.severity} [{v.rule_id}] {v.message} (fix: {v.fix})" if v.line else
            f"{v.severity} [{v.rule_id}] {v.message} (fix: {v.fix})" for v in found]


def _as_attempt(item: Any, index: int) -> Attempt:
    if isinstance(item, Attempt):
        return item
    return Attempt(chain=1, round=index + 1, status="rejected", headline="FEEDBACK", feedback=str(item))


def _safe(fn):
    try:
        return fn()
    except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
