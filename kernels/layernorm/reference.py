import torch


class Model(torch.nn.Module):
    """LayerNorm over the last dim with elementwise affine."""

    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        with torch.no_grad():  # non-trivial, deterministic affine
            self.norm.weight.copy_(torch.linspace(0.5, 1.5, hidden_size))
            self.norm.bias.copy_(torch.linspace(-0.25, 0.25, hidden_size))

    def forward(self, x):
        return self.norm(x)
