"""Linear layers for decode-sized inputs that use every CPU core.

With the MKL build of torch for CPU, ``x @ W.T`` over a few rows takes a single-threaded
path: on 2 cores a forward of SmolLM2-135M reading its ~0.5 GB of weights ran at
~12 GB/s. The same product written as ``W @ x.T`` with at least two columns takes the
multithreaded GEMM and ran ~2.5x faster (benchmarks/small_matmul.py measures it). Plain
and speculative decoding both go through this path, so their ratio stays fair.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # past this the usual GEMM is already efficient


def _padded_rows(rows: int) -> int:
    # one column falls back to the slow kernel; column counts past 8 that are not a
    # multiple of 8 took longer than the next multiple of 8 (measured on 2 cores)
    if rows == 1:
        return 2
    return rows if rows <= 8 else -(-rows // 8) * 8


def _forward(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if rows > MAX_ROWS or torch.is_grad_enabled():
        return F.linear(x, linear.weight, linear.bias)
    # row-major input, so that ``flat.T`` is a transposed view: the layout the fast
    # kernel takes (a column-major copy falls back to the slow one)
    flat = x.reshape(rows, x.shape[-1])
    padded = _padded_rows(rows)
    if padded != rows:
        flat = torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])])
    else:
        flat = flat.contiguous()
    out = (linear.weight @ flat.T).T[:rows].contiguous()
    if linear.bias is not None:
        out = out + linear.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def enable(model: torch.nn.Module) -> None:
    """Route the model's linear layers through ``_forward`` (idempotent, CPU only)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.device.type == "cpu":
            module.forward = partial(_forward, module)
