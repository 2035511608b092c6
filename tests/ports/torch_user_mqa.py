"""A user's own multi-query attention module (one key and value head for all query heads): a reference."""

import torch
from torch import nn


class MultiQueryAttention(nn.Module):
    def __init__(self, d_model, n_head, max_len=32):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model // n_head)
        self.value = nn.Linear(d_model, d_model // n_head)
        self.proj = nn.Linear(d_model, d_model)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len)).bool())

    def forward(self, x):
        B, T, C = x.shape
        q = self.query(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = self.key(x).unsqueeze(1)  # (B, 1, T, H): shared by the heads
        v = self.value(x).unsqueeze(1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)
