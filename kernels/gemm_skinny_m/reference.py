import torch


class Model(torch.nn.Module):
    """y = x @ W^T (bias-free Linear) with a small batch M."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.proj = torch.nn.Linear(in_features, out_features, bias=False)

    def forward(self, x):
        return self.proj(x)
