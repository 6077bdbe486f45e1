"""What a city-language model writes, by each decoding rule, scored against the language (script 05
part 6, notes §7.1 and exercise 11).

A model trained on the city language (city_train.py) continues the first sentence of test stories
(<bos> NAME lives in CITY .) greedily, by beam search and by sampling; city_lab replays each text
through the grammar and scores it by its true probabilities, and the model scores it by its own.

    texts, scores = scored_decodings(model, seed=0, n_windows=64)    # model: transformer.DecoderLM
    scores["greedy"]["allowed"], scores["sampled"]["log_p_per_token"], scores["language"]
"""
from __future__ import annotations

import numpy as np

from lecture06 import city_lab, transformer
from lecture05.tensor import no_grad

# the decoding rules: generate()'s arguments; the sampled ones seeded by the model's seed. Beam
# search's α only matters where hypotheses differ in length: here every one has n_new tokens (no
# end token), so beam 4 at the paper's α = 0.6 ranks as it would at α = 0.
DECODINGS = {"greedy": dict(),
             "beam 2": dict(num_beams=2),
             "beam 4, α = 0.6": dict(num_beams=4, length_penalty=0.6),
             "beam 8": dict(num_beams=8),
             "sampled": dict(sample=True, temperature=1.0),
             "T = 0.7": dict(sample=True, temperature=0.7),
             "top-k 10": dict(sample=True, top_k=10),
             "top-p 0.9": dict(sample=True, top_p=0.9)}
BEAMS = [name for name, rule in DECODINGS.items() if rule.get("num_beams", 1) > 1]
PROMPT_LEN = 6   # <bos> NAME lives in CITY .


def windows_of_the_test_set(n_windows: int) -> np.ndarray:
    """The first n_windows test windows from <bos>, SEQ_LEN tokens each: (N, 32)."""
    test = city_lab.test_set()
    return np.concatenate([test.x, test.y[:, -1:]], axis=1)[:n_windows, :city_lab.SEQ_LEN]


def model_log_p_per_token(model: transformer.DecoderLM, windows: np.ndarray,
                          prompt_len: int) -> float:
    """The model's own mean log p per token of the windows' tokens after the prompt, one
    teacher-forced pass (what beam search maximises, beside the language's true log p)."""
    with no_grad():
        logits = model(windows[:, :-1])
        log_p = (logits - transformer.logsumexp(logits)).data     # (N, S - 1, V)
    chosen = np.take_along_axis(log_p, windows[:, 1:, None], axis=-1)[..., 0]
    return float(chosen[:, prompt_len - 1:].mean())


def decode_by_rules(model: transformer.DecoderLM, prompts: np.ndarray, n_new: int, seed: int,
                    rules) -> dict:
    """{rule: (tokens (N, n_new), the model's log p of each row)}: the prompts continued by each
    named rule of DECODINGS, sampling with an rng seeded by `seed`. Greedy decoding and beam search
    give a prompt one answer, whatever the rest of the batch (tests/test_beam_search.py): each
    distinct prompt is decoded once, then copied to its windows."""
    distinct, copies = np.unique(prompts, axis=0, return_inverse=True)
    decoded = {}
    for name in rules:
        rule = DECODINGS[name]
        if rule.get("sample"):
            generation = model.generate(prompts, n_new, rng=np.random.default_rng(seed), **rule)
            decoded[name] = generation.tokens, generation.scores
        else:
            generation = model.generate(distinct, n_new, **rule)
            decoded[name] = (generation.tokens[copies.ravel()],
                             generation.scores[copies.ravel()])
    return decoded


def scored_decodings(model: transformer.DecoderLM, seed: int, n_windows: int = 64,
                     prompt_len: int = PROMPT_LEN, rules=None) -> tuple[dict, dict]:
    """Continue the first sentence of n_windows test stories to SEQ_LEN tokens by every rule of
    DECODINGS (None) or those named in `rules` -> ({rule: texts (N, SEQ_LEN) from <bos>}, {rule or
    "language": city_lab.score_against_the_language's scores, with the model's own log p per token
    and the number of distinct continuations}); "language" scores the test windows' own
    continuations, the reference."""
    windows = windows_of_the_test_set(n_windows)
    prompts, n_new = windows[:, :prompt_len], city_lab.SEQ_LEN - prompt_len
    texts, scores = {}, {}
    for name, (tokens, log_p) in decode_by_rules(model, prompts, n_new, seed,
                                                 list(DECODINGS) if rules is None
                                                 else rules).items():
        texts[name] = np.concatenate([prompts, tokens], axis=1)
        scores[name] = dict(city_lab.score_against_the_language(texts[name], prompt_len),
                            model_log_p_per_token=float(log_p.mean() / n_new),
                            distinct=len({tuple(row) for row in tokens}))
    scores["language"] = dict(city_lab.score_against_the_language(windows, prompt_len),
                              model_log_p_per_token=model_log_p_per_token(model, windows,
                                                                          prompt_len),
                              distinct=len({tuple(row) for row in windows[:, prompt_len:]}))
    return texts, scores
