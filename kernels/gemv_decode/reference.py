import torch


class Model(torch.nn.Module):
    """Decode-step projection y = x @ W^T (bias-free Linear), batch 1."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.proj = torch.nn.Linear(in_features, out_features, bias=False)

    def forward(self, x):
        return self.proj(x)
