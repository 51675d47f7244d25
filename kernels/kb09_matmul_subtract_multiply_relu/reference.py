import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    """Linear, subtract a constant, multiply by a constant, ReLU."""

    def __init__(self, in_features, out_features, subtract_value, multiply_value):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)
        self.subtract_value = subtract_value
        self.multiply_value = multiply_value

    def forward(self, x):
        x = self.linear(x)
        x = x - self.subtract_value
        x = x * self.multiply_value
        return torch.relu(x)
