"""The Transformer encoder-decoder of "Attention Is All You Need" (Vaswani et al., 2017).

Read top to bottom: configuration, attention, feed-forward, the encoder and decoder layers, the
full model with `encode()` and `decode()` kept apart, and the incremental `decode_step()` that
the ONNX export and the serving path are built on.

Conventions
- `src_mask` is (B, S) with 1 for real source tokens and 0 for padding. Inside the model it
  becomes an *additive* bias with a large finite negative value (never -inf), so that a row that
  is entirely padding yields a uniform, finite attention distribution instead of NaN.
- Positions are explicit, per row, so that rows of one decoder call may be at different steps.
- Shapes: B batch, S source length, T target length, P past length, H heads, d_k head size.
- The defaults are mtserve's own models; the other settings (activation, unscaled embeddings, a
  stored position table, a logits bias, a separate source vocabulary, another decoder start token)
  are those of imported Hugging Face Marian and M2M100/NLLB checkpoints (`export/hf/`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

# Large, finite and safe in fp16 (max ~65504): exp(NEG_INF + score) underflows to exactly 0.
NEG_INF = -1.0e4

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


@dataclass
class ModelConfig:
    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    max_positions: int = 256
    pre_norm: bool = True
    tie_embeddings: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3
    activation: str = "relu"  # of the feed-forward layers: "relu" | "gelu" (exact, erf) | "swish" (SiLU)
    scale_embedding: bool = True  # token embeddings times √d_model
    positions: str = "sinusoidal"  # "sinusoidal" (computed) | "table" (a stored `pe` buffer, row p = position p)
    logits_bias: bool = False  # a stored `final_logits_bias` (vocab_size,) added to the logits
    src_vocab_size: int | None = None  # set: the encoder has its own embedding `src_embed`; None: shares `embed`
    decoder_start_id: int | None = None  # the first decoder input token; None: bos_id
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {sorted(ACTIVATIONS)}")
        if self.positions not in ("sinusoidal", "table"):
            raise ValueError(f"positions {self.positions!r} is neither 'sinusoidal' nor 'table'")

    @property
    def start_id(self) -> int:
        """The token every target starts from (decoder input 0)."""
        return self.bos_id if self.decoder_start_id is None else self.decoder_start_id

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ----------------------------------------------------------------------------- masks


def padding_bias(src_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) 1/0 key mask -> (B, 1, 1, S) additive bias: 0 for real keys, NEG_INF for padding."""
    return (1.0 - src_mask.to(torch.float32))[:, None, None, :] * NEG_INF


def causal_bias(T: int, device: torch.device) -> torch.Tensor:
    """(1, 1, T, T) additive bias: query t sees keys 0..t only."""
    i = torch.arange(T, device=device)
    future = (i[None, :] > i[:, None]).to(torch.float32)  # (T, T), 1 above the diagonal
    return (future * NEG_INF)[None, None]


# ----------------------------------------------------------------------------- attention


def scaled_dot_product_attention(q, k, v, bias, dropout_p: float = 0.0, training: bool = False):
    """softmax(Q Kᵀ / √d_k + bias) V. q: (B, H, Tq, d_k), k/v: (B, H, Tk, d_k), bias broadcasts
    to (B, H, Tq, Tk). Returns the context (B, H, Tq, d_k) and the weights (B, H, Tq, Tk)."""
    d_k = q.size(-1)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    context = torch.matmul(F.dropout(weights, dropout_p, training), v)  # (B, H, Tq, d_k)
    return context, weights


class MultiHeadAttention(nn.Module):
    """h parallel heads. Self-attention projects Q, K, V with one fused matrix; cross-attention
    projects Q from the decoder and K, V (fused) from the encoder memory."""

    def __init__(self, cfg: ModelConfig, self_attention: bool):
        super().__init__()
        self.n_heads, self.d_k, self.dropout = cfg.n_heads, cfg.d_k, cfg.dropout
        self.self_attention = self_attention
        if self_attention:
            self.qkv_proj = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        else:
            self.q_proj = nn.Linear(cfg.d_model, cfg.d_model)
            self.kv_proj = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # (B, T, d_model) -> (B, H, T, d_k)
        return x.view(B, T, self.n_heads, self.d_k).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = x.shape  # (B, H, T, d_k) -> (B, T, d_model)
        return x.transpose(1, 2).reshape(B, T, self.n_heads * self.d_k)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)  # 3 x (B, T, d_model)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def project_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.kv_proj(memory).chunk(2, dim=-1)  # 2 x (B, S, d_model)
        return self.split_heads(k), self.split_heads(v)

    def attend(self, q, k, v, bias, need_weights: bool = False):
        context, weights = scaled_dot_product_attention(q, k, v, bias, self.dropout, self.training)
        out = self.out_proj(self.merge_heads(context))  # (B, Tq, d_model)
        return out, (weights.mean(dim=1) if need_weights else None)  # weights: (B, Tq, Tk)


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2, applied to each position separately; act is ReLU
    (max(0, x)) unless the config says GELU or swish."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.act = ACTIVATIONS[cfg.activation]

    def forward(self, x):
        return self.w2(self.dropout(self.act(self.w1(x))))


class Residual(nn.Module):
    """x + Dropout(sublayer(LN(x))) for pre-norm; LN(x + Dropout(sublayer(x))) for post-norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.pre_norm

    def forward(self, x, sublayer):
        if self.pre_norm:
            out, extra = sublayer(self.norm(x))
            return x + self.dropout(out), extra
        out, extra = sublayer(x)
        return self.norm(x + self.dropout(out)), extra


def _no_extra(fn):
    return lambda x: (fn(x), None)


# ----------------------------------------------------------------------------- layers


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, self_attention=True)
        self.ffn = FeedForward(cfg)
        self.res_attn, self.res_ffn = Residual(cfg), Residual(cfg)

    def forward(self, x, src_bias):  # x: (B, S, d_model)
        def attn(h):
            return self.self_attn.attend(*self.self_attn.project_qkv(h), src_bias)

        x, _ = self.res_attn(x, attn)
        x, _ = self.res_ffn(x, _no_extra(self.ffn))
        return x


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, self_attention=True)
        self.cross_attn = MultiHeadAttention(cfg, self_attention=False)
        self.ffn = FeedForward(cfg)
        self.res_self, self.res_cross, self.res_ffn = Residual(cfg), Residual(cfg), Residual(cfg)

    def forward(self, x, self_bias, cross_k, cross_v, src_bias, past_kv=None, need_weights=False):
        """x: (B, T, d_model) new target positions. past_kv: optional (k, v), each (B, H, P, d_k),
        prepended to this call's keys/values. cross_k/cross_v: (n, H, S, d_k) and src_bias
        (n, 1, 1, S) for n sentences, each owning B // n consecutive rows of x (its beams; n == B
        without beams). Returns x, this call's (k, v) and the cross-attention weights averaged
        over heads (B, T, S) when asked for."""
        new_kv: list[torch.Tensor] = []

        def self_attn(h):
            q, k, v = self.self_attn.project_qkv(h)  # (B, H, T, d_k)
            new_kv.extend((k, v))
            if past_kv is not None:
                k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
            return self.self_attn.attend(q, k, v, self_bias)

        def cross_attn(h):
            # A sentence's beams share its keys and values: fold them into the query, so that each
            # sentence and head attends once with B // n * T queries instead of B // n times.
            B, T, _ = h.shape
            a, n = self.cross_attn, cross_k.shape[0]
            q = a.q_proj(h).reshape(n, -1, a.n_heads, a.d_k).transpose(1, 2)  # (n, H, B // n * T, d_k)
            out, weights = a.attend(q, cross_k, cross_v, src_bias, need_weights)  # (n, B // n * T, d_model)
            return out.reshape(B, T, -1), (weights.reshape(B, T, -1) if need_weights else None)

        x, _ = self.res_self(x, self_attn)
        x, weights = self.res_cross(x, cross_attn)
        x, _ = self.res_ffn(x, _no_extra(self.ffn))
        return x, (new_kv[0], new_kv[1]), weights


# ----------------------------------------------------------------------------- the model


def sinusoidal_table(max_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...)."""
    pos = torch.arange(max_positions, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div)
    return table  # (max_positions, d_model)


class Transformer(nn.Module):
    pe: torch.Tensor  # buffers, typed for the checker
    final_logits_bias: torch.Tensor

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)  # shared
        # A separate source vocabulary has its own embedding; otherwise the encoder shares `embed`.
        self.src_embed = (
            None
            if cfg.src_vocab_size is None
            else nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        )
        if cfg.positions == "table":  # stored with the weights: (max_positions, d_model)
            self.register_buffer("pe", torch.zeros(cfg.max_positions, cfg.d_model))
        else:
            self.register_buffer("pe", sinusoidal_table(cfg.max_positions, cfg.d_model), persistent=False)
        if cfg.logits_bias:  # (vocab_size,), added to the logits
            self.register_buffer("final_logits_bias", torch.zeros(cfg.vocab_size))
        self.emb_dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        # Pre-norm stacks end with a LayerNorm; post-norm layers already end normalised.
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.pre_norm else nn.Identity()
        self.generator = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for embed in (self.embed, self.src_embed):
            if embed is not None:
                nn.init.normal_(embed.weight, mean=0.0, std=self.cfg.d_model**-0.5)
                with torch.no_grad():
                    embed.weight[self.cfg.pad_id].zero_()

    def embed_tokens(self, ids: torch.Tensor, positions: torch.Tensor, source: bool = False) -> torch.Tensor:
        """ids, positions: (B, T) -> (B, T, d_model), embeddings scaled by √d_model (unless the
        config says not to) plus PE. `source`: the encoder's ids, in its own vocabulary if it has one."""
        embed = self.src_embed if source and self.src_embed is not None else self.embed
        x = embed(ids)
        if self.cfg.scale_embedding:
            x = x * math.sqrt(self.cfg.d_model)
        return self.emb_dropout(x + self.pe[positions])

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, vocab); the output projection shares the embedding matrix
        unless the config unties it, plus the stored logits bias where the model has one."""
        out = self.generator(h) if self.generator is not None else F.linear(h, self.embed.weight)
        if self.cfg.logits_bias:
            out = out + self.final_logits_bias
        return out

    # -- encoder -------------------------------------------------------------

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """src_ids, src_mask: (B, S) -> memory (B, S, d_model)."""
        B, S = src_ids.shape
        positions = torch.arange(S, device=src_ids.device)[None, :].expand(B, S)
        x = self.embed_tokens(src_ids, positions, source=True)  # (B, S, d_model)
        src_bias = padding_bias(src_mask)  # (B, 1, 1, S)
        for layer in self.encoder_layers:
            x = layer(x, src_bias)
        return self.encoder_norm(x)

    def cross_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each decoder layer's cross-attention keys/values, computed once: (B, H, S, d_k) each."""
        return [cast(DecoderLayer, layer).cross_attn.project_kv(memory) for layer in self.decoder_layers]

    # -- decoder (teacher forcing: all target positions at once) --------------

    def decode(self, tgt_ids, memory, src_mask, need_weights: bool = False):
        """tgt_ids: (B, T) starting with the decoder start token (cfg.start_id); memory: (B, S, d_model) -> logits (B, T, vocab)
        and, when asked, the last layer's cross-attention weights (B, T, S)."""
        B, T = tgt_ids.shape
        positions = torch.arange(T, device=tgt_ids.device)[None, :].expand(B, T)
        x = self.embed_tokens(tgt_ids, positions)  # (B, T, d_model)
        self_bias = causal_bias(T, tgt_ids.device)  # (1, 1, T, T)
        src_bias = padding_bias(src_mask)
        weights = None
        for layer, (k, v) in zip(self.decoder_layers, self.cross_kv(memory)):
            x, _, weights = layer(x, self_bias, k, v, src_bias, need_weights=need_weights)
        return self.logits(self.decoder_norm(x)), weights

    def forward(self, src_ids, src_mask, tgt_ids):
        return self.decode(tgt_ids, self.encode(src_ids, src_mask), src_mask)[0]

    # -- decoder, one step with a key/value cache ----------------------------

    def decode_step(self, tokens, positions, past_kv, past_mask, cross_kv, src_mask, need_weights=False):
        """One incremental decoder step, the computation the ONNX decoder graph exports.

        tokens:    (B, 1) the newest token of each row
        positions: (B,)   that token's position in its row (rows may be at different steps)
        past_kv:   per layer (k, v), each (B, H, P, d_k): self-attention keys/values so far
        past_mask: (B, P) 1 where the row's past entry is valid, 0 where it is padding
        cross_kv:  per layer (k, v), each (n, H, S, d_k), from `cross_kv(memory)`: n sentences,
                   each owning B // n consecutive rows (its beams; n == B without beams)
        src_mask:  (n, S)
        Returns log-probabilities (B, vocab), this step's (k, v) per layer, each (B, H, 1, d_k),
        and, when asked, the last layer's cross-attention weights (B, S).
        """
        h, new_kv, weights = self.decode_step_hidden(
            tokens, positions, past_kv, past_mask, cross_kv, src_mask, need_weights
        )
        log_probs = torch.log_softmax(self.logits(h).float(), dim=-1)  # (B, vocab)
        return log_probs, new_kv, weights

    def decode_step_hidden(self, tokens, positions, past_kv, past_mask, cross_kv, src_mask, need_weights=False):
        """`decode_step` up to the output projection: the final decoder state (B, d_model), this
        step's (k, v) per layer and the cross-attention weights (or None)."""
        x = self.embed_tokens(tokens, positions[:, None])  # (B, 1, d_model)
        B = tokens.shape[0]
        ones = torch.ones(B, 1, dtype=torch.float32, device=tokens.device)
        self_bias = padding_bias(torch.cat([past_mask.to(torch.float32), ones], dim=1))  # (B,1,1,P+1)
        src_bias = padding_bias(src_mask)
        new_kv, weights = [], None
        for layer, past, (ck, cv) in zip(self.decoder_layers, past_kv, cross_kv):
            x, kv, weights = layer(x, self_bias, ck, cv, src_bias, past_kv=past, need_weights=need_weights)
            new_kv.append(kv)
        h = self.decoder_norm(x)[:, 0]  # (B, d_model)
        return h, new_kv, (weights[:, 0] if weights is not None else None)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
