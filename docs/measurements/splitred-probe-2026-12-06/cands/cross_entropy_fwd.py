"""Cross-entropy forward per row over a large vocabulary, shaped like the fused losses of LLM
training libraries: one program per row, an online logsumexp over vocab chunks, a HAS_SMOOTHING
heuristic for label smoothing, ignore_index handled in the kernel, reduction='none' output."""
import torch
import triton
import triton.language as tl


@triton.heuristics({"HAS_SMOOTHING": lambda args: args["smoothing"] > 0.0})
@triton.jit
def _cross_entropy_fwd_kernel(
    Loss, Lse, Logits, Labels,
    smoothing, ignore_index,
    n_cols, stride_row,
    BLOCK_V: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    Logits += row * stride_row
    label = tl.load(Labels + row)
    offs = tl.arange(0, BLOCK_V)

    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], dtype=tl.float32)
    total = tl.zeros([], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_V):
        cols = start + offs
        mask = cols < n_cols
        z = tl.load(Logits + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(z, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m = m_new
        if HAS_SMOOTHING:
            total += tl.sum(tl.where(mask, z, 0.0), axis=0)
    lse = m + tl.log(s)

    ignored = label == ignore_index
    safe_label = tl.where(ignored, 0, label)
    z_label = tl.load(Logits + safe_label).to(tl.float32)
    if HAS_SMOOTHING:
        # (1 - eps) * (lse - z_y) + eps * (lse - mean(z))
        loss = lse - (1.0 - smoothing) * z_label - smoothing * (total / n_cols)
    else:
        loss = lse - z_label
    loss = tl.where(ignored, 0.0, loss)
    tl.store(Loss + row, loss)
    tl.store(Lse + row, lse)


@triton.heuristics({"HAS_SMOOTHING": lambda args: args["smoothing"] > 0.0})
@triton.jit
def _cross_entropy_fwd_kernel_split(
    Loss, Lse, Logits, Labels,
    smoothing, ignore_index,
    n_cols, stride_row,
    m_part, s_part, total_part,
    BLOCK_V: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    SPLIT: tl.constexpr,
):
    sp = tl.program_id(0) % SPLIT
    row = (tl.program_id(0) // SPLIT).to(tl.int64)
    Logits += row * stride_row
    label = tl.load(Labels + row)
    offs = tl.arange(0, BLOCK_V)

    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], dtype=tl.float32)
    total = tl.zeros([], dtype=tl.float32)
    # split reduction: slice sp of SPLIT runs steps [it_lo, it_hi) of the loop
    n_it = tl.cdiv(n_cols, BLOCK_V)
    it_per = tl.cdiv(n_it, SPLIT)
    it_lo = sp * it_per
    it_hi = tl.minimum(n_it, it_lo + it_per)
    for start in range(it_lo * BLOCK_V, it_hi * BLOCK_V, BLOCK_V):
        cols = start + offs
        mask = cols < n_cols
        z = tl.load(Logits + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(z, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m = m_new
        if HAS_SMOOTHING:
            total += tl.sum(tl.where(mask, z, 0.0), axis=0)
    # split reduction: this slice's states, as float32 partials for _cross_entropy_fwd_kernel_combine
    part_idx = (((tl.program_id(0) // SPLIT).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)) * SPLIT + sp
    tl.store(m_part + part_idx, m)
    tl.store(s_part + part_idx, s)
    tl.store(total_part + part_idx, total)


@triton.heuristics({"HAS_SMOOTHING": lambda args: args["smoothing"] > 0.0})
@triton.jit
def _cross_entropy_fwd_kernel_combine(
    Loss, Lse, Logits, Labels,
    smoothing, ignore_index,
    n_cols, stride_row,
    m_part, s_part, total_part,
    BLOCK_V: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    SPLIT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    Logits += row * stride_row
    label = tl.load(Labels + row)
    offs = tl.arange(0, BLOCK_V)

    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], dtype=tl.float32)
    total = tl.zeros([], dtype=tl.float32)
    # split reduction: the SPLIT slices' partial states of this program, combined in slice order
    part_idx = ((tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)) * SPLIT
    for sj in tl.static_range(SPLIT):
        m = tl.maximum(m, tl.load(m_part + part_idx + sj))
    for sj in tl.static_range(SPLIT):
        m_j = tl.load(m_part + part_idx + sj)
        w_s = tl.exp(m_j - m)
        s = s + tl.where(w_s > 0, tl.load(s_part + part_idx + sj) * w_s, 0.0)
        total = total + tl.load(total_part + part_idx + sj)
    lse = m + tl.log(s)

    ignored = label == ignore_index
    safe_label = tl.where(ignored, 0, label)
    z_label = tl.load(Logits + safe_label).to(tl.float32)
    if HAS_SMOOTHING:
        # (1 - eps) * (lse - z_y) + eps * (lse - mean(z))
        loss = lse - (1.0 - smoothing) * z_label - smoothing * (total / n_cols)
    else:
        loss = lse - z_label
    loss = tl.where(ignored, 0.0, loss)
    tl.store(Loss + row, loss)
    tl.store(Lse + row, lse)


def cross_entropy_fwd(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0,
                      ignore_index: int = -100) -> torch.Tensor:
    """Per-row loss (reduction='none'), float32, shape [n_rows]."""
    assert logits.dim() == 2, "logits must be [n_rows, vocab]"
    assert labels.shape == (logits.shape[0],), "one label per row"
    assert 0.0 <= label_smoothing < 1.0
    n_rows, n_cols = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    labels = labels.contiguous()
    loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    if n_rows == 0:
        return loss
    # chunk wide enough to stream the vocab, small enough to stay in registers
    BLOCK_V = min(triton.next_power_of_2(n_cols), 8192 // logits.element_size())
    num_warps = 4 if BLOCK_V < 2048 else 8
    if n_rows <= 256:
        # split reduction: split_r programs per program of _cross_entropy_fwd_kernel, each over a slice of its loop; their partial m, s, total
        # go to _cross_entropy_fwd_kernel_combine, which combines them and runs the rest
        split_r = 16
        grid_r = (n_rows,)
        m_partials = torch.empty(grid_r[0] * split_r, device=loss.device, dtype=torch.float32)
        s_partials = torch.empty(grid_r[0] * split_r, device=loss.device, dtype=torch.float32)
        total_partials = torch.empty(grid_r[0] * split_r, device=loss.device, dtype=torch.float32)
        _cross_entropy_fwd_kernel_split[(grid_r[0] * split_r,)](
            loss, lse, logits, labels,
            label_smoothing, ignore_index,
            n_cols, logits.stride(0),
            m_part=m_partials, s_part=s_partials, total_part=total_partials, SPLIT=split_r,
            BLOCK_V=BLOCK_V, num_warps=num_warps,
        )
        _cross_entropy_fwd_kernel_combine[grid_r](
            loss, lse, logits, labels,
            label_smoothing, ignore_index,
            n_cols, logits.stride(0),
            m_part=m_partials, s_part=s_partials, total_part=total_partials, SPLIT=split_r,
            BLOCK_V=BLOCK_V, num_warps=num_warps,
        )
    else:
        _cross_entropy_fwd_kernel[(n_rows,)](
            loss, lse, logits, labels,
            label_smoothing, ignore_index,
            n_cols, logits.stride(0),
            BLOCK_V=BLOCK_V, num_warps=num_warps,
        )
    return loss


def cross_entropy_fwd_ref(logits, labels, label_smoothing=0.0, ignore_index=-100):
    cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return torch.nn.functional.cross_entropy(
        logits.to(cdt), labels, reduction="none",
        label_smoothing=label_smoothing, ignore_index=ignore_index)


# ---- xeforge new: everything below is generated (docs/new.md) and is not part of examples/realworld/cross_entropy_fwd/cross_entropy_fwd.py ----
import torch


class Model(torch.nn.Module):
    """Calls cross_entropy_fwd(...) as examples/realworld/cross_entropy_fwd/cross_entropy_fwd.py's users do (generated by `xeforge new`: docs/new.md)."""

    def __init__(self):
        super().__init__()

    def forward(self, logits, labels):
        result = cross_entropy_fwd(logits, labels, label_smoothing=0.1)
        return result
