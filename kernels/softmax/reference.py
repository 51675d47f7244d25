import torch


class Model(torch.nn.Module):
    """Softmax over the last dim of a 2-D tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)
