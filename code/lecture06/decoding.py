"""Decoding (notes §2.3, §7.6, exercise 11): the KV cache, the decoding loop, sampling and beam
search. Beyond HW3; transformer.py's DecoderLM.generate and encoder_decoder.py's
EncoderDecoder.generate delegate here (HuggingFace's convention: the method on the model, the loop
beside it).

- KVCache ................ the keys and values an attention sub-layer keeps between steps; attend()
                            is the attention-with-cache step MultiHeadAttention.forward calls
- Generation, Hypothesis . what generate returns; one finished text of a beam search
- generate, translate .... the loop for a decoder-only LM (continue a prompt) and for the paper's
                            encoder-decoder (encode once, decode from bos)
- _decode ................ greedy and sampling: temperature, top-k and top-p (nucleus) filters
- _beam_search ........... the paper's beam search with Wu et al.'s length_penalty; with an
                            end token, finish= picks ours or HuggingFace's rule

A model is anything whose forward takes `cache=` (a DecoderLM's `model(ids, cache=...)`, an
EncoderDecoder's `decode(..., cache=...)`) and that makes its caches with new_cache; the cache calls
the attention module's own projection and attention methods. So this file imports no model: only
lecture 5's tensor.py (and numpy).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from lecture05.tensor import MASK_VALUE, Tensor, check_token_ids, no_grad


class KVCache:
    """The keys and values one attention sub-layer keeps between decoding steps, so that a new token
    costs one position's projections and FFN instead of a rerun over the whole prefix (exercise 11).

    capacity=L (causal self-attention): keys (B, h, Dh, L) and values (B, h, L, Dh) at their final
    size. A step writes its n new positions as kT + kT_new @ P, with P the (n, L) 0/1 placement
    matrix: tensor.py has no slicing or concatenation, and 0/1 weights copy exactly. Slots not yet
    written are masked like the future (MASK_VALUE), so they get weight exactly 0.
    capacity=None (cross-attention): the keys and values of the encoder output, projected on the
    first step and only read afterwards.
    """

    def __init__(self, capacity: int | None = None):
        if capacity is not None and capacity < 1:
            raise ValueError(f"KVCache: capacity must be >= 1 position, got {capacity}")
        self.capacity = capacity
        self.kT = self.v = None
        self.length = 0                      # positions written so far (self-attention)

    def check_batch_size(self, batch_size: int):
        """A cache holds the rows of one batch. Another batch's keys would meet them in a
        broadcast, which fails (or, from one row, succeeds) without saying why."""
        if self.kT is not None and self.kT.shape[0] != batch_size:
            raise ValueError(f"KVCache: this cache holds a batch of {self.kT.shape[0]} rows, got "
                             f"one of {batch_size}; a cache serves one batch: make a new one "
                             f"for this batch with model.new_cache(capacity)")

    def write(self, kT_new: Tensor, v_new: Tensor):
        """Append n positions: kT_new (B, h, Dh, n), v_new (B, h, n, Dh)."""
        self.check_batch_size(kT_new.shape[0])
        n_new = kT_new.shape[-1]
        if self.length + n_new > self.capacity:
            raise ValueError(f"KVCache: cannot write {n_new} more position(s) after "
                             f"{self.length}: the cache holds {self.capacity}; make it with a "
                             f"larger capacity")
        place = np.zeros((n_new, self.capacity))
        place[np.arange(n_new), self.length + np.arange(n_new)] = 1.0
        kT_placed = kT_new @ Tensor(place)                 # (B, h, Dh, n) @ (n, L) -> (B, h, Dh, L)
        v_placed = Tensor(place.T) @ v_new                 # (L, n) @ (B, h, n, Dh) -> (B, h, L, Dh)
        self.kT = kT_placed if self.kT is None else self.kT + kT_placed
        self.v = v_placed if self.v is None else self.v + v_placed
        self.length += n_new

    def causal_mask(self, n_new: int) -> Tensor:
        """(1, 1, n, L) for the n positions just written: each sees the cache up to itself."""
        first = self.length - n_new
        return Tensor(MASK_VALUE * np.triu(np.ones((1, 1, n_new, self.capacity)), k=first + 1))

    def reorder(self, rows: np.ndarray):
        """Beam search: row i of the cache becomes what row rows[i] held (its parent beam), so that
        each hypothesis keeps attending to its own prefix. A copy of rows, as the search's other
        bookkeeping: it computes nothing."""
        if self.kT is not None:
            self.kT, self.v = Tensor(self.kT.numpy()[rows]), Tensor(self.v.numpy()[rows])

    def attend(self, attention, x: Tensor, kv: Tensor | None = None, pad_mask=None) -> Tensor:
        """One decoding step of `attention`, a transformer.MultiHeadAttention (called through its
        own methods: whatever has them will do), over the cached keys and values.

        Args:
            x: (B, n, D) the new positions; kv: (B, S_k, D) the encoder output, on a
                cross-attention cache's first step; pad_mask: (B, S_k), True at padded keys
        Returns:
            (B, n, D): heads concatenated, before out_projection
        """
        if self.capacity is None:      # cross-attention: project the encoder output once
            self.check_batch_size(x.shape[0])
            if self.kT is None:
                if kv is None:
                    raise ValueError("MultiHeadAttention: a cross-attention cache needs kv= (the "
                                     "encoder output) on its first step")
                q, self.kT, self.v = attention.project_to_query_key_value(x, kv)
            else:
                q = attention.split_heads(attention.q_projection(x))   # (B, n, D) -> (B, h, n, Dh)
            mask = (None if pad_mask is None
                    else attention.create_pad_mask(pad_mask, x.shape[0], self.kT.shape[-1]))
            return attention.self_attention(q, self.kT, self.v, mask)
        if not attention.causal or kv is not None or pad_mask is not None:
            raise ValueError("MultiHeadAttention: a KV cache with a capacity serves causal "
                             "self-attention without padding; for cross-attention use KVCache() "
                             "(capacity None)")
        q, kT_new, v_new = attention.project_to_query_key_value(x)
        self.write(kT_new, v_new)
        return attention.self_attention(q, self.kT, self.v, self.causal_mask(x.shape[1]))


@dataclass
class Hypothesis:
    """One finished text of a beam search."""
    tokens: np.ndarray          # (|Y|,) its end token included
    score: float                # the sum of its log-probabilities under the model
    ranked: float               # score / lp(|Y|): what the search ranks finished text by
    logits: np.ndarray          # (|Y|, V) the logits each of its tokens was chosen from

    def __repr__(self) -> str:
        """Its text and scores; not its logits, which would fill the screen."""
        return (f"Hypothesis(tokens={self.tokens.tolist()}, score={self.score:.4f}, "
                f"ranked={self.ranked:.4f}, length={len(self.tokens)})")


@dataclass
class Generation:
    """What generate returns."""
    tokens: np.ndarray          # (B, T) chosen tokens; pad_id after a row has finished
    lengths: np.ndarray         # (B,) tokens each row generated, its end token included
    logits: np.ndarray          # (B, T, V) the logits each token was chosen from (before
                                # temperature)
    n_forward: int              # forward passes of the decoder, one per step
    positions_computed: int     # positions run through the decoder per row (all its beams),
                                # summed over the steps: with the cache beams · (prompt + T - 1),
                                # without it a whole prefix per beam and step
    scores: np.ndarray          # (B,) each row's sum of log-probabilities (softmax of the logits,
                                # whatever temperature or filter chose the tokens)
    finished: list | None = None    # num_beams > 1: per row its finished Hypothesis list, best
                                    # first (at most num_beams)


# ---- the loops of the two models: a prompt continued, a source translated ------------------------
def generate(model, prompt, max_new_tokens: int, *, sample: bool = False,
             temperature: float = 1.0, rng=None, end_id: int | None = None, pad_id: int = 0,
             use_cache: bool = True, num_beams: int = 1, length_penalty: float = 0.0,
             finish: str = "every", top_k: int | None = None, top_p: float = 1.0) -> Generation:
    """Continue every prompt row of a DecoderLM by up to max_new_tokens tokens, one per step
    (exercise 11). What DecoderLM.generate does.

    Args:
        prompt: (B, P) token ids, P >= 1 (rows of equal length: no padding)
        max_new_tokens: >= 0; with learned positions P + max_new_tokens must fit in n_positions
        sample: False: greedy (the argmax); True: draw from softmax(logits / temperature) with
            rng, a np.random.Generator (or an int seed), so a seed fixes every draw
        top_k, top_p: sampling only: draw from the top_k largest logits, then from the
            smallest set of those whose probability reaches top_p (nucleus sampling). Ties go to
            the lower token id, as greedy's argmax: top_k keeps exactly top_k tokens even when
            logits tie at the k-th place (HuggingFace keeps every tied token), and top_p ranks
            equal probabilities by id
        num_beams: 1 greedy; k > 1 beam search with k hypotheses per row (see _beam_search)
        length_penalty: beam search's α: finished text ranked by its sum of log-probabilities
            / ((5 + |Y|)/6)^α; 0 (the default) by the sum alone, 0.6 the paper's
        finish: beam search with end_id: "every" (ours) pools the end extension of every live
            hypothesis; "in_beam" (HuggingFace's and fairseq's rule) only an end extension that
            ranks among the step's num_beams best extensions (see _beam_search)
        end_id: a row stops after this token; later steps give it pad_id (both token ids)
        use_cache: False reruns the whole prefix every step (the baseline the cache is timed
            against)
    Returns:
        Generation: tokens (B, T), lengths (B,), logits (B, T, n_vocab), n_forward,
        positions_computed, scores (B,); num_beams > 1: finished
    """
    prompt = _check_prompt(prompt)
    rng = _check_decoding("DecoderLM.generate", max_new_tokens, sample, temperature, rng,
                          num_beams, length_penalty, finish, top_k, top_p)
    _check_end_and_pad_ids("DecoderLM.generate", model.n_vocab, end_id, pad_id)
    total = _check_model_fits(model, prompt.shape[1], max_new_tokens)
    # the last token is only returned, never fed back: the cache needs total - 1 positions
    cache = (model.new_cache(total - 1) if use_cache and max_new_tokens > 0 and model.layers
             else None)
    beams = np.repeat(prompt, num_beams, axis=0)      # (B, P) -> (B·k, P): k rows per prompt

    def step(generated):
        ids = _unseen_ids(beams, generated, cache)
        return _last_position(model(ids, cache=cache)), ids.shape[1]

    with _decoding(model):
        return _decode(step, np.full(prompt.shape[0], max_new_tokens), model.n_vocab, sample,
                       temperature, rng, end_id, pad_id, num_beams, length_penalty, finish,
                       top_k, top_p, reorder=None if cache is None else _reorder(cache))


def translate(model, src, src_pad_mask=None, max_new_tokens: int | None = None, *,
             sample: bool = False, temperature: float = 1.0, rng=None,
             end_id: int | None = None, pad_id: int = 0, use_cache: bool = True,
             num_beams: int = 1, length_penalty: float = 0.0, finish: str = "every",
             top_k: int | None = None, top_p: float = 1.0) -> Generation:
    """Translate with an EncoderDecoder: encode the source once, then decode from bos_id one token
    per step (notes §1.1). What EncoderDecoder.generate does.

    Args:
        src: (B, S) source ids; src_pad_mask: (B, S), True at padded positions
        max_new_tokens: None: each row's own source length + 50 (the paper's limit, notes §7.6),
            at most n_positions; an int >= 0: the same limit for every row
        sample, temperature, rng, top_k, top_p, num_beams, length_penalty, finish, end_id,
            pad_id: as generate (the paper: num_beams=4, length_penalty=0.6)
        use_cache: False reruns the decoder over the whole prefix every step (the encoder runs
            once either way, on each source once, whatever num_beams; the cache also keeps the
            cross-attention keys/values of the memory)
    Returns:
        Generation: tokens (B, T) without the bos, lengths (B,), logits (B, T, n_vocab),
        n_forward, positions_computed, scores (B,); num_beams > 1: finished
    """
    src = model.check_ids(src, "source")
    src_pad_mask = model.check_pad_mask(src_pad_mask, src, "src_pad_mask", "source")
    rng = _check_decoding("EncoderDecoder.generate", max_new_tokens, sample, temperature, rng,
                          num_beams, length_penalty, finish, top_k, top_p)
    _check_end_and_pad_ids("EncoderDecoder.generate", model.n_vocab, end_id, pad_id)
    limits = _translation_limits(model, src, src_pad_mask, max_new_tokens)
    bos = np.full((src.shape[0] * num_beams, 1), model.bos_id)
    with _decoding(model):
        memory = model.encode(src, src_pad_mask)
        if num_beams > 1:
            # (B, S, D) -> (B·k, S, D): each source's memory once per beam, copied, not
            # recomputed
            beam_rows = np.repeat(np.arange(src.shape[0]), num_beams)
            memory = Tensor(memory.numpy()[beam_rows])
            src_pad_mask = None if src_pad_mask is None else src_pad_mask[beam_rows]
        cache = model.new_cache(int(limits.max())) if use_cache and limits.max() > 0 else None

        def step(generated):
            ids = _unseen_ids(bos, generated, cache)
            logits = model.decode(ids, memory, src_pad_mask, cache=cache)
            return _last_position(logits), ids.shape[1]

        return _decode(step, limits, model.n_vocab, sample, temperature, rng, end_id, pad_id,
                       num_beams, length_penalty, finish, top_k, top_p,
                       reorder=None if cache is None else _reorder(cache))


def _check_prompt(prompt) -> np.ndarray:
    """The prompt as a (B, P) array of token ids, P >= 1."""
    prompt = check_token_ids("DecoderLM.generate", prompt, "prompt token ids", "prompt")
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ValueError(f"DecoderLM.generate: expected a prompt of shape (B, P) with P >= 1, "
                         f"got {prompt.shape}")
    return prompt


def _check_model_fits(model, prompt_length: int, max_new_tokens: int) -> int:
    """The prompt and the new tokens, their total, if the model can generate them: causal, and
    with a learned table long enough."""
    if not all(layer.attention.causal for layer in model.layers):
        raise ValueError("DecoderLM.generate: the model is not causal (causal=False): each "
                         "position sees the future, so it cannot generate left to right")
    total = prompt_length + max_new_tokens
    model.check_length("DecoderLM.generate", total,
                       f"prompt length {prompt_length} + max_new_tokens {max_new_tokens} = {total}",
                       f"ask for at most {max(model.n_positions - prompt_length, 0)} new tokens")
    return total


def _translation_limits(model, src: np.ndarray, src_pad_mask, max_new_tokens) -> np.ndarray:
    """(B,) the tokens each source's translation may have: max_new_tokens, or with None its own
    length + 50 (the paper's limit), at most n_positions."""
    if max_new_tokens is None:
        src_lengths = src.shape[1] - (0 if src_pad_mask is None else src_pad_mask.sum(axis=1))
        return np.minimum(np.broadcast_to(src_lengths + 50, (src.shape[0],)), model.n_positions)
    model.check_length("EncoderDecoder.generate", max_new_tokens,
                       f"max_new_tokens={max_new_tokens}", f"ask for at most {model.n_positions}")
    return np.full(src.shape[0], max_new_tokens)


def _unseen_ids(first: np.ndarray, generated: np.ndarray, cache) -> np.ndarray:
    """What a decoding step feeds the decoder: without a cache the whole prefix (B·k, P + t),
    first (the prompt or bos) and what was generated; with one only what it has not seen."""
    if cache is None:
        return np.concatenate([first, generated], axis=1)
    return first if generated.shape[1] == 0 else generated[:, -1:]


# ---- the shared loop: greedy, sampling, beam search ----------------------------------------------
def length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6)^α (Wu et al. 2016; the paper's beam search uses α = 0.6). Finished
    text is ranked by its sum of log-probabilities divided by lp, so that a longer text is not
    ranked lower only because it has more (negative) terms. lp(1) = 1, and α = 0 gives lp = 1."""
    return ((5.0 + np.asarray(length, dtype=float)) / 6.0) ** alpha


FINISH_RULES = ("every", "in_beam")     # beam search's rules for end extensions (_beam_search)


def _check_decoding(who: str, max_new_tokens, sample: bool, temperature: float, rng,
                    num_beams=1, length_penalty=0.0, finish="every", top_k=None, top_p=1.0):
    if max_new_tokens is not None and (not isinstance(max_new_tokens, (int, np.integer))
                                       or max_new_tokens < 0):
        raise ValueError(f"{who}: max_new_tokens must be an integer >= 0, got {max_new_tokens!r}; "
                         f"0 generates nothing")
    if (not isinstance(num_beams, (int, np.integer)) or isinstance(num_beams, bool)
            or num_beams < 1):
        raise ValueError(f"{who}: num_beams must be an integer >= 1 (the hypotheses kept per "
                         f"row), got {num_beams!r}; num_beams=1 decodes greedily")
    if num_beams > 1 and sample:
        raise ValueError(f"{who}: num_beams={num_beams} searches for the most likely text and does "
                         f"not sample; pass sample=False for beam search, or num_beams=1 to "
                         f"sample")
    if not length_penalty >= 0:
        raise ValueError(f"{who}: length_penalty must be >= 0 (α in lp(Y) = ((5 + |Y|)/6)^α), got "
                         f"{length_penalty!r}; 0 ranks by the sum of log-probabilities alone, 0.6 "
                         f"is the paper's")
    if finish not in FINISH_RULES:
        raise ValueError(f"{who}: finish must be 'every' (every end extension finishes) or "
                         f"'in_beam' (HuggingFace's rule: only one ranked among the num_beams "
                         f"best), got {finish!r}")
    if top_k is not None and (not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool)
                              or top_k < 1):
        raise ValueError(f"{who}: top_k must be an integer >= 1 (the largest logits kept), got "
                         f"{top_k!r}; top_k=None keeps every token")
    if not 0 < top_p <= 1:
        raise ValueError(f"{who}: top_p must be in (0, 1] (the probability the kept tokens reach), "
                         f"got {top_p!r}; top_p=1 keeps every token")
    if not sample and (top_k is not None or top_p < 1):
        raise ValueError(f"{who}: top_k= and top_p= filter what sampling draws from; pass "
                         f"sample=True with them (greedy decoding and beam search take the most "
                         f"likely tokens already)")
    if not sample:
        return rng
    if not temperature > 0:
        raise ValueError(f"{who}: temperature must be > 0 when sampling (the logits are divided "
                         f"by it), got {temperature}; for the most likely token use sample=False "
                         f"(greedy)")
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(rng)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"{who}: sampling needs rng=np.random.default_rng(seed) (or an int "
                         f"seed), so that a seed fixes every draw; got {rng!r}")
    return rng


def _check_end_and_pad_ids(who: str, n_vocab: int, end_id, pad_id):
    """end_id (or None) and pad_id are token ids of the model: a finished row is fed pad_id."""
    for name, value, hint in (
            ("end_id", end_id, "pass the end token's id, or None to stop only at the limit"),
            ("pad_id", pad_id, "pass any id the model knows: a finished row is fed it")):
        if value is None and name == "end_id":
            continue
        if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                or not 0 <= value < n_vocab):
            raise ValueError(f"{who}: {name} must be a token id of the model, an integer in "
                             f"0..{n_vocab - 1}, got {value!r}; {hint}")


@contextmanager
def _decoding(model):
    """Eval mode (no dropout) and no graph while decoding; the model's mode is restored
    afterwards."""
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            yield
    finally:
        model.train(was_training)


def _last_position(logits: Tensor) -> Tensor:
    """(B, S, V) -> (B, V), the last position. tensor.py has no indexing: a 0/1 row picks it,
    exactly."""
    batch_size, seq_len, n_vocab = logits.shape
    if seq_len > 1:
        pick = np.zeros((1, seq_len))
        pick[0, -1] = 1.0
        logits = Tensor(pick) @ logits               # (1, S) @ (B, S, V) -> (B, 1, V)
    return logits.view(batch_size, n_vocab)          # (B, 1, V) -> (B, V)


def _log_probabilities(logits: Tensor) -> np.ndarray:
    """(B, V) logits -> (B, V) log softmax, the max subtracted first (as softmax)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return (shifted - shifted.exp().sum(axis=-1, keepdims=True).log()).numpy()


def _kept_tokens(logits: np.ndarray, scaled: np.ndarray, top_k: int | None,
                 top_p: float) -> np.ndarray:
    """(B, V) True at the tokens sampling may draw: the top_k largest logits, then of those the
    smallest set, most likely first, whose probability under softmax(scaled) reaches top_p
    (nucleus sampling, Holtzman et al. 2019). Ranked by the logits themselves, ties by token id
    (a stable sort), so that top_k=1 keeps exactly greedy's argmax (ties: the first), top_k keeps
    exactly k tokens when logits tie at the k-th place (HuggingFace's top_k keeps every tied
    token), and top_p takes equally likely tokens in id order."""
    order = np.argsort(-logits, axis=-1, kind="stable")              # most likely first
    kept = np.ones(logits.shape, dtype=bool)
    if top_k is not None:
        kept[:, top_k:] = False
    if top_p < 1:
        ranked = np.take_along_axis(scaled, order, axis=-1)
        p = np.where(kept, np.exp(ranked - ranked.max(axis=-1, keepdims=True)), 0.0)
        p /= p.sum(axis=-1, keepdims=True)
        # the probability of the more likely tokens: a token is kept while that is below top_p
        before = np.concatenate([np.zeros((len(p), 1)), np.cumsum(p, axis=-1)[:, :-1]], axis=1)
        kept &= before < top_p
    keep = np.empty_like(kept)
    np.put_along_axis(keep, order, kept, axis=-1)
    return keep


def _choose_tokens(logits: Tensor, sample: bool, temperature: float, rng, top_k: int | None = None,
                   top_p: float = 1.0) -> np.ndarray:
    """(B, V) logits -> (B,) token ids. Sampling is the Gumbel-max trick: argmax(z/T + g) with
    g ~ Gumbel(0, 1) drawn from rng is an exact draw from softmax(z/T), one rng call per step;
    over the tokens top_k / top_p keep, an exact draw from softmax(z/T) renormalised over them."""
    if not sample:
        return np.argmax(logits.numpy(), axis=-1)    # reading the result to choose; no arithmetic
    scaled = logits * (1.0 / temperature)
    perturbed = (scaled + Tensor(rng.gumbel(size=logits.shape))).numpy()
    if top_k is not None or top_p < 1:
        keep = _kept_tokens(logits.numpy(), scaled.numpy(), top_k, top_p)
        perturbed = np.where(keep, perturbed, -np.inf)
    return np.argmax(perturbed, axis=-1)


def _decode(step, limits: np.ndarray, n_vocab: int, sample: bool, temperature: float, rng,
            end_id: int | None, pad_id: int, num_beams: int = 1, alpha: float = 0.0,
            finish: str = "every", top_k: int | None = None, top_p: float = 1.0,
            reorder=None) -> Generation:
    """The loop both generate methods share. step(generated (B·num_beams, t)) -> (next logits
    (B·num_beams, V), positions it ran per row). Row b stops after end_id or after limits[b]
    tokens; the batch stops when every row has. num_beams > 1: _beam_search, with reorder(rows)
    reordering the KV cache (None without one)."""
    if num_beams > 1:
        return _beam_search(step, limits, n_vocab, num_beams, alpha, end_id, pad_id, reorder,
                            finish)
    batch_size = len(limits)
    generated = np.zeros((batch_size, 0), dtype=np.int64)
    lengths = np.zeros(batch_size, dtype=np.int64)
    scores = np.zeros(batch_size)
    finished = limits <= 0
    steps_logits, n_forward, positions = [], 0, 0
    while not finished.all():
        logits, n_positions = step(generated)
        n_forward, positions = n_forward + 1, positions + n_positions
        chosen = np.where(finished, pad_id,
                          _choose_tokens(logits, sample, temperature, rng, top_k, top_p))
        log_p = np.take_along_axis(_log_probabilities(logits), chosen[:, None], axis=1)[:, 0]
        scores += np.where(finished, 0.0, log_p)
        lengths += ~finished
        finished = finished | (lengths >= limits) | (end_id is not None and chosen == end_id)
        generated = np.concatenate([generated, chosen[:, None]], axis=1)     # (B, t) -> (B, t + 1)
        steps_logits.append(logits.numpy())
    logits_all = (np.stack(steps_logits, axis=1) if steps_logits
                  else np.zeros((batch_size, 0, n_vocab)))
    return Generation(generated, lengths, logits_all, n_forward, positions, scores)


def _reorder(cache: list):
    """reorder(rows) for a model's cache: every KVCache in it (a DecoderLM's list, an
    EncoderDecoder's (self, cross) pairs) takes its rows from the parent beams."""
    caches = [c for entry in cache for c in (entry if isinstance(entry, tuple) else (entry,))]

    def reorder(rows: np.ndarray):
        for c in caches:
            c.reorder(rows)
    return reorder


def _keep_best(pool: list, hypothesis: Hypothesis, size: int):
    """Add a finished hypothesis to a row's pool, which keeps the `size` best by score / lp, best
    first (ties: the one finished first)."""
    pool.append(hypothesis)
    pool.sort(key=lambda h: -h.ranked)
    del pool[size:]


def _ending_beams(candidates: np.ndarray, sums: np.ndarray, end_id: int, k: int,
                 finish: str) -> np.ndarray:
    """The live beams of one row whose end extension finishes this step: every one, or with
    finish="in_beam" those whose end extension ranks among the k best of the row's k·V
    extensions, candidates (k, V) (ties: the lower parent · V + token)."""
    beams = np.flatnonzero(np.isfinite(sums))
    if finish == "in_beam":
        # (k, V) -> (k·V,): the k best as flat indices parent · V + token
        best = np.argsort(-candidates.reshape(-1), kind="stable")[:k]
        beams = beams[np.isin(beams * candidates.shape[1] + end_id, best)]
    return beams


def _beam_search(step, limits: np.ndarray, n_vocab: int, k: int, alpha: float,
                 end_id: int | None, pad_id: int, reorder, finish: str = "every") -> Generation:
    """Beam search with k hypotheses per row (Wu et al. 2016, the paper's decoding). Each step
    ranks the k·V extensions of a row's live hypotheses by their sum of log-probabilities: the k
    best that do not emit end_id stay live, and those that emit it finish. A row's search ends at
    its limit (its live hypotheses then finish too), or once k are finished and no live one can
    still beat the worst of them: log-probabilities only fall, so a live sum s can at best become
    s / lp(limit). The answer: the finished hypothesis with the best score / lp(|Y|).

    Which end extensions finish: finish="every" (ours) pools the end extension of every live
    hypothesis; finish="in_beam" (HuggingFace's generate(num_beams=...) and fairseq) only those
    that rank among the step's k best extensions, end or not. The live beams are the same under
    both rules, and "every" sees a superset of the finished texts, so its answer ranks at least as
    high (score / lp); where the two differ, a student comparing with HuggingFace sees other
    text. (HuggingFace also divides by |Y|^α, not Wu's lp, and stops by its own bound.)"""
    batch_size = len(limits)
    tokens = np.zeros((batch_size, k, 0), dtype=np.int64)            # (B, k, t) the live beams
    history = np.zeros((batch_size, k, 0, n_vocab))                  # (B, k, t, V) their logits
    # a row's k copies start as one prefix: only the first is live, or each text came k times
    sums = np.full((batch_size, k), -np.inf)
    sums[:, 0] = 0.0
    pools = [[] for _ in range(batch_size)]
    done = limits <= 0
    n_forward = positions = 0
    while not done.all():
        logits, n_positions = step(tokens.reshape(batch_size * k, -1))
        n_forward, positions = n_forward + 1, positions + k * n_positions
        z = logits.numpy().reshape(batch_size, k, n_vocab)
        candidates = sums[:, :, None] + _log_probabilities(logits).reshape(batch_size, k, n_vocab)
        parent, token, new_sums = _best_live_extensions(candidates, end_id)
        extended, extended_history = _extend(tokens, history, z, parent, token)
        for b in np.flatnonzero(~done):
            if end_id is not None:
                for j in _ending_beams(candidates[b], sums[b], end_id, k, finish):
                    ended = _finished(np.append(tokens[b, j], end_id), candidates[b, j, end_id],
                                      alpha, np.concatenate([history[b, j], z[b, j][None]]))
                    _keep_best(pools[b], ended, k)
            done[b] = _row_done(pools[b], extended[b], extended_history[b], new_sums[b], limits[b],
                                alpha)
        # a row that is done keeps its beams and is fed pad_id: its answer is in its pool
        parent = np.where(done[:, None], np.arange(k), parent)
        token = np.where(done[:, None], pad_id, token)
        tokens, history = _extend(tokens, history, z, parent, token)
        sums = np.where(done[:, None], sums, new_sums)
        if reorder is not None and not done.all():
            reorder((np.arange(batch_size)[:, None] * k + parent).reshape(-1))
    return _answers(pools, n_vocab, pad_id, n_forward, positions)


def _best_live_extensions(candidates: np.ndarray, end_id: int | None) -> tuple:
    """(B, k, V) the sums of each row's k·V extensions -> the k best that do not end, as (B, k)
    parent beams, tokens and sums (ties: the lower parent · V + token)."""
    batch_size, k, n_vocab = candidates.shape
    live = candidates.copy()
    if end_id is not None:
        live[:, :, end_id] = -np.inf
    # (B, k) the k best extensions that do not end, as flat indices parent · V + token
    best = np.argsort(-live.reshape(batch_size, -1), axis=1, kind="stable")[:, :k]
    parent, token = np.divmod(best, n_vocab)
    return parent, token, np.take_along_axis(live.reshape(batch_size, -1), best, axis=1)


def _extend(tokens: np.ndarray, history: np.ndarray, z: np.ndarray, parent: np.ndarray,
            token: np.ndarray) -> tuple:
    """Every row's k beams continued, beam j of row b from its parent beam parent[b, j] by
    token[b, j]: (B, k, t) tokens and their (B, k, t, V) logits -> (B, k, t + 1), (B, k, t + 1, V),
    the new token's logits z[b, parent] (z: (B, k, V), this step's)."""
    rows = np.arange(len(tokens))[:, None]                           # (B, 1)
    return (np.concatenate([tokens[rows, parent], token[:, :, None]], axis=2),
            np.concatenate([history[rows, parent], z[rows, parent][:, :, None]], axis=2))


def _finished(tokens: np.ndarray, score, alpha: float, logits: np.ndarray) -> Hypothesis:
    """A finished text, ranked by its score / lp(|Y|)."""
    return Hypothesis(tokens, float(score), float(score / length_penalty(len(tokens), alpha)),
                      logits)


def _row_done(pool: list, extended: np.ndarray, extended_history: np.ndarray,
              new_sums: np.ndarray, limit: int, alpha: float) -> bool:
    """Whether a row's search ends after this step, its k beams now extended (k, |Y|): at its
    limit, with its live hypotheses added to its pool; before, once the pool holds k and no live
    sum s can beat the worst of them (log-probabilities only fall: at best s / lp(limit))."""
    k, length = extended.shape
    if length >= limit:
        for j in np.flatnonzero(np.isfinite(new_sums)):
            _keep_best(pool, _finished(extended[j], new_sums[j], alpha, extended_history[j]), k)
        return True
    worst = pool[-1].ranked if len(pool) == k else -np.inf
    return new_sums.max() / length_penalty(limit, alpha) <= worst


def _answers(pools: list, n_vocab: int, pad_id: int, n_forward: int,
             positions: int) -> Generation:
    """The Generation of a beam search: each row's best finished hypothesis (none if its limit
    was 0), padded with pad_id to the longest; its pool as finished."""
    answers = [pool[0] if pool else Hypothesis(np.zeros(0, dtype=np.int64), 0.0, 0.0,
                                               np.zeros((0, n_vocab))) for pool in pools]
    lengths = np.array([len(h.tokens) for h in answers], dtype=np.int64)
    width = int(lengths.max(initial=0))
    chosen = np.full((len(pools), width), pad_id, dtype=np.int64)
    logits_all = np.zeros((len(pools), width, n_vocab))
    for b, h in enumerate(answers):
        chosen[b, :len(h.tokens)], logits_all[b, :len(h.tokens)] = h.tokens, h.logits
    return Generation(chosen, lengths, logits_all, n_forward, positions,
                      np.array([h.score for h in answers]), pools)
