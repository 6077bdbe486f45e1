"""The paper's encoder-decoder (Vaswani et al. 2017; notes §1.1, §3.3, §4.1, §4.4, §6.1-§6.2, §7.1),
built from transformer.py's modules. Beyond HW3, which stops at the decoder-only DecoderLM.

- EncoderLayer ..... §6.1: a TransformerLayer that sees the whole source (Post-LN and ReLU by
                     default, as the paper)
- DecoderLayer ..... §3.3, §6.1: causal self-attention, cross-attention to the encoder output, FFN
- EncoderDecoder ... §1.1, §4.1, §4.4, §6.1-§6.2, §7.1: one shared embedding table, sinusoidal
                     positions, teacher forcing; generate() translates (decoding.py's loop)

Like transformer.py, nothing here writes a backward: tensor.py's autodiff differentiates it all.
"""
from __future__ import annotations

import math

import numpy as np

from lecture05.tensor import Tensor, check_token_ids
from lecture06 import decoding
from lecture06.transformer import (Dropout, Embedding, FeedForward, LayerNorm, Module,
                                   MultiHeadAttention, TransformerLayer, check_positions,
                                   sinusoidal_positions)


class EncoderLayer(TransformerLayer):
    """Encoder layer of the paper (notes §6.1): self-attention that sees the whole source (not
    causal, padded keys hidden), then the FFN. Post-LN by default as in the paper, Pre-LN with
    pre_ln=True; ReLU by default as in the paper. A TransformerLayer with those defaults: same
    names, same forward.
    """

    def __init__(self, n_embd: int, n_head: int, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, pre_ln: bool = False, middle_dim: int | None = None,
                 activation: str = "relu"):
        super().__init__(n_embd, n_head, p_dropout=p_dropout, ln_eps=ln_eps, bias=bias,
                         causal=False, pre_ln=pre_ln, middle_dim=middle_dim,
                         activation=activation)


class DecoderLayer(Module):
    """Decoder layer of the paper (notes §3.3, §6.1): causal self-attention, cross-attention
    whose keys and values come from the encoder output (padded source positions hidden), then the
    FFN.

    Post-LN (default, the paper):  y = ln_1(y + attention(y))
                                   y = ln_2(y + cross_attention(y, memory))
                                   y = ln_3(y + ff(y))
    Pre-LN (pre_ln=True):          y = y + attention(ln_1(y))
                                   y = y + cross_attention(ln_2(y), memory)
                                   y = y + ff(ln_3(y))
    """

    def __init__(self, n_embd: int, n_head: int, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, pre_ln: bool = False, middle_dim: int | None = None,
                 activation: str = "relu"):
        self.pre_ln = pre_ln
        self.ln_1 = LayerNorm(n_embd, eps=ln_eps)
        self.ln_2 = LayerNorm(n_embd, eps=ln_eps)
        self.ln_3 = LayerNorm(n_embd, eps=ln_eps)
        self.attention = MultiHeadAttention(n_embd, n_head, causal=True, p_dropout=p_dropout,
                                            bias=bias)
        self.cross_attention = MultiHeadAttention(n_embd, n_head, causal=False,
                                                  p_dropout=p_dropout, bias=bias)
        self.ff = FeedForward(n_embd, middle_dim=middle_dim, p_dropout=p_dropout, bias=bias,
                              activation=activation)

    def forward(self, y: Tensor, memory: Tensor, src_pad_mask=None, tgt_pad_mask=None,
                cache=None) -> Tensor:
        """
        Args:
            y: (B, T, D) decoder stream; memory: (B, S, D) encoder output
            src_pad_mask: (B, S), True at padded source positions
            tgt_pad_mask: (B, T), True at pads
            cache: decoding only, a (self-attention KVCache, cross-attention KVCache) pair
        Returns:
            (B, T, D)
        """
        self_cache, cross_cache = (None, None) if cache is None else cache
        if self.pre_ln:
            y = y + self.attention(self.ln_1(y), pad_mask=tgt_pad_mask, cache=self_cache)
            y = y + self.cross_attention(self.ln_2(y), kv=memory, pad_mask=src_pad_mask,
                                         cache=cross_cache)
            return y + self.ff(self.ln_3(y))
        y = self.ln_1(y + self.attention(y, pad_mask=tgt_pad_mask, cache=self_cache))
        y = self.ln_2(y + self.cross_attention(y, kv=memory, pad_mask=src_pad_mask,
                                               cache=cross_cache))
        return self.ln_3(y + self.ff(y))


class EncoderDecoder(Module):
    """The paper's encoder-decoder (notes §1.1, §6.1-§6.2; Vaswani et al. 2017):

        source -> token_embeddings · √d + sinusoidal positions -> encoder_dropout
               -> n_layers EncoderLayers (-> encoder_ln, Pre-LN only) = memory
        target shifted right -> token_embeddings · √d + positions -> decoder_dropout
               -> n_layers DecoderLayers (cross-attending to memory) (-> decoder_ln, Pre-LN only)
               -> logits = y @ token_embeddingsᵀ

    One table serves as source embedding, target embedding and output projection (§4.1); it starts
    N(0, 1/d), so that after the ·√d of §4.4 a token vector has entries of variance 1, the scale of
    the position encoding. Post-LN (the paper) ends every layer in a LayerNorm, so it needs no final
    one; Pre-LN (pre_ln=True) leaves the residual stream unnormalised and adds encoder_ln and
    decoder_ln.

    n_positions: the longest source or target the model accepts (the sinusoidal table is computed
    once for that many positions). bos_id: the token the decoder input starts with (teacher forcing
    shifts the target right by one, putting bos_id in front). Pad masks: bool, True at padded
    positions.
    """

    def __init__(self, n_vocab: int, n_embd: int, n_head: int, n_layers: int = 6,
                 n_positions: int = 1024, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, pre_ln: bool = False, middle_dim: int | None = None,
                 activation: str = "relu", bos_id: int = 1):
        if not 0 <= bos_id < n_vocab:
            raise ValueError(f"EncoderDecoder: bos_id={bos_id} is not a token id "
                             f"(0..{n_vocab - 1})")
        self.n_vocab, self.n_embd, self.n_positions = n_vocab, n_embd, n_positions
        self.bos_id, self.pre_ln = bos_id, pre_ln
        # a constant, not a parameter
        self.position_encoding = sinusoidal_positions(n_positions, n_embd)
        self.token_embeddings = Embedding(n_vocab, n_embd, std=n_embd ** -0.5)
        self.encoder_dropout = Dropout(p_dropout)   # two modules, so each keeps its own last mask
        self.decoder_dropout = Dropout(p_dropout)
        layer_options = dict(p_dropout=p_dropout, ln_eps=ln_eps, bias=bias, pre_ln=pre_ln,
                             middle_dim=middle_dim, activation=activation)
        self.encoder_layers = [EncoderLayer(n_embd, n_head, **layer_options)
                               for _ in range(n_layers)]
        self.encoder_ln = LayerNorm(n_embd, eps=ln_eps) if pre_ln else None
        self.decoder_layers = [DecoderLayer(n_embd, n_head, **layer_options)
                               for _ in range(n_layers)]
        self.decoder_ln = LayerNorm(n_embd, eps=ln_eps) if pre_ln else None

    def check_ids(self, ids, what: str, start: int = 0) -> np.ndarray:
        """(B, S) source or target ids at positions start.. as an array, S >= 1 and within
        n_positions."""
        ids = check_token_ids("EncoderDecoder", ids, f"{what} token ids")
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"EncoderDecoder: expected {what} token ids of shape (B, S) with "
                             f"S >= 1, got {ids.shape}")
        length = start + ids.shape[1]
        self.check_length("EncoderDecoder", length, f"{what} length {length}",
                          f"shorten the {what}")
        return ids

    def check_length(self, owner: str, length: int, asked: str, fix: str):
        """check_positions for this model, whose callers (check_ids, new_cache,
        decoding.translate) each say what they asked for."""
        check_positions(owner, length, self.n_positions, asked, fix,
                        table="the precomputed sinusoidal table")

    @staticmethod
    def check_pad_mask(pad_mask, ids: np.ndarray, name: str, what: str):
        """A pad mask of the ids' shape, as bool (True at padded positions), or None."""
        if pad_mask is None:
            return None
        pad_mask = np.asarray(pad_mask)
        if pad_mask.shape != ids.shape:
            raise ValueError(f"EncoderDecoder: {name} must have the shape of the {what} ids "
                             f"{ids.shape} (True at padded positions), got {pad_mask.shape}")
        return pad_mask.astype(bool)

    def embed(self, ids, start: int = 0) -> Tensor:
        """(B, S) ids at positions start.. -> (B, S, D) token_embeddings · √d + sinusoidal
        positions."""
        x = self.token_embeddings(ids) * math.sqrt(self.n_embd)
        return x + self.position_encoding[start:start + ids.shape[1]][None]   # (S, D) -> (1, S, D)

    def shift_right(self, tgt, tgt_pad_mask=None):
        """Teacher forcing's decoder input (notes §7.1): [bos, y_0, ..., y_{T-2}], and its pad
        mask."""
        tgt = np.asarray(tgt)
        bos = np.full((tgt.shape[0], 1), self.bos_id, dtype=tgt.dtype)
        tgt_in = np.concatenate([bos, tgt[:, :-1]], axis=1)                # (B, T) -> (B, T)
        if tgt_pad_mask is None:
            return tgt_in, None
        real = np.zeros((tgt.shape[0], 1), dtype=bool)
        return tgt_in, np.concatenate([real, tgt_pad_mask[:, :-1]], axis=1)  # (B, T) -> (B, T)

    def encode(self, src, src_pad_mask=None) -> Tensor:
        """
        Args:
            src: (B, S) source ids; src_pad_mask: (B, S), True at padded positions
        Returns:
            memory: (B, S, D) the encoder output that every decoder layer cross-attends to
        """
        src = self.check_ids(src, "source")
        src_pad_mask = self.check_pad_mask(src_pad_mask, src, "src_pad_mask", "source")
        x = self.encoder_dropout(self.embed(src))
        for layer in self.encoder_layers:
            x = layer(x, pad_mask=src_pad_mask)
        return self.encoder_ln(x) if self.encoder_ln is not None else x

    def decode(self, tgt_in, memory: Tensor, src_pad_mask=None, tgt_in_pad_mask=None,
               cache: list | None = None) -> Tensor:
        """
        Args:
            tgt_in: (B, T) decoder input ids (already shifted right); memory: (B, S, D)
            src_pad_mask: (B, S), True at padded source positions; tgt_in_pad_mask: (B, T)
            cache: decoding only, from new_cache; tgt_in then holds just the positions not yet
                cached
        Returns:
            logits: (B, T, n_vocab); position t predicts the token after tgt_in[:, :t + 1]
        """
        if cache is not None and len(cache) != len(self.decoder_layers):
            raise ValueError(f"EncoderDecoder: cache has {len(cache)} entries for "
                             f"{len(self.decoder_layers)} decoder layers; make it with new_cache")
        start = 0 if cache is None else cache[0][0].length
        tgt_in = self.check_ids(tgt_in, "target", start)
        y = self.decoder_dropout(self.embed(tgt_in, start))
        for i, layer in enumerate(self.decoder_layers):
            y = layer(y, memory, src_pad_mask=src_pad_mask, tgt_pad_mask=tgt_in_pad_mask,
                      cache=None if cache is None else cache[i])
        if self.decoder_ln is not None:
            y = self.decoder_ln(y)
        return y @ self.token_embeddings.weights.permute(1, 0)     # (B, T, D) @ (D, V) -> (B, T, V)

    def forward(self, src, tgt, src_pad_mask=None, tgt_pad_mask=None) -> Tensor:
        """Teacher forcing (notes §7.1): every target position in one pass, the target shifted
        right.

        Args:
            src: (B, S) source ids; tgt: (B, T) target ids
            src_pad_mask: (B, S), tgt_pad_mask: (B, T); True at padded positions
        Returns:
            logits: (B, T, n_vocab); logits[:, t] is the distribution of tgt[:, t] given
                tgt[:, :t] and src
        """
        src, tgt = self.check_ids(src, "source"), self.check_ids(tgt, "target")
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(f"EncoderDecoder: source and target batch sizes differ "
                             f"({src.shape[0]} vs {tgt.shape[0]}); pass one target row per source "
                             f"row")
        src_pad_mask = self.check_pad_mask(src_pad_mask, src, "src_pad_mask", "source")
        tgt_pad_mask = self.check_pad_mask(tgt_pad_mask, tgt, "tgt_pad_mask", "target")
        tgt_in, tgt_in_pad_mask = self.shift_right(tgt, tgt_pad_mask)
        return self.decode(tgt_in, self.encode(src, src_pad_mask), src_pad_mask, tgt_in_pad_mask)

    def new_cache(self, capacity: int) -> list:
        """Per decoder layer a (self-attention KVCache(capacity), cross-attention KVCache())
        pair."""
        self.check_length("EncoderDecoder", capacity, f"a KV cache of {capacity} positions",
                          f"ask for at most {self.n_positions}")
        return [(decoding.KVCache(capacity), decoding.KVCache()) for _ in self.decoder_layers]

    def generate(self, src, src_pad_mask=None, max_new_tokens: int | None = None,
                 **options) -> decoding.Generation:
        """Translate: encode the source once, then decode from bos_id one token per step (notes
        §1.1). decoding.translate does it; it lists the options (sampling, the KV cache, the
        paper's beam search: num_beams=4, length_penalty=0.6) and what comes back.

        Args:
            src: (B, S) source ids; src_pad_mask: (B, S), True at padded positions
            max_new_tokens: None: each row's own source length + 50 (the paper's limit, notes §7.6),
                at most n_positions; an int >= 0: the same limit for every row
        """
        return decoding.translate(self, src, src_pad_mask, max_new_tokens, **options)
