"""The report plots, drawn headless (matplotlib's Agg canvas, no pyplot, no display) into PNG bytes.

Owns: these figures, each computed from a stored report JSON only (so ``xeforge report`` can redraw them):

- :func:`port_waterfall`: a port's speedup stage by stage (cumulative, log scale) and the end-to-end result;
- :func:`suite_speedups`: each problem's start and port result against PyTorch eager and torch.compile (log scale);
- :func:`suite_roofline`: achieved FLOP/s against arithmetic intensity, with the device roofline drawn;
- :func:`suite_shapes`: each problem's port result against its start, torch.compile and (for GEMMs) the vendor BLAS
  GEMM at every timed shape (:data:`SHAPE_RATIOS`; the last two only where they were timed).

Each returns a :class:`Plot`; when there is nothing to draw (no timings on the CPU interpreter, no roofline for
the device) ``png`` is None and ``missing`` says why — the reports print that sentence instead of an image.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

_COLORS = {"start": "#9aa5b1", "final": "#1f6feb", "eager": "#d97706", "compile": "#7c3aed", "gain": "#2da44e",
           "loss": "#cf222e", "neutral": "#8c959f", "roof": "#24292f"}


@dataclass
class Plot:
    name: str  # file stem: plots/<name>.png
    title: str
    caption: str
    png: bytes | None = None
    missing: str = ""

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii") if self.png else ""


def _figure(width: float, height: float):
    """A figure on the Agg canvas, or None with the reason when matplotlib is missing."""
    try:  # lazy: matplotlib (about a second) only when a report draws figures; a missing one is a reason, not a crash
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        return None, f"matplotlib is not installed ({exc}); install it with: pip install matplotlib"
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig, ""


def _times_axis(axis) -> None:
    """Ticks of a log speedup axis read 0.5x, 1x, 2x instead of 10^0."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # lazy, as in _figure

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}x"))
    axis.set_minor_formatter(NullFormatter())


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None}, bbox_inches="tight")
    return buf.getvalue()


# ------------------------------------------------------------------------------------------------ port
def waterfall_steps(report: dict[str, Any]) -> tuple[list[tuple[str, float | None, str]], float | None]:
    """(stage, measured speedup or None, status note) in order, and the end-to-end speedup of the final gate."""
    steps = []
    for s in report.get("stages", []):
        note = s.get("status", "")
        if s.get("adopted_unmeasured"):
            note = "adopted unmeasured"
        steps.append((s["name"], s.get("speedup"), note))
    verdict = (report.get("final") or {}).get("verdict") or {}
    final = verdict.get("speedup") if verdict.get("timed") else None
    return steps, final


def port_waterfall(report: dict[str, Any]) -> Plot:
    plot = Plot("waterfall", "Speedup per stage",
                "Cumulative speedup over the starting kernel after each stage (log scale; each bar spans the stage's "
                "measured gain against the incumbent). The last bar is the final gate's end-to-end re-measurement.")
    steps, final = waterfall_steps(report)
    if not any(sp for _, sp, _ in steps) and final is None:
        plot.missing = ("no stage was timed" + (": the port ran on the CPU interpreter, which checks correctness only"
                                                if (report.get("device") or {}).get("interpreter") else ""))
        return plot
    fig, why = _figure(max(6.0, 0.9 * (len(steps) + 2)), 4.0)
    if fig is None:
        plot.missing = why
        return plot
    ax = fig.add_subplot(111)
    level, labels = 1.0, []
    for i, (name, sp, note) in enumerate(steps):
        labels.append(name)
        if sp:
            new = level * sp
            lo, hi = sorted((level, new))
            ax.bar(i, hi - lo, bottom=lo, color=_COLORS["gain"] if sp >= 1 else _COLORS["loss"], width=0.6)
            ax.annotate(f"{sp:.2f}x", (i, hi), ha="center", va="bottom", fontsize=8)
            level = new
        else:
            ax.plot([i - 0.3, i + 0.3], [level, level], color=_COLORS["neutral"], lw=2)
            ax.annotate("—" if note != "adopted unmeasured" else "unmeasured", (i, level), ha="center",
                        va="bottom", fontsize=7, color=_COLORS["neutral"])
    i = len(steps)
    labels.append("final (re-verified)")
    end = final if final else level
    lo, hi = sorted((1.0, end))
    ax.bar(i, max(hi - lo, 1e-3), bottom=lo, color=_COLORS["final"], width=0.6)
    ax.annotate(f"{end:.2f}x" + ("" if final else " (not re-timed)"), (i, hi), ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color=_COLORS["roof"], lw=0.8, ls="--")
    ax.set_yscale("log")
    _times_axis(ax.yaxis)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup over the starting kernel")
    ax.set_title(f"{report.get('problem', '')} on {(report.get('device') or {}).get('name', '')}", fontsize=10)
    plot.png = _png(fig)
    return plot


# ------------------------------------------------------------------------------------------------ bench
def _timed_rows(report: dict[str, Any]) -> list[dict]:
    return [r for r in report.get("problems", []) if r.get("speedups")]


def suite_speedups(report: dict[str, Any]) -> Plot:
    plot = Plot("speedups", "Suite speedups vs PyTorch eager and torch.compile",
                "Ratio of median times (>1: the kernel is faster than PyTorch), log scale. Light bars: the starting "
                "kernel; dark bars: the port result. Only verified kernels are timed.")
    if not report.get("timed"):
        plot.missing = "nothing was timed: correctness-only run on the CPU interpreter"
        return plot
    rows = _timed_rows(report)
    if not rows:
        plot.missing = "no problem has two timed entries to compare"
        return plot
    fig, why = _figure(11.0, max(3.0, 0.32 * len(rows) * 2 + 1.5))
    if fig is None:
        plot.missing = why
        return plot
    names = [r["problem"] for r in rows]
    ys = list(range(len(rows)))
    for col, (against, label) in enumerate((("eager", "vs PyTorch eager"), ("compile", "vs torch.compile"))):
        ax = fig.add_subplot(1, 2, col + 1)
        vals_all = []
        for off, who in ((-0.2, "start"), (0.2, "final")):
            vals = [(r["speedups"].get(f"{who}_vs_{against}") or {}).get("value") for r in rows]
            pos = [(y + off, v) for y, v in zip(ys, vals) if v]
            vals_all += [v for _, v in pos]
            if pos:
                # bars grow from 1x: right of the line is faster than PyTorch, left is slower
                ax.barh([p for p, _ in pos], [v - 1.0 for _, v in pos], height=0.38, left=1.0,
                        color=_COLORS[who], label="start" if who == "start" else "port result")
        ax.axvline(1.0, color=_COLORS["roof"], lw=0.8, ls="--")
        ax.set_xscale("log")
        _times_axis(ax.xaxis)
        if vals_all:
            lo, hi = min(vals_all + [1.0]), max(vals_all + [1.0])
            ax.set_xlim(lo / 1.5, hi * 1.5)
        ax.set_yticks(ys)
        ax.set_yticklabels(names if col == 0 else [""] * len(names), fontsize=8)
        ax.invert_yaxis()
        gm = (report.get("geomean") or {}).get(f"final_vs_{against}") or {}
        title = label + (f" (geomean {gm['value']:.2f}x, n={gm['n']})" if gm.get("value") else "")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("speedup (log)")
        if col == 1:
            ax.legend(fontsize=8, loc="lower right")
    plot.png = _png(fig)
    return plot


_MARKERS = {"start": ("o", "none"), "final": ("o", None), "eager": ("^", None), "compile": ("s", None)}


def suite_roofline(report: dict[str, Any]) -> Plot:
    plot = Plot("roofline", "Achieved vs roofline",
                "Achieved FLOP/s (spec flop / median time) against arithmetic intensity (spec flop / bytes), log-log. "
                "Lines: the device roofline min(peak, intensity x bandwidth) from the knowledge-base entry, one per dtype.")
    if not report.get("timed"):
        plot.missing = "nothing was timed: correctness-only run on the CPU interpreter"
        return plot
    rows = [r for r in report.get("problems", []) if (r.get("roofline") or {}).get("intensity")]
    pts = []
    for r in rows:
        for key, e in (r.get("entries") or {}).items():
            ach = e.get("achieved") or {}
            if ach.get("flop_per_s"):
                pts.append((key, r["roofline"]["intensity"], ach["flop_per_s"], r["problem"]))
    if not pts:
        plot.missing = "no timed entry has both a flop and a bytes formula in its spec"
        return plot
    roofs = {}
    for r in rows:
        rf = r["roofline"]
        if rf.get("peak_flops") and rf.get("bandwidth_bytes_per_s"):
            roofs[(rf["dtype"], rf["peak_flops"], rf["bandwidth_bytes_per_s"])] = True
    fig, why = _figure(9.0, 6.0)
    if fig is None:
        plot.missing = why
        return plot
    ax = fig.add_subplot(111)
    xs = [p[1] for p in pts]
    x_lo, x_hi = min(xs) / 4, max(xs) * 4
    for dtype, peak, bw in roofs:
        knee = peak / bw
        lo, hi = min(x_lo, knee / 4), max(x_hi, knee * 4)
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(grid, [min(peak, x * bw) / 1e12 for x in grid], color=_COLORS["roof"], lw=1.2)
        ax.annotate(f"{dtype} peak {peak / 1e12:.0f} TFLOP/s, {bw / 1e9:.0f} GB/s", (hi, peak / 1e12),
                    ha="right", va="bottom", fontsize=8)
    for key in ("start", "final", "eager", "compile"):
        sel = [p for p in pts if p[0] == key]
        if not sel:
            continue
        marker, face = _MARKERS[key]
        ax.scatter([p[1] for p in sel], [p[2] / 1e12 for p in sel], marker=marker, s=36,
                   facecolors=face if face else _COLORS[key], edgecolors=_COLORS[key],
                   label={"start": "starting kernel", "final": "port result", "eager": "PyTorch eager",
                          "compile": "torch.compile"}[key])
    labelled = {}
    for key in ("final", "start"):  # one label per problem, on its best kernel
        for k, x, y, name in pts:
            if k == key and name not in labelled:
                labelled[name] = (x, y)
    for name, (x, y) in sorted(labelled.items()):
        ax.annotate(name[:24], (x, y / 1e12), xytext=(3, 3), textcoords="offset points", fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s")
    if not roofs:
        ax.set_title("no roofline: the knowledge base has no peak and bandwidth for this device", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    plot.png = _png(fig)
    return plot


#: the per-shape ratios drawn: plot name -> (speedup key, baseline's name in titles and axes)
SHAPE_RATIOS = {"shapes": ("final_vs_start", "its start"), "shapes-compile": ("final_vs_compile", "torch.compile"),
                "shapes-blas": ("final_vs_blas", "the vendor BLAS GEMM")}


def suite_shapes(report: dict[str, Any], name: str = "shapes") -> Plot:
    """The port result against a baseline (its start, torch.compile, the BLAS GEMM: :data:`SHAPE_RATIOS`) at every
    timed shape of each problem that has more than one."""
    key, base = SHAPE_RATIOS[name]
    plot = Plot(name, f"Port result vs {base.removeprefix('its ')} at every timed shape",
                f"Ratio of median times per timed shape (>1: the port result is faster than {base} there), log "
                "scale; one bar per shape (bench-gpu, then bench-gpu-1, ...). Left of the line: slower at that shape.")
    rows = [r for r in report.get("problems", []) if len(r.get("shapes") or []) > 1]
    if not report.get("timed"):
        plot.missing = "nothing was timed: correctness-only run on the CPU interpreter"
        return plot
    rows = [r for r in rows if any((sh.get("speedups", {}).get(key) or {}).get("value") for sh in r["shapes"])]
    if not rows:
        plot.missing = f"no problem was timed against {base} at more than one shape"
        return plot
    names = sorted({sh["variant"] for r in rows for sh in r["shapes"]})
    fig, why = _figure(8.0, max(3.0, 0.3 * len(rows) * len(names) + 1.5))
    if fig is None:
        plot.missing = why
        return plot
    ax = fig.add_subplot(1, 1, 1)
    height = 0.8 / len(names)
    vals_all = []
    for i, variant in enumerate(names):
        pos = [(y - 0.4 + (i + 0.5) * height, (sh.get("speedups", {}).get(key) or {}).get("value"))
               for y, r in enumerate(rows) for sh in r["shapes"] if sh["variant"] == variant]
        pos = [(p, v) for p, v in pos if v]
        vals_all += [v for _, v in pos]
        if pos:
            one = len(names) == 1  # one shape name: bars coloured by gain / loss; several: a colour per shape
            ax.barh([p for p, _ in pos], [v - 1.0 for _, v in pos], height=height * 0.9, left=1.0, label=variant,
                    color=[_COLORS["gain"] if v >= 1.0 else _COLORS["loss"] for _, v in pos] if one else None)
    ax.axvline(1.0, color=_COLORS["roof"], lw=0.8, ls="--")
    ax.set_xscale("log")
    _times_axis(ax.xaxis)
    lo, hi = min(vals_all + [1.0]), max(vals_all + [1.0])
    ax.set_xlim(lo / 1.5, hi * 1.5)
    ax.set_yticks(list(range(len(rows))))
    ax.set_yticklabels([r["problem"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"port result / {base.removeprefix('its ')} (log)")
    ax.legend(fontsize=8, loc="lower right")
    plot.png = _png(fig)
    return plot


def bench_plots(report: dict[str, Any]) -> list[Plot]:
    """The bench report's figures; a per-shape ratio with nothing to draw (no BLAS GEMM timed) is left out."""
    shapes = [suite_shapes(report, n) for n in SHAPE_RATIOS]
    return [suite_speedups(report), suite_roofline(report), shapes[0],
            *[p for p in shapes[1:] if p.png is not None]]


def port_plots(report: dict[str, Any]) -> list[Plot]:
    return [port_waterfall(report)]
