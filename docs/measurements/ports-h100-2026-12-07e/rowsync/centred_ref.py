import torch
import torch.nn.functional as F


def linear(x, weight, bias):
    return torch.nn.functional.linear(x, weight, bias)


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features) * 0.05)
        self.bias = torch.nn.Parameter(torch.randn(out_features) * 0.05)
        self.bias2 = torch.nn.Parameter(torch.randn(out_features) * 0.1)  # its shape is the trace's to tell
        self.slope = 0.2  # a Python scalar: the kernel receives it at run time

    def forward(self, x):
        y = linear(x, self.weight, self.bias)
        m = y.mean(1, keepdim=True)
        return y - m
