"""Script 06: every claim of notes §8.1-8.3 and §5.1 it serves (and exercises 5, 6 and 10), and the
parameter and FLOP formulas against three counters at random small configurations: torch_ref on the
meta device (FlopCounterMode), and our own transformer.py (num_parameters, the autodiff graph)."""
import argparse
import inspect
import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

from lecture06 import common, costs, transformer
from conftest import load_script

s06 = load_script("06_costs")
s03 = load_script("03_hw3_modules")


# ---- part 1 · S8.1-a/b/d, S5.1-a, Ex5
@pytest.fixture(scope="module")
def params():
    return s06.parameters()


def test_gpt2_small_parameters_term_by_term(params):
    r = params
    small = r["models"]["GPT-2 small"]
    assert small["total"] == small["formula_total"] == 124_439_808
    for m in r["models"].values():
        assert m["formula"] == m["counted"]
    assert r["models"]["GPT-2 medium"]["total"] == 354_823_168
    assert r["models"]["GPT-2 large"]["total"] == 774_030_080


def test_one_layer_and_the_ffn_share(params):
    layer_768, layer_1024 = params["layers"]
    assert layer_768["total"] == 7_087_872
    assert abs(layer_768["total"] / layer_768["twelve_d2"] - 1) < 2e-3              # ≈ 12d²
    assert (layer_1024["attention"], layer_1024["ffn"], layer_1024["ln"], layer_1024["total"]) == \
        (4_198_400, 8_393_728, 4_096, 12_596_224)                                   # exercise 5
    assert abs(layer_1024["ffn_share"] - 0.6664) < 5e-5
    # counted without biases
    assert layer_1024["ffn_share_no_bias"] == pytest.approx(2 / 3, abs=1e-15)


def test_part1_prints_the_ffn_share_it_computed(capsys):
    s06.show_parameters(argparse.Namespace(quick=True, seed=0, figures=None))
    out = capsys.readouterr().out
    assert ("the FFN holds 66.63-66.64% of a layer's parameters, 0.6667 of the matrices alone "
            "(notes: 2/3)") in out
    header = next(line for line in out.splitlines() if line.startswith("term "))
    assert "by formula (parameters)" in header and "module count (parameters)" in header


def _random_configs(n=5, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        h = int(rng.integers(1, 4))
        d = h * int(rng.integers(1, 5)) * 2
        ctx = int(rng.integers(2, 9))
        yield dict(n_vocab=int(rng.integers(3, 30)), n_embd=d, n_head=h, n_positions=ctx,
                   n_layers=int(rng.integers(1, 4)), tie_weights=bool(rng.integers(2)),
                   bias=bool(rng.integers(2)),
                   middle_dim=[None, int(rng.integers(1, 20))][int(rng.integers(2))]), \
            int(rng.integers(1, ctx + 1))


def test_parameter_formula_takes_exactly_decoder_lm_arguments_with_its_defaults():
    ours = inspect.signature(s06.parameter_formula).parameters
    # no self
    model = dict(list(inspect.signature(transformer.DecoderLM.__init__).parameters.items())[1:])
    assert [(n, p.default) for n, p in ours.items()] == [(n, p.default) for n, p in model.items()]
    with pytest.raises(TypeError):  # a misspelt option is an error, not ignored
        s06.parameter_formula(n_vocab=50, n_embd=12, n_head=3, n_positions=9, n_layer=1)


def test_parameter_formula_counts_no_position_table_or_final_layernorm_where_the_model_has_none():
    small = dict(n_vocab=50, n_embd=12, n_head=3, n_positions=9, tie_weights=True)
    no_positions = dict(small, n_layers=1, positions="none")
    assert sum(s06.parameter_formula(**no_positions).values()) == 2_508                  # was 2,616
    assert transformer.DecoderLM(**no_positions).num_parameters() == 2_508
    post_ln = dict(small, n_layers=2, pre_ln=False)
    assert sum(s06.parameter_formula(**post_ln).values()) == 4_476                       # was 4,500
    assert transformer.DecoderLM(**post_ln).num_parameters() == 4_476


@pytest.mark.parametrize("positions,pre_ln,tie_weights,bias,middle_dim,n_layers", list(
    itertools.product(["learned", "sinusoidal", "none"], [True, False], [True, False],
                      [True, False], [None, 7], [0, 2])))
def test_parameter_formula_equals_the_module_count_for_every_option(positions, pre_ln, tie_weights,
                                                                    bias, middle_dim, n_layers):
    cfg = dict(n_vocab=50, n_embd=12, n_head=3, n_positions=9, n_layers=n_layers,
               positions=positions, pre_ln=pre_ln, tie_weights=tie_weights, bias=bias,
               middle_dim=middle_dim)
    formula = s06.parameter_formula(**cfg)
    assert sum(formula.values()) == transformer.DecoderLM(**cfg).num_parameters()
    assert s06.count_parameters(s06.meta_model(**cfg)) == formula  # torch_ref, term by term


@pytest.mark.parametrize("cfg,seq_len", list(_random_configs()))
def test_formulas_against_three_counters(cfg, seq_len):
    formula = s06.parameter_formula(**cfg)
    assert s06.count_parameters(s06.meta_model(**cfg)) == formula
    ours = transformer.DecoderLM(**cfg, p_dropout=0.0)
    assert ours.num_parameters() == sum(formula.values())
    flops = costs.flop_formula(seq_len=seq_len, **cfg)
    counted = s06.count_flops(s06.meta_model(**cfg), seq_len)
    assert {k: counted[k] for k in flops} == flops
    assert counted["total (counter)"] == sum(flops.values())
    logits = ours(np.zeros((1, seq_len), dtype=np.int64))  # our autodiff graph, summed over matmuls
    assert s03.matmul_flops(logits) == sum(flops.values())


# ---- part 2 · S8.2-a..g
def test_gpt2_small_flops_per_token():
    r = s06.flops_per_token()
    assert r["counted_total"] == r["total"] == 291_648_307_200
    assert all(r["formula"][k] == r["counted"][k] for k in r["formula"])
    assert abs(r["per_token"] / 1e6 - 284.8) <= 0.05
    shares = {k: 100 * v for k, v in r["shares"].items()}
    assert abs(shares["FFN"] - 39.8) <= 0.05
    assert abs(shares["output layer"] - 27.1) <= 0.05
    assert abs(shares["QKV projections"] - 14.9) <= 0.05
    assert abs(shares["attention (QKᵀ, AV)"] - 13.3) <= 0.05
    assert abs(shares["W_O"] - 4.97) <= 0.01                 # the share the notes leave out
    assert abs(r["two_n"] / 1e6 - 248.9) <= 0.05
    # per token: 2 × the weights matmuls multiply + attention's 4·S·d·L, exactly
    assert r["matmul_weights"] == 50257 * 768 + 12 * 12 * 768 ** 2 == 123_532_032
    assert 2 * r["matmul_weights"] + r["attention_per_token"] == r["per_token"] == 284_812_800


def test_part2_and_part3_print_their_computed_sentences(capsys):
    args = argparse.Namespace(quick=True, seed=0, figures=None)
    s06.show_flops(args)
    s06.show_crossover(args)
    out = capsys.readouterr().out
    assert "add up to 95.0%: they leave out W_O's 5.0%" in out
    assert "247.1) plus attention's QKᵀ and AV (4·S·d·L: 37.7) = 284.8 (equal to the total)" in out
    assert "at n = 2,048 the projections and the FFN still hold 92.3%" in out


# ---- part 3 · S8.3-a/b, Ex6
def test_crossover_at_6d():
    small, llama = s06.crossover()
    assert (small["n_star"], llama["n_star"]) == (4608, 24576)
    for r in (small, llama):
        assert r["attention_per_token"] == r["rest_per_token"]
    assert small["attention_per_token"] == 14_155_776  # exercise 6: 14.2 MFLOPs each


def test_llama_attention_share():
    rows = s06.llama_attention_share()
    assert [r["n"] for r in rows] == [2048, 32768, 131072]
    for r, quoted, swiglu in zip(rows, (7.7, 57.1, 84.2), (7.66, 57.02, 84.14)):
        assert abs(100 * r["share"] - quoted) <= 0.05
        assert r["share_counter"] == pytest.approx(r["share"], rel=1e-12)
        assert abs(100 * r["share_swiglu"] - swiglu) <= 0.01


def test_attention_flop_share_at_d_256():                                       # S8.3-h
    shares = [costs.attention_share(costs.flop_formula(n_embd=256, seq_len=S))
              for S in (128, 512, 2048)]
    for share, quoted in zip(shares, (8, 25, 57)):
        assert abs(100 * share - quoted) <= 0.5


# ---- part 4 · S8.3-c..f, Ex10 (and the same layer with dropout 0.1)
def test_saved_activations_exactly_and_the_fit():
    common.seed_everything(0)
    r = s06.activation_memory(seq_lens=(16, 32, 64, 128, 256))
    for row in r["rows"]:
        assert (row["floats"] == row["exact"]
                == 16 * row["S"] * 64 + 4 * row["S"] ** 2 + 4 * row["S"])
    assert abs(r["a"] - 16.0625) <= 1e-6 and abs(r["b"] - 1.0) <= 1e-6
    assert abs(r["crossover"] - 257) <= 1


def test_saved_activations_with_dropout_exactly_and_the_fit():
    """Dropout 0.1 in training mode keeps its masks (float32 on CPU) and the dropped attention
    weights: 18·S·d + 3·h·S² + 4·S, so the h·S² part triples and the crossover falls from 257 to
    (18d + 4)/(3h)."""
    common.seed_everything(0)
    r = s06.activation_memory(seq_lens=(16, 32, 64, 128, 256), p_dropout=0.1)
    none = s06.activation_memory(seq_lens=(16, 32, 64, 128, 256))
    for row, base in zip(r["rows"], none["rows"]):
        S = row["S"]
        assert row["floats"] == row["exact"] == 18 * S * 64 + 3 * 4 * S ** 2 + 4 * S
        assert row["storages"] == base["storages"] + 4
    at_128 = next(row for row in r["rows"] if row["S"] == 128)["sizes"]
    base_128 = next(row for row in none["rows"] if row["S"] == 128)["sizes"]
    # mask + dropped weights + softmax output
    assert at_128[4 * 128 * 128] == base_128[4 * 128 * 128] + 2 == 3
    assert at_128[128 * 64] == base_128[128 * 64] + 2  # the two S·d dropout masks
    assert abs(r["a"] - 18.0625) <= 1e-6 and abs(r["b"] - 3.0) <= 1e-6
    assert abs(r["crossover"] - (18 * 64 + 4) / 12) <= 1e-3


def test_part4_prints_both_counts_side_by_side(capsys):
    s06.show_activation_memory(argparse.Namespace(quick=True, seed=0, figures=None))
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("Part 4"))
    assert "no dropout" in header and "dropout 0.1" in header
    table_header = next(line for line in lines if "16·S·d + h·S² + 4·S" in line)
    assert "18·S·d + 3·h·S² + 4·S" in table_header
    rows = lines[lines.index(table_header) + 2:lines.index(table_header) + 7]
    assert [row.split()[0] for row in rows] == ["16", "32", "64", "128", "256"]
    assert all(row.split().count("yes") == 2 for row in rows)  # both counts equal their formulas
    assert any("dropout 0.1: a = 18.0625, b = 3.0000" in line and "96.3" in line for line in lines)


def test_llama_layer_activation_sizes():
    at_8192, at_4096 = s06.activation_examples()
    assert at_8192["one_hss"] == 4 * s06.GIB and at_8192["one_sd"] == 64 * s06.MIB
    assert at_4096["sd_part"] == 512 * s06.MIB and at_4096["hss_part"] == 1 * s06.GIB  # exercise 10
    assert at_4096["crossover"] == 2048


# ---- part 5 (timings are printed, never asserted) and the whole script
def test_attention_core_is_timed_inside_the_layers_training_forward():
    """Structure only: timings are printed, never asserted against the notes ."""
    rows = s06.attention_time_share(seq_lens=(16, 64), n_embd=32, n_head=2, repeats=2, seed=3)
    assert [r["S"] for r in rows] == [16, 64]
    for r in rows:
        assert r["training"] and r["p_dropout"] == 0.1
        assert r["core_calls"] == 1 and 1 <= r["runs"] <= 2  # one core call inside each forward
        assert (0 < r["t_core"] < r["t_layer"] and 0 < r["time_share"] < 1
                and 0 < r["flop_share"] < 1)
    again = s06.attention_time_share(seq_lens=(16, 64), n_embd=32, n_head=2, repeats=1, seed=3)
    other = s06.attention_time_share(seq_lens=(16, 64), n_embd=32, n_head=2, repeats=1, seed=4)
    # the seed covers weights, x, masks
    assert [r["checksum"] for r in again] == [r["checksum"] for r in rows]
    assert [r["checksum"] for r in other] != [r["checksum"] for r in rows]


def test_the_seed_covers_the_dropout_masks():
    """Same seed, same weights and input, dropout off: the
    checksum changes, so the masks come from the seed."""
    on = s06.attention_time_share(seq_lens=(16,), n_embd=32, n_head=2, repeats=1, seed=3)
    off = s06.attention_time_share(seq_lens=(16,), n_embd=32, n_head=2, repeats=1, seed=3,
                                   p_dropout=0.0)
    assert on[0]["checksum"] != off[0]["checksum"]


def test_script_runs(capsys, tmp_path):
    common.main(s06.__doc__, s06.PARTS, argv=["--quick", "--figures", str(tmp_path)])
    out = capsys.readouterr().out
    assert all(f"Part {k} ·" in out for k in s06.PARTS)
    timed = [line for line in out.splitlines() if line.startswith(common.TIMER)]
    assert len(timed) == 2 and all("core inside it" in line and "FLOP share" in line
                                   for line in timed)
    assert ((tmp_path / "06_flops_vs_n.png").exists()
            and (tmp_path / "06_activation_memory.png").exists())
    assert (tmp_path / "06_flash_memory.png").exists()


# ---- part 6 · beyond the notes: the flash core's memory
def test_flash_memory_exactly_and_the_fits():
    d, h = 16, 2
    r = s06.flash_memory(seq_lens=(8, 16, 32), n_embd=d, n_head=h)
    for x in r["rows"]:
        S = x["S"]
        # what part 4's torch layer saves
        assert x["fused"]["floats"] == 16 * S * d + h * S * S + 4 * S
        assert x["fused + flash"]["floats"] == 16 * S * d + 2 * h * S + 4 * S
        assert x["torch_sdpa_layer"] == 16 * S * d + h * S + 4 * S
        assert x["torch_sdpa_core"] == 4 * S * d + h * S  # q, k, v, out, logsumexp
        assert x["composed"]["floats"] > x["fused"]["floats"]
        assert x["fused + flash"]["backward_flops"] - x["fused"]["backward_flops"] == 2 * S * S * d
    assert abs(r["fits"]["fused"]["b"] - 1) < 1e-9 and r["fits"]["fused + flash"]["b"] == 0.0
    assert r["fits"]["torch_sdpa_layer"]["b"] == 0.0


# ---- part 7 · Korthikanti et al. (2022) beside the measurement
@pytest.mark.parametrize("s,b,h,a", [(128, 1, 64, 4), (2048, 8, 12288, 96), (7, 3, 10, 5)])
def test_korthikanti_terms_add_up_to_their_blocks_and_their_formula(s, b, h, a):
    terms = costs.korthikanti_terms(s, b, h, a)
    block = lambda name: sum(t["their_bytes"] for t in terms if t["block"] == name)  # noqa: E731
    assert block("attention") == 11 * s * b * h + 5 * a * s * s * b
    assert block("MLP") == 19 * s * b * h
    assert block("LayerNorms") == 4 * s * b * h
    total = sum(t["their_bytes"] for t in terms)
    assert total == costs.korthikanti_bytes(s, b, h, a)
    assert Fraction(total) == s * b * h * (34 + Fraction(5 * a * s, h))    # as the paper writes it
    # in elements: 18·s·b·h activations (3 of them masks) and 3·a·s²·b
    assert sum(t["elements"] for t in terms) == 18 * s * b * h + 3 * a * s * s * b
    assert sum(t["elements"] for t in terms if t["their_bytes_per_element"] == 1) == (
        2 * s * b * h + a * s * s * b)


@pytest.mark.parametrize("S,d,h", [(128, 64, 4), (24, 32, 2)])
def test_torch_keeps_every_term_of_the_formula_element_for_element(S, d, h):
    """Each storage the layer keeps is named by one of the formula's terms (or the LayerNorms'
    statistics) and holds the term's elements; float32 4 bytes each, bfloat16 2, masks included."""
    terms = costs.korthikanti_terms(S, 1, d, h)
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        r = costs.saved_by_term(S, d, h, p_dropout=0.1, dtype=dtype)
        assert r["unnamed"] == []
        expected = {t["term"]: [t["elements"], size * t["elements"]] for t in terms}
        expected[costs.LAYER_NORM_STATISTICS] = [4 * S, size * 4 * S]
        assert r["by_term"] == expected, dtype
    # the same storages as part 4 counts, in total
    assert sum(n for n, _ in costs.saved_by_term(S, d, h)["by_term"].values()) == (
        costs.exact_saved_floats(S, d, h, p_dropout=0.1))


def test_part7_prints_the_formula_beside_the_measurement(capsys):
    s06.show_korthikanti(argparse.Namespace(quick=True, seed=0, figures=None))
    out = capsys.readouterr().out
    S, d, h = 128, 64, 4
    theirs = 34 * S * d + 5 * h * S * S
    kept = 18 * S * d + 3 * h * S * S + 4 * S
    layer = next(line for line in out.splitlines() if line.startswith("layer "))
    assert layer.split()[-4:] == [f"{theirs:,}", f"{4 * kept:,}", f"{2 * kept:,}",
                                  f"{4 * kept / theirs:.2f}"]
    masks = 2 * S * d + h * S * S
    assert (f"In bfloat16 the layer keeps {2 * kept:,} bytes, {2 * kept - theirs:,} more than "
            f"theirs: {masks:,} mask elements × 1 byte (2 bytes each, not 1) + {4 * S:,} "
            f"statistics × 2 bytes (equal).") in out
    assert "element for element (at every term; no storage left unnamed)" in out
    assert (f"keeps the same {kept:,} elements in float64, 8 bytes each: {8 * kept:,} bytes "
            f"(equal), {8 * kept / theirs:.2f}× theirs.") in out
    assert "NOT" not in out
