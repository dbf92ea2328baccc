"""A small MLP whose width, depth and dropout come from the config."""

from __future__ import annotations

from torch import nn


class MLP(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, width: int, depth: int, dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        dim = in_dim
        for _ in range(depth):
            layers += [nn.Linear(dim, width), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            dim = width
        layers.append(nn.Linear(dim, out_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)
