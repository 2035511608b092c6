"""Capture + alignment time of ``locate`` on a GPT-sized block (d=768, 12 heads, T=128 and 256).

The reference is a plain torch block written as a user would (LayerNorm, causal attention with a
fused QKV projection, LayerNorm, GELU MLP, residuals); the candidate is the same block ported to
NumPy by hand (a user's port: no instrumentation). Each phase is timed on its own in one process,
median of ``--rounds``; the results go to ``benchmarks/locate.md``.

    PYTHONPATH=$PWD python benchmarks/locate.py [--tokens 128 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import platform
import statistics
import time

import numpy as np
import torch
from torch import nn

from parity_tests.locate import capture, compare_traces

D_MODEL, HEADS = 768, 12


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(nn.functional.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def block(p, x, n_head=HEADS):
    B, T, C = x.shape
    h = layer_norm(x, p["ln_1.weight"], p["ln_1.bias"])
    qkv = h @ p["c_attn.weight"].T + p["c_attn.bias"]
    q, k, v = np.split(qkv, 3, axis=-1)
    q = q.reshape(B, T, n_head, -1).transpose(0, 2, 1, 3)
    k = k.reshape(B, T, n_head, -1).transpose(0, 2, 1, 3)
    v = v.reshape(B, T, n_head, -1).transpose(0, 2, 1, 3)
    att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    att = np.where(np.triu(np.ones((T, T), dtype=bool), 1), -np.inf, att)
    att = np.exp(att - att.max(-1, keepdims=True))
    att = att / att.sum(-1, keepdims=True)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    x = x + y @ p["c_proj.weight"].T + p["c_proj.bias"]
    h = layer_norm(x, p["ln_2.weight"], p["ln_2.bias"])
    h = h @ p["c_fc.weight"].T + p["c_fc.bias"]
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    return x + h @ p["mlp_proj.weight"].T + p["mlp_proj.bias"]


def measure(tokens: int, rounds: int) -> dict[str, float]:
    torch.manual_seed(0)
    module = Block(D_MODEL, HEADS).eval()
    params = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    x = np.random.default_rng(0).standard_normal((1, tokens, D_MODEL)).astype(np.float32)
    times: dict[str, list[float]] = {"capture torch": [], "capture numpy": [], "align + report": []}
    for _ in range(rounds):
        start = time.perf_counter()
        expected = capture(module, (x,))
        times["capture torch"].append(time.perf_counter() - start)
        start = time.perf_counter()
        actual = capture(block, (x,), params)
        times["capture numpy"].append(time.perf_counter() - start)
        start = time.perf_counter()
        report = compare_traces(expected, actual)
        times["align + report"].append(time.perf_counter() - start)
        if not report.ok:
            raise RuntimeError(f"the benchmark's port should match:\n{report}")
    result = {phase: statistics.median(values) for phase, values in times.items()}
    result["total"] = sum(result.values())
    result["records"] = len(expected.records) + len(actual.records)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).with_name("locate.md")))
    args = parser.parse_args()
    rows = []
    for tokens in args.tokens:
        r = measure(tokens, args.rounds)
        rows.append(
            f"| 1 x {tokens} x {D_MODEL}, {HEADS} heads | {r['records']} | {r['capture torch']:.2f} | "
            f"{r['capture numpy']:.2f} | {r['align + report']:.2f} | **{r['total']:.2f}** |"
        )
        print(rows[-1])
    text = "\n".join(
        [
            "# locate: capture + alignment time on a GPT-sized block",
            "",
            "A plain torch block (LayerNorm, causal attention with a fused QKV projection, GELU MLP,",
            "residuals) as the reference, the same block ported to NumPy by hand as the candidate; no",
            "instrumentation in either. Seconds, median of "
            f"{args.rounds} rounds, one process, {platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} torch threads. Goal: under 5 s.",
            "",
            "Run: `PYTHONPATH=$PWD python benchmarks/locate.py`",
            "",
            "| input | records | capture torch | capture numpy | align + report | total |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
        ]
    )
    pathlib.Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
