"""Tests for code/lecture06/city_generation.py: decoding a city-language model by every rule and
scoring the texts against the language. An untrained 1-layer model: what is tested is the
bookkeeping, not the quality (05's tests assert that on trained models)."""
import numpy as np
import pytest

from lecture06 import city_generation, city_lab, transformer
from lecture05.tensor import no_grad


@pytest.fixture(scope="module")
def model():
    transformer.set_seed(0)
    return transformer.DecoderLM(city_lab.V, 16, 2, n_positions=city_lab.SEQ_LEN, n_layers=1,
                                 p_dropout=0.0).eval()


def test_every_rule_continues_every_window_and_is_scored_against_the_language(model):
    texts, scores = city_generation.scored_decodings(model, seed=0, n_windows=8)
    windows = city_generation.windows_of_the_test_set(8)
    prompt_len = city_generation.PROMPT_LEN
    assert list(texts) == list(city_generation.DECODINGS)
    assert set(scores) == {"language", *city_generation.DECODINGS}
    for name, text in texts.items():
        assert text.shape == windows.shape == (8, city_lab.SEQ_LEN)
        np.testing.assert_array_equal(text[:, :prompt_len], windows[:, :prompt_len])
        expected = city_lab.score_against_the_language(text, prompt_len)
        assert {k: scores[name][k] for k in expected} == expected
        assert scores[name]["model_log_p_per_token"] < 0
    # the language's own continuations: every token allowed, scored by the model too
    assert scores["language"]["allowed"] == 1.0 and scores["language"]["distinct"] == 8
    assert scores["language"]["model_log_p_per_token"] == city_generation.model_log_p_per_token(
        model, windows, prompt_len)


def test_a_rule_decodes_alike_whichever_rules_it_is_decoded_beside(model):
    every_rule, _ = city_generation.scored_decodings(model, seed=3, n_windows=8)
    two, _ = city_generation.scored_decodings(model, seed=3, n_windows=8,
                                              rules=["beam 2", "top-p 0.9"])
    assert list(two) == ["beam 2", "top-p 0.9"]
    for name, text in two.items():
        np.testing.assert_array_equal(text, every_rule[name])


def test_the_models_log_p_per_token_is_read_from_one_teacher_forced_pass(model):
    windows = city_generation.windows_of_the_test_set(2)
    with no_grad():
        logits = model(windows[:, :-1]).data                            # (2, 31, V)
    log_p = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    expected = np.mean([log_p[b, t - 1, windows[b, t]] for b in range(2) for t in range(6, 32)])
    assert city_generation.model_log_p_per_token(model, windows, 6) == pytest.approx(expected,
                                                                                     rel=1e-12)
