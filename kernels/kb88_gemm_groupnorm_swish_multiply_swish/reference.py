import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    """Linear, GroupNorm, Swish, * per-feature weight, Swish."""

    def __init__(self, in_features, out_features, num_groups):
        super().__init__()
        self.gemm = torch.nn.Linear(in_features, out_features)
        self.group_norm = torch.nn.GroupNorm(num_groups, out_features)
        self.multiply_weight = torch.nn.Parameter(torch.randn(out_features))
        with torch.no_grad():  # non-trivial, deterministic affine
            self.group_norm.weight.copy_(torch.linspace(0.5, 1.5, out_features))
            self.group_norm.bias.copy_(torch.linspace(-0.25, 0.25, out_features))

    def forward(self, x):
        x = self.gemm(x)
        x = self.group_norm(x)
        x = x * torch.sigmoid(x)
        x = x * self.multiply_weight
        return x * torch.sigmoid(x)
