import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    """Linear, BatchNorm1d in inference form, + scalar bias, / divide_value, Swish."""

    def __init__(self, in_features, out_features, bn_eps=1e-5, bn_momentum=0.1, divide_value=1.0):
        super().__init__()
        self.matmul = torch.nn.Linear(in_features, out_features)
        self.bn = torch.nn.BatchNorm1d(out_features, eps=bn_eps, momentum=bn_momentum)
        self.bias = torch.nn.Parameter(torch.randn(1))
        self.divide_value = divide_value
        with torch.no_grad():  # inference-form BatchNorm with non-trivial running stats
            self.bn.running_mean.copy_(torch.linspace(-0.5, 0.5, out_features))
            self.bn.running_var.copy_(torch.linspace(0.5, 2.0, out_features))
            self.bn.weight.copy_(torch.linspace(0.75, 1.25, out_features))
            self.bn.bias.copy_(torch.linspace(-0.1, 0.1, out_features))

    def forward(self, x):
        x = self.matmul(x)
        bn = self.bn
        x = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, training=False, eps=bn.eps)
        x = x + self.bias
        x = x / self.divide_value
        return x * torch.sigmoid(x)
