import torch


class Model(torch.nn.Module):
    """Rotary embedding, rotate-half form: x * cos + rotate_half(x) * sin, cos/sin [S, D]
    broadcast over batch and heads of x [B, S, H, D]."""

    def __init__(self):
        super().__init__()

    def forward(self, x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        rot = torch.cat((-x2, x1), dim=-1)
        c = cos[None, :, None, :]
        s = sin[None, :, None, :]
        return x * c + rot * s
