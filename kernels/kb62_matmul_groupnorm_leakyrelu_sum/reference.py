import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    """Linear, GroupNorm, LeakyReLU, x + x."""

    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = torch.nn.Linear(input_size, hidden_size)
        self.gn = torch.nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.negative_slope = negative_slope
        out_features = hidden_size
        with torch.no_grad():  # non-trivial, deterministic affine
            self.gn.weight.copy_(torch.linspace(0.5, 1.5, out_features))
            self.gn.bias.copy_(torch.linspace(-0.25, 0.25, out_features))

    def forward(self, x):
        x = self.fc(x)
        x = self.gn(x)
        x = F.leaky_relu(x, self.negative_slope)
        return x + x
