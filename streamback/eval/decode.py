"""Greedy generation's forward passes with a key/value cache: the model's own modules, run one
new token at a time after one pass over the contexts.

`CachedDecoder` drives a `Transformer` (streamback.model.model) through its parts: the
embedding into the stream (`embed`), each block's norms, projections, RoPE, feed-forward and
stream adds (`fmt.add`, so every residual add is rounded to the trained stream format as in the
model's forward), and the output head (`logits`). Only attention differs from the model's: it
keeps each layer's keys and values (after RoPE, in the compute dtype, as the model computes
them) for the positions seen so far and lets a new token attend to them, instead of recomputing
every position at every step. In exact arithmetic the logits are the model's; in floating point
they differ by the rounding of other matmul shapes (tests/unit/test_eval.py checks the logits against
the model's forward and the greedy tokens against the no-cache loop).

Rows are right-padded: row b holds its context at positions 0..len_b - 1 and writes its k-th new
token at position len_b + k, so every row keeps its own positions (RoPE) and attends only to its
own positions up to the current one (a mask; the padding beyond is never read). Rows that finish
are dropped (`keep`). A stream format whose rounding depends on the whole tensor (NVFP4's
per-tensor scale) is then rounded over the tokens of the step at hand: in generation, as in
scoring a padded batch, that scale is not the training batch's anyway.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from streamback.model.model import apply_rope


class CachedDecoder:
    """Decoding state of a batch of contexts (`tokens` [B, T], row b's first `lengths[b]` tokens;
    the rest padding) with room for `capacity` positions per row. After construction, `logits`
    [B, vocab] are those of each row's last context token; `step(next_ids)` appends one token
    per row and sets `logits` to those after it."""

    @torch.inference_mode()
    def __init__(self, model, tokens: torch.Tensor, lengths: torch.Tensor, capacity: int):
        B, T = tokens.shape
        if capacity > model.args.max_seq_len or T > capacity:
            raise ValueError(
                f"capacity {capacity} must hold the {T} context positions and fit max_seq_len {model.args.max_seq_len}"
            )
        self.model, self.device = model, tokens.device
        attention = model.layers[0].attention
        shape = (B, attention.n_kv_heads, capacity, attention.head_dim)
        # zeros, not empty: a masked position still enters attention's product (0 x its value), so never garbage or NaN
        self.keys = [torch.zeros(shape, dtype=model.compute_dtype, device=self.device) for _ in model.layers]
        self.values = [torch.zeros(shape, dtype=model.compute_dtype, device=self.device) for _ in model.layers]
        self.positions = lengths.to(self.device) - 1  # of each row's last token
        cos, sin = model.rope_cos[:T], model.rope_sin[:T]
        h = model.embed(tokens)
        for i, layer in enumerate(model.layers):
            q, k, v = self._project(layer.attention, layer.attention_norm(h, model.compute_dtype), cos, sin)
            self.keys[i][:, :, :T], self.values[i][:, :, :T] = k, v
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            h = self._rest_of_block(layer, h, out)
        last = h[torch.arange(B, device=self.device), self.positions]
        self.logits = model.logits(last[:, None])[:, 0]

    @staticmethod
    def _project(attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q, k, v [B, heads, T, head_dim] of the normed input x [B, T, dim], RoPE applied (cos and
        sin: [T, head_dim / 2])."""
        B, T, _ = x.shape
        q = apply_rope(attention.wq(x).view(B, T, attention.n_heads, attention.head_dim), cos, sin)
        k = apply_rope(attention.wk(x).view(B, T, attention.n_kv_heads, attention.head_dim), cos, sin)
        v = attention.wv(x).view(B, T, attention.n_kv_heads, attention.head_dim)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _rest_of_block(self, layer, h: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The block after its attention: output projection, stream add, feed-forward, stream add."""
        B, _, T, _ = attended.shape
        mid = layer.fmt.add(h, layer.attention.wo(attended.transpose(1, 2).reshape(B, T, -1)))
        return layer.fmt.add(mid, layer.feed_forward(layer.ffn_norm(mid, self.model.compute_dtype)))

    @torch.inference_mode()
    def step(self, next_ids: torch.Tensor) -> torch.Tensor:
        """Append `next_ids` [B] (one token per row) and return the logits [B, vocab] after them."""
        model, B = self.model, next_ids.shape[0]
        self.positions = self.positions + 1
        rows, pos = torch.arange(B, device=self.device), self.positions
        width = int(pos.max()) + 1
        # RoPE per row at its own position: the batch takes apply_rope's time axis ([B, 1, H, D] -> [1, B, H, D])
        cos, sin = model.rope_cos[pos], model.rope_sin[pos]
        mask = (torch.arange(width, device=self.device)[None, :] <= pos[:, None])[:, None, None, :]
        h = model.embed(next_ids[:, None].to(self.device))
        for i, layer in enumerate(model.layers):
            q, k, v = self._project(
                layer.attention, layer.attention_norm(h, model.compute_dtype).transpose(0, 1), cos, sin
            )
            q, k, v = (t.transpose(0, 2) for t in (q, k, v))  # [1, H, B, D] -> [B, H, 1, D]
            self.keys[i][rows, :, pos], self.values[i][rows, :, pos] = k[:, :, 0], v[:, :, 0]
            out = F.scaled_dot_product_attention(
                q, self.keys[i][:, :, :width], self.values[i][:, :, :width], attn_mask=mask, enable_gqa=True
            )
            h = self._rest_of_block(layer, h, out)
        self.logits = model.logits(h)[:, 0]
        return self.logits

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (by their current index), e.g. when the others have finished."""
        index = torch.tensor(rows, device=self.device)
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.positions, self.logits = self.positions[index], self.logits[index]
