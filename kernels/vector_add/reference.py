import torch


class Model(torch.nn.Module):
    """Elementwise x + y."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return x + y
