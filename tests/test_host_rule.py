"""Launch values the host computes are searched and set where they are made (issue 32: "a launch configuration
computed on the host ... is searched by the values the trace saw per variant; the edit goes where the value is
made, keeping the grid consistent with it"). Each case is a wrapper as real files write it, on the interpreter."""

from __future__ import annotations

import textwrap

import pytest

from stages.device_tuning import LaunchParamSearch
from tests.conftest import problem_folder, tactic_context
from xeforge.analysis.observe import traces
from xeforge.kernel_model import parse_kernel
from xeforge.problem import load_problem
from xeforge.rewrite.tiling.configs import apply_config, tunable_names
from xeforge.rewrite.tiling.grid import single_launch
from xeforge.rewrite.tiling.host_rule import changes_nothing, host_made

HEAD = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _scale_rows(x_ptr, y_ptr, n_rows, N, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            m = (rows[:, None] < n_rows) & (cols[None, :] < N)
            x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=m, other=0.0)
            tl.store(y_ptr + rows[:, None] * N + cols[None, :], x * 2.0, mask=m)


    def _pick(n_rows, n):
        return (1 if n_rows < 64 else 4), min(triton.next_power_of_2(n), 1024), (4 if n >= 512 else 2)

''')

FORMS = {
    # a heuristic function's tuple, read by the grid and the launch
    "tuple": '''
    def scale_rows(x):
        y = torch.empty_like(x)
        block_r, block_n, warps = _pick(x.shape[0], x.shape[1])
        grid = (triton.cdiv(x.shape[0], block_r),)
        _scale_rows[grid](x, y, x.shape[0], x.shape[1], BLOCK_R=block_r, BLOCK_N=block_n, num_warps=warps)
        return y
''',
    # a dict the launch unpacks, popped for its options
    "dict": '''
    def scale_rows(x):
        y = torch.empty_like(x)
        r, n, w = _pick(x.shape[0], x.shape[1])
        cfg = dict(BLOCK_R=r, BLOCK_N=n, num_warps=w)
        warps = cfg.pop("num_warps")
        grid = (triton.cdiv(x.shape[0], cfg["BLOCK_R"]),)
        _scale_rows[grid](x, y, x.shape[0], x.shape[1], num_warps=warps, **cfg)
        return y
''',
}

MODEL = '''

class Model(torch.nn.Module):
    def forward(self, x):
        return scale_rows(x)
'''

REFERENCE = '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0
'''

SPEC = '''kind: elementwise
inputs:
  x: {shape: [R, N], dtype: float32}
ci:
  - {params: [x], dims: {R: 40, N: 96}}
bench-gpu:
  - {params: [x], dims: {R: 4096, N: 4096}}
'''


@pytest.fixture(params=sorted(FORMS))
def problem(request, tmp_path):
    d = tmp_path / request.param
    d.mkdir()
    (d / "kernel.py").write_text(HEAD + textwrap.dedent(FORMS[request.param]) + MODEL)
    (d / "reference.py").write_text(REFERENCE)
    (d / "spec.yaml").write_text(SPEC)
    p = load_problem(d)
    traces(p)
    return request.param, p


def test_the_values_are_read_per_variant_and_searched(problem):
    form, p = problem
    model = parse_kernel(p.kernel_source)
    site = single_launch(model, "_scale_rows")
    made = host_made(model, site)
    assert made["BLOCK_R"].values == {"ci": 1, "bench-gpu": 4} and made["BLOCK_N"].values == {"ci": 128,
                                                                                           "bench-gpu": 1024}
    assert made["num_warps"].values == {"ci": 2, "bench-gpu": 4}
    names, why = tunable_names(model, site)
    assert set(names) == {"BLOCK_R", "BLOCK_N"}, why  # the grid divides by one, a loop steps by the other
    app = LaunchParamSearch().check(tactic_context(p, target="arc-b580"))
    assert app.applies and "BLOCK_N, BLOCK_R" in app.reason.replace("BLOCK_R, BLOCK_N", "BLOCK_N, BLOCK_R")
    assert not changes_nothing(model, site, made["BLOCK_R"], 4)  # the grid divides by it: set, not capped
    if form == "tuple":  # BLOCK_N is capped where it is made (a loop's step sized from the row): a cap at or above
        # 1024 changes nothing, and no candidate carries one (a dict entry is set, not capped)
        assert changes_nothing(model, site, made["BLOCK_N"], 1024)
        assert not changes_nothing(model, site, made["BLOCK_N"], 512)
        cands = LaunchParamSearch().propose(tactic_context(p, target="arc-b580"))
        assert cands and all(c.params.get("BLOCK_N", 0) < 1024 for c in cands), [c.params for c in cands]


def test_the_rule_goes_where_the_values_are_made_and_is_correct(problem, verify):
    form, p = problem
    new = apply_config(p.kernel_source, "_scale_rows", {"BLOCK_R": 8, "BLOCK_N": 256, "num_warps": 8})
    lines = new.splitlines()
    rule = next(i for i, ln in enumerate(lines) if "# xeforge launch-params" in ln)
    grid = next(i for i, ln in enumerate(lines) if ln.strip().startswith("grid = "))
    assert rule < grid, "the rule must come before the grid that reads the values"
    if form == "tuple":
        assert lines[rule - 1].strip().startswith("block_r, block_n, warps = _pick(")
        assert "block_n = min(block_n, 256)" in new  # a loop's step sized from the row: capped, not fixed
        assert "block_r, warps = 8, 8" in new
    else:
        assert lines[rule - 1].strip() == 'warps = cfg.pop("num_warps")'
        assert "cfg = {**cfg, 'BLOCK_R': 8, 'BLOCK_N': 256}" in new and "warps = 8" in new
    assert new.count("_scale_rows[grid](") == 1
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()


def test_a_block_that_must_cover_the_row_is_left_alone_with_the_reason(tmp_path):
    src = HEAD.replace("for start in range(0, N, BLOCK_N):\n        cols = start + tl.arange(0, BLOCK_N)",
                       "if True:\n        cols = tl.arange(0, BLOCK_N)") + textwrap.dedent(FORMS["tuple"]) + MODEL
    assert "range(0, N, BLOCK_N)" not in src, "fixture drifted"
    p = problem_folder(tmp_path / "row", src, REFERENCE, SPEC)
    traces(p)
    model = parse_kernel(p.kernel_source)
    names, why = tunable_names(model, single_launch(model, "_scale_rows"))
    assert "BLOCK_N" not in names and "may have to cover a whole row" in why["BLOCK_N"]
    new = apply_config(p.kernel_source, "_scale_rows", {"BLOCK_N": 256, "BLOCK_R": 8})
    rule = [ln.strip() for ln in new.split("# xeforge launch-params")[1].splitlines()[1:]
            if ln.strip() and not ln.strip().startswith("#")][0]
    assert rule == "block_r = 8"  # BLOCK_N, which must cover the row here, is not set


SPLIT = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _scale_chunks(x_ptr, y_ptr, N, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        part = tl.program_id(1)
        begin = part * CHUNK
        end = tl.minimum(begin + CHUNK, N)
        for start in range(begin, end, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            m = cols < end
            x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0)
            tl.store(y_ptr + row * N + cols, x * 2.0, mask=m)


    def _chunk_for(rows, n):
        return max(16, triton.next_power_of_2(triton.cdiv(n, max(1, 256 // rows))))


    def scale_rows(x):
        y = torch.empty_like(x)
        chunk = _chunk_for(x.shape[0], x.shape[1])
        n_chunks = triton.cdiv(x.shape[1], chunk)
        _scale_chunks[(x.shape[0], n_chunks)](x, y, x.shape[1], CHUNK=chunk, BLOCK_N=min(64, chunk))
        return y
''') + MODEL


def test_a_split_size_the_grid_reads_through_a_local_is_searched_by_its_neighbours(tmp_path, verify):
    """A split-KV decode wrapper's shape: the host sizes the split (``chunk``), the grid's axis is a local made
    from ``cdiv(n, chunk)`` after it, and no tuning-space role names the split: it is searched all the same."""
    p = problem_folder(tmp_path / "split", SPLIT, REFERENCE, SPEC)
    traces(p)
    model = parse_kernel(p.kernel_source)
    site = single_launch(model, "_scale_chunks")
    names, why = tunable_names(model, site)
    assert "CHUNK" in names, why
    ctx = tactic_context(p, target="arc-b580")
    cands = LaunchParamSearch().propose(ctx)
    chunks = [c.params["CHUNK"] for c in cands if set(c.params) == {"CHUNK"}]
    made = host_made(model, site)["CHUNK"].value
    assert chunks and set(chunks) <= {made // 2, made * 2, made // 4, made * 4}, [c.params for c in cands]
    new = next(c.source for c in cands if set(c.params) == {"CHUNK"})
    rule = new.index("# xeforge launch-params")
    assert new.index("chunk = _chunk_for(") < rule < new.index("n_chunks = triton.cdiv(")
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()


def test_a_persistent_gemms_tiles_from_a_host_table_are_searched_and_fitted_per_class(verify):
    """persistent_matmul takes BLOCK_M/N/K from a dict keyed on the dtype; the kernel tiles M and N itself
    (`tiles_m = tl.cdiv(M, BLOCK_M)`, a tile loop up to `num_tiles`) and the host sizes the grid from the same
    values. On an H100 the search left them alone ("neither sizes a grid axis nor steps a loop"), and M = 16 ran a
    128-row tile at 0.45x of torch.compile. The tiles are searched now, and the M = 16 class fits BLOCK_M to 16;
    both verified on the interpreter."""
    from stages.device_tuning import STAGE
    from tests.realworld import problem_dir

    p = load_problem(problem_dir("persistent_matmul"))
    ctx = tactic_context(p, kind="cuda", target="h100", cores=132)
    search = next(t for t in STAGE.tactics if t.name == "launch-params")
    app = search.check(ctx)
    assert app.applies and "BLOCK_M, BLOCK_N, BLOCK_K" in app.reason, app.reason
    assert "GROUP_SIZE_M=group_m is made on the host (8 at" in app.reason  # not a tile: left as it is
    tile = next(c for c in search.propose(ctx) if "BLOCK_M=64" in c.description)
    assert "block_m = min(block_m, 64)" in tile.source
    per_shape = next(t for t in STAGE.tactics if t.name == "per-shape-config")
    plan = per_shape.plan(ctx)
    assert [(c.test, c.block) for c in plan.classes] == [("M <= 256", "BLOCK_M")]
    fitted = next(c for c in per_shape.propose(ctx) if c.params.get("BLOCK_M") == 16 and "swap" not in
                  c.description)
    for src in (tile.source, fitted.source.replace("if M <= 256:", "if M <= 32:")):  # ci's 64 rows take the else
        verdict = verify(p, src)
        assert verdict.correct, verdict.feedback()


def test_a_grid_axis_the_host_computes_from_the_block_lets_the_block_be_searched(verify):
    """moe_grouped_gemm pads each expert's rows to BLOCK_M on the host (`_align_rows_to_blocks(offsets,
    cfg["BLOCK_M"], T)`) and launches one program per padded block (`n_blocks = block_expert.numel()`): the grid
    follows the block through those locals. The search left BLOCK_M alone ("neither sizes a grid axis nor steps a
    loop"); it sets it where cfg is made now, before the padding, and the result verifies."""
    from stages.device_tuning import STAGE
    from tests.realworld import problem_dir

    p = load_problem(problem_dir("moe_grouped_gemm"))
    ctx = tactic_context(p, kind="cuda", target="h100", cores=132)
    search = next(t for t in STAGE.tactics if t.name == "launch-params")
    app = search.check(ctx)
    assert app.applies and "BLOCK_M, BLOCK_N, BLOCK_K" in app.reason, app.reason
    cand = next(c for c in search.propose(ctx) if c.params.get("BLOCK_M") == 128)
    src = cand.source
    assert src.index("cfg = {**cfg, 'BLOCK_M': 128") < src.index("_align_rows_to_blocks(expert_offsets, cfg[")
    verdict = verify(p, src)
    assert verdict.correct, verdict.feedback()


# the same kernel, its blocks and warps made by its own @triton.heuristics, its grid a lambda over META
HEURISTIC_KERNEL = HEAD.replace("@triton.jit\n", textwrap.dedent('''\
    @triton.heuristics({
        "BLOCK_R": lambda a: 1 if a["n_rows"] < 64 else 4,
        "BLOCK_N": lambda a: min(triton.next_power_of_2(a["N"]), 1024),
        "num_warps": lambda a: 4 if a["N"] >= 512 else 2,
    })
    @triton.jit
    '''), 1) + textwrap.dedent('''
    def scale_rows(x):
        y = torch.empty_like(x)
        _scale_rows[lambda meta: (triton.cdiv(x.shape[0], meta["BLOCK_R"]),)](x, y, x.shape[0], x.shape[1])
        return y
    ''') + MODEL


def test_values_a_kernels_heuristics_make_are_searched_and_set_in_its_decorator(tmp_path, verify):
    """``@triton.heuristics`` sets BLOCK_R, BLOCK_N and num_warps over anything the launch passes, so the launch
    search left them alone ("BLOCK_N is not passed at line ...", said of the real-world swiglu). They are read from
    the trace per variant and a configuration is written into the decorator's entries: a constant where the grid
    reads the block from its meta-parameters, a cap around the user's own entry where a loop steps the row by it.
    The new values are what runs (the trace of the candidate sees them), and the result verifies."""
    from stages.device_tuning_shapes import PerShapeConfig
    from stages.device_tuning import target_site
    from xeforge.analysis.launches import observed
    from xeforge.rewrite.tiling.host_rule import heuristic_made

    d = tmp_path / "heuristics"
    d.mkdir()
    (d / "kernel.py").write_text(HEURISTIC_KERNEL)
    (d / "reference.py").write_text(REFERENCE)
    (d / "spec.yaml").write_text(SPEC + "bench-gpu-1:\n  - {params: [x], dims: {R: 16, N: 4096}}\n")
    p = load_problem(d)
    traces(p)
    model = parse_kernel(p.kernel_source)
    site = single_launch(model, "_scale_rows")
    made = heuristic_made(model, site)
    assert made["BLOCK_N"].values == {"ci": 128, "bench-gpu": 1024, "bench-gpu-1": 1024}
    assert made["BLOCK_R"].values["bench-gpu-1"] == 1 and made["num_warps"].values["bench-gpu"] == 4
    names, why = tunable_names(model, site)
    assert set(names) == {"BLOCK_R", "BLOCK_N"}, why
    new = apply_config(p.kernel_source, "_scale_rows", {"BLOCK_R": 8, "BLOCK_N": 64, "num_warps": 8})
    assert '"BLOCK_R": lambda args: 8,' in new and '"num_warps": lambda args: 8,' in new, new
    assert '"BLOCK_N": lambda args: min((lambda a: min(triton.next_power_of_2(a["N"]), 1024))(args), 64),' in new
    assert "# xeforge launch-params" in new and "_scale_rows[lambda meta:" in new and "BLOCK_N=" not in new
    p2 = load_problem(d)
    traces(p2, new)
    m2 = parse_kernel(new)
    seen = observed(m2, single_launch(m2, "_scale_rows"))
    assert set(seen["BLOCK_R"].values()) == {8} and set(seen["BLOCK_N"].values()) == {64}
    assert seen["num_warps"]["bench-gpu"] == 8
    verdict = verify(p, new)
    assert verdict.correct, verdict.feedback()
    # a per-shape branch's launch arguments would be overridden by the heuristics: the dispatch leaves them
    app = PerShapeConfig(target_site).check(tactic_context(p, kind="cuda", target="h100"))
    assert not app.applies and "@triton.heuristics" in app.reason, app.reason
