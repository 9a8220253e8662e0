"""Encoding a batch's variable-length rows in length-sorted chunks (training's forward pass).

:func:`plan_chunks` groups rows into forward passes of at most ``chunk_tokens`` padded
tokens; :class:`RowEncoder` runs them (under :func:`npmdb.encoder.forward_context`) and
:func:`assemble` puts the chunks' hidden states back in row order. :func:`rng_state` /
:func:`set_rng_state` let GradCache replay a chunk with the same dropout masks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from npmdb.encoder import forward_context

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["RowEncoder", "plan_chunks", "assemble", "rng_state", "set_rng_state"]


def plan_chunks(lengths: list[int], chunk_tokens: int, overhead: int = 96) -> list[list[int]]:
    """Rows grouped into forward passes of <= ``chunk_tokens`` padded tokens.

    Rows are sorted by length and cut where the padded cost ``sum(rows * longest) +
    overhead per pass`` is smallest (dynamic programming over the sorted lengths), so
    short blocks are not padded to a long one's length.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    ls = [lengths[i] for i in order]
    n = len(ls)
    best = [0.0] + [math.inf] * n   # best[j]: cost of rows order[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = ls[j - 1]
        for i in range(j - 1, -1, -1):
            rows = j - i
            if rows > 1 and rows * longest > chunk_tokens:
                break
            c = best[i] + rows * longest + overhead
            if c < best[j]:
                best[j], cut[j] = c, i
    out: list[list[int]] = []
    j = n
    while j > 0:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]


class RowEncoder:
    """Encodes a list of variable-length rows in length-sorted chunks."""

    def __init__(self, model: Any, device: "torch.device", pad_id: int, chunk_tokens: int) -> None:
        self.model = model
        self.device = device
        self.pad_id = pad_id
        self.chunk_tokens = chunk_tokens

    def _run(self, ids: list["torch.Tensor"], rows: list[int]) -> "torch.Tensor":
        import torch

        width = max(int(ids[r].numel()) for r in rows)
        x = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            n = int(ids[r].numel())
            x[j, :n] = ids[r]
            att[j, :n] = 1
        with forward_context(self.device):
            out = self.model(input_ids=x.to(self.device),
                             attention_mask=att.to(self.device)).last_hidden_state
        return out

    def plan(self, ids: list["torch.Tensor"]) -> list[list[int]]:
        return plan_chunks([int(t.numel()) for t in ids], self.chunk_tokens)

    def forward(self, ids: list["torch.Tensor"], plan: list[list[int]], *,
                rng_states: list | None = None) -> list["torch.Tensor"]:
        """Per chunk ``[rows, width, h]`` hidden states (with the graph, if grad is on).

        With ``rng_states`` (a list), the RNG state before each chunk is appended to it.
        """
        outs = []
        for rows in plan:
            if rng_states is not None:
                rng_states.append(rng_state(self.device))
            outs.append(self._run(ids, rows))
        return outs


def rng_state(device: "torch.device") -> tuple:
    import torch

    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple, device: "torch.device") -> None:
    import torch

    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


def assemble(outs: list["torch.Tensor"], plan: list[list[int]], n_rows: int, width: int
            ) -> "torch.Tensor":
    """``[n_rows, width, h]`` from per-chunk outputs (differentiable; padding is zero)."""
    import torch

    h = outs[0].shape[-1]
    full = outs[0].new_zeros((n_rows, width, h))
    for out, rows in zip(outs, plan):
        w = min(out.shape[1], width)
        idx = torch.as_tensor(rows, device=out.device)
        full = full.index_copy(0, idx, torch.nn.functional.pad(out[:, :w], (0, 0, 0, width - w)))
    return full

