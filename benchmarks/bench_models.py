"""Models the benchmarks use, in plain torch.nn (no torchvision): ResNet-18 and a small transformer LM.

Not a package module: fusion.py and train.py import it as a sibling. ``resnet18()`` follows
torchvision's layout (BasicBlock x [2, 2, 2, 2], 11.7 M parameters, 62 tensors), so its
parameter shapes are ResNet-18's; ``TransformerLM`` is a GPT-style causal language model
(token + position embeddings, pre-norm encoder layers, tied output head). ``synthetic_tokens``
makes a learnable token stream (a fixed random Markov chain) so a training loss falls.
"""
from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def resnet18(num_classes: int = 1000) -> nn.Module:
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


class TransformerLM(nn.Module):
    """Causal LM: ``forward(tokens[B, T]) -> logits[B, T, vocab]``."""

    def __init__(self, vocab: int = 2048, d: int = 256, layers: int = 4, heads: int = 4, seq: int = 128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


def shapes(model: nn.Module) -> list:
    """The shapes of the model's trainable parameters, in registration order."""
    return [tuple(p.shape) for p in model.parameters() if p.requires_grad]


def synthetic_tokens(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """``n`` tokens from a fixed random Markov chain (each token has 4 likely successors)."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, 4), generator=g)
    out = torch.empty(n, dtype=torch.long)
    tok = 0
    picks = torch.randint(0, 4, (n,), generator=g)
    noise = torch.rand(n, generator=g) < 0.1
    rand = torch.randint(0, vocab, (n,), generator=g)
    for i in range(n):
        tok = int(rand[i]) if noise[i] else int(succ[tok, picks[i]])
        out[i] = tok
    return out
