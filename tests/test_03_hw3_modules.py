"""Script 03: every claim of notes §3.2, §7.2, §8.4, §9.1-9.2 it serves (and exercise 3), from its
part functions."""
import argparse
import contextlib
import io
import math
from collections import Counter

import numpy as np
import pytest
import torch

from lecture06 import common, costs
from lecture05 import tensor
from lecture06 import transformer
from conftest import load_script
from outputs import section

s03 = load_script("03_hw3_modules")


# ---- part 1 · S9.1-d, S9.1-e
def test_logsumexp_where_the_naive_sum_overflows():
    r = s03.stable_loss()
    assert r["naive"] == math.inf
    assert abs(r["logsumexp"] - 1000.407606) <= 1e-6
    assert abs(r["loss"] - (r["logsumexp"] - 1000.0)) <= 1e-12
    assert r["max_grad_diff"] <= 1e-12


def test_softmax_loss_gradient_is_softmax_minus_onehot_against_torch():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((6, 9)) * 50
    y = rng.integers(0, 9, 6)
    x = tensor.Tensor(z, requires_grad=True)
    transformer.softmax_loss(x, y).sum().backward()
    zt = torch.tensor(z, requires_grad=True)
    torch.nn.functional.cross_entropy(zt, torch.from_numpy(y), reduction="sum").backward()
    np.testing.assert_allclose(x.grad, zt.grad.numpy(), rtol=0, atol=1e-12)


# ---- part 2 · S7.2-b/c/d
def test_dropout_keep_ratio_mean_and_eval_identity():
    common.seed_everything(0)
    n = 100_000
    r = s03.dropout_demo(n=n, p=0.1)
    assert abs(r["kept"] - 0.9) <= 4 * math.sqrt(0.09 / n)
    assert abs(r["mean"] - r["kept"] / 0.9) <= 1e-12 * r["mean"]
    np.testing.assert_allclose(r["kept_values"], [1 / 0.9], rtol=1e-15)
    assert r["eval_is_identity"] and r["eval_max_change"] == 0.0


# ---- part 3 · S3.2-a/b/c, Ex3
EXPECTED_STEPS = [  # (shape, strides in elements, contiguous, storage)
    ((2, 5, 12), (60, 12, 1), True, "new"),
    ((2, 5, 12), (60, 12, 1), True, "new"),
    ((2, 5, 3, 4), (60, 12, 4, 1), True, "shared (no copy)"),
    ((2, 3, 5, 4), (60, 4, 12, 1), False, "shared (no copy)"),
    ((2, 3, 4, 5), (60, 4, 1, 12), False, "shared (no copy)"),
    ((2, 3, 5, 5), (75, 25, 5, 1), True, "new"),
    ((2, 3, 5, 5), (75, 25, 5, 1), True, "new"),
    ((2, 3, 5, 4), (60, 20, 4, 1), True, "new"),
    ((2, 5, 3, 4), (60, 4, 20, 1), False, "shared (no copy)"),
    ((2, 5, 3, 4), (60, 12, 4, 1), True, "copied"),
    ((2, 5, 12), (60, 12, 1), True, "shared (no copy)"),
    ((2, 5, 12), (60, 12, 1), True, "new"),
]


def test_shape_and_stride_table_exactly():
    r = s03.head_shapes()
    got = [(s["shape"], s["strides"], s["contiguous"], s["storage"]) for s in r["rows"]]
    assert got == EXPECTED_STEPS


def test_view_after_permute_raises_and_contiguous_copies_once():
    r = s03.head_shapes()
    assert r["view_error"] is not None and "contiguous()" in r["view_error"]
    # kT: one permute (0, 2, 3, 1)
    assert r["layout_ops"] == {"view": 4, "permute": 4, "contiguous": 1}


def test_exercise_3_shapes():
    shapes = [s["shape"] for s in s03.head_shapes(B=4, S=10, D=64, h=8)["rows"]]
    assert shapes[3] == (4, 8, 10, 8)      # q
    assert shapes[4] == (4, 8, 8, 10)      # kT
    assert shapes[5] == (4, 8, 10, 10)     # scores
    assert shapes[7] == (4, 8, 10, 8)      # output before concatenation
    assert shapes[10] == (4, 10, 64)       # after


def test_heads_add_no_parameters_or_flops():
    rows = s03.heads_cost()
    assert [r["h"] for r in rows] == [1, 3, 4, 12]
    assert all(r["params"] == r["params_formula"] == 624 for r in rows)
    assert all(r["flops"] == r["flops_formula"] == rows[0]["flops"] for r in rows)
    assert all(r["matmuls"] == 6 for r in rows)


def test_matmul_flops_from_the_graph_counts_every_matmul_once():
    a = tensor.Tensor(np.ones((3, 4, 5)), requires_grad=True)
    b = tensor.Tensor(np.ones((5, 6)), requires_grad=True)
    c = a @ b                                  # 2·3·4·6·5
    out = (c @ tensor.Tensor(np.ones((6, 2))) + c @ tensor.Tensor(np.ones((6, 2)))).sum()
    assert s03.matmul_flops(out) == 2 * 3 * 4 * 6 * 5 + 2 * (2 * 3 * 4 * 2 * 6)


# ---- part 4 · S9.2-a
def test_parity_with_torch_ref_in_train_mode():
    results = s03.parity()
    assert [r["module"] for r in results] == ["attention", "FFN", "Pre-LN layer", "Post-LN layer",
                                              "DecoderLM"]
    for r in results:
        assert r["dropouts"] > 0
        assert r["output_diff"] <= s03.PARITY_BOUND, r                # the bound part 4 prints
        assert len(r["grad_diffs"]) >= r["n_tensors"]
        assert max(r["grad_diffs"].values()) <= s03.PARITY_BOUND, r


def test_part4_prints_every_count_on_unmarked_rows_and_only_rounding_digits_under_the_mark(capsys):
    """The parameter, tensor and dropout counts of parity()'s defaults (D = 16, h = 4, V = 23,
    S = 6, 2 layers), from the modules' formulas; the rounding digits on ⚙ rows of their own."""
    s03.show_parity(argparse.Namespace(quick=True, seed=0, figures=None))
    lines = capsys.readouterr().out.splitlines()
    D, V, S, L = 16, 23, 6, 2
    attention, ffn = 4 * D * D + 4 * D, 2 * D * 4 * D + 4 * D + D
    layer = attention + ffn + 2 * 2 * D
    # tensors: W and b of 4 projections; of 2 Linears; + 2 LayerNorms' 2
    tensors = {"attention": 8, "FFN": 4, "layer": 8 + 4 + 4}
    expected = {"attention": (attention, tensors["attention"], 2), "FFN": (ffn, tensors["FFN"], 1),
                "Pre-LN layer": (layer, tensors["layer"], 3),
                "Post-LN layer": (layer, tensors["layer"], 3),
                # token and position tables, the layers, the final LayerNorm, an untied head;
                # dropout: 3 per layer and one on the embeddings
                "DecoderLM": (V * D + S * D + L * layer + 2 * D + V * D,
                              2 + L * tensors["layer"] + 2 + 1, 3 * L + 1)}
    unmarked = {line.split("  ")[0]: line.split() for line in lines
                if line.startswith(tuple(expected))}
    for module, (n_params, n_tensors, dropouts) in expected.items():
        assert unmarked[module][-5:] == [f"{n_params:,}", str(n_tensors), str(dropouts), "≤",
                                         "1e-13"], module
    marked = [line for line in lines if line.startswith(common.KERNELS)]
    assert [line.split("  ")[0].removeprefix(f"{common.KERNELS} ") for line in marked] == list(
        expected)
    assert not any(f"{n:,}" in line.split() for line in marked for n, _, _ in expected.values())


# ---- part 5 · S8.4-a/b/c
def test_op_counts():
    r = s03.op_counts()
    m = r["modules"]
    layer = m["Pre-LN layer"]
    # S8.4-b: Q, K, V, O, QKᵀ, AV, FFN × 2
    assert layer["matmul"] == 8
    # S8.4-a: the notes' count, call for call
    assert sum(layer.values()) == 68
    # x − m is one sub; kT one permute
    assert layer["sub"] == 4 and layer["neg"] == 0 and layer["permute"] == 4
    # the layer is exactly its parts plus two residual adds
    parts = m["LayerNorm"] + m["LayerNorm"] + m["attention"] + m["FFN"] + Counter(add=2)
    assert layer == parts
    assert r["pre_ln_train"] - layer == {"mul": 3}                # one multiply per dropout
    assert m["Linear"] == {"matmul": 1, "add": 1}
    assert m["DecoderLM (2 layers)"]["matmul"] == 2 * 8 + 1       # plus the head
    assert r["functions"]["softmax"] == {"max": 1, "sub": 2, "exp": 2, "sum": 1, "log": 1}


# ---- part 6 · §3.3, §6.1-§6.2 the paper's encoder-decoder
def test_base_encoder_decoder_has_63082496_parameters_by_module_count_formula_and_02_part_5():
    # built at the base size: d 512, V 37,000
    r = s03.encoder_decoder_parameters()
    assert all(row["by_formula"] == row["counted"] for row in r["rows"]), r["rows"]
    assert r["total"] == r["from_02"] == r["rows"][-1]["counted"] == 63_082_496
    # one V × d table: source, target and output
    assert r["tables"] == 1


def test_parameter_formula_equals_module_count_at_other_sizes():
    for sizes in (dict(d=8, d_ff=20, n_head=2, n_layers=3, n_vocab=13),
                  dict(d=6, d_ff=6, n_head=3, n_layers=1, n_vocab=5)):
        r = s03.encoder_decoder_parameters(**sizes)
        assert all(row["by_formula"] == row["counted"] for row in r["rows"]), (sizes, r["rows"])
        assert r["total"] == r["from_02"]


def test_cross_attention_weights_are_B_h_S_tgt_S_src_and_padded_sources_get_zero():
    r = s03.encoder_decoder_shapes()
    shapes = {(step, what): shape for step, what, shape in r["steps"]}
    assert shapes["weights", "(B, h, S_tgt, S_src)"] == (2, 3, 6, 5)
    assert shapes["q", "cross: from the decoder"] == (2, 3, 6, 4)
    assert shapes["kT, v", "cross: from the memory"] == "(2, 3, 4, 5), (2, 3, 5, 4)"
    assert shapes["weights", "(B, h, S_src, S_src), not causal"] == (2, 3, 5, 5)
    assert shapes["weights", "(B, h, S_tgt, S_tgt), causal"] == (2, 3, 6, 6)
    assert shapes["memory", "encoder output"] == (2, 5, 12)
    assert shapes["logits = y · token_embeddingsᵀ", "(B, S_tgt, V)"] == (2, 6, 11)
    assert r["calls"] == {"encoder attention": 1, "decoder attention": 1, "cross-attention": 1,
                          "encoder ff": 1, "decoder ff": 1, "encode": 1, "embed": 2,
                          "shift_right": 1}
    assert (r["self_future_max"] == 0.0 and r["cross_padded_max"] == 0.0
            and r["cross_visible_min"] > 0.0)


def test_encoder_decoder_matches_torch_nn_transformer_outputs_and_every_gradient_post_and_pre_ln():
    results = s03.torch_nn_parity()
    assert [r["placement"] for r in results] == ["Post-LN (the paper)", "Pre-LN"]
    assert [r["final_norms"] for r in results] == [False, True]
    assert results[1]["n_params"] - results[0]["n_params"] == 4 * 16      # encoder_ln, decoder_ln
    for r in results:
        assert r["output_diff"] <= 1e-12 and r["max_grad_diff"] <= 1e-12, r
        assert len(r["grad_diffs"]) == r["n_tensors"]


def test_encoder_decoder_generation_encodes_once_one_pass_per_token_and_stops_at_source_plus_50():
    g = s03.encoder_decoder_generation(**s03.GENERATION_SIZE)
    cached, recomputed = g["runs"][True]["generation"], g["runs"][False]["generation"]
    assert g["source_lengths"] == [5, 3] and g["limits"] == [55, 53]
    assert [run["encoder_calls"] for run in g["runs"].values()] == [1, 1]
    assert cached.lengths.tolist() == recomputed.lengths.tolist() == [55, 53]
    assert cached.n_forward == recomputed.n_forward == 55
    assert cached.positions_computed == 55 and recomputed.positions_computed == 55 * 56 // 2
    assert g["same_tokens"] and g["max_logit_diff"] <= 1e-12
    # generate() switched dropout off and back
    assert g["training"]
    beam_cached, beam_recomputed = g["beam"][True]["generation"], g["beam"][False]["generation"]
    assert g["num_beams"] == 4 and g["length_penalty"] == 0.6                   # the paper's
    assert [run["encoder_calls"] for run in g["beam"].values()] == [1, 1]       # once per source
    assert beam_cached.n_forward == beam_recomputed.n_forward == 55
    assert beam_cached.positions_computed == 4 * 55                             # beams × steps
    assert beam_recomputed.positions_computed == 4 * 55 * 56 // 2
    assert all(n <= limit for n, limit in zip(beam_cached.lengths.tolist(), [55, 53]))
    assert g["beam_same_tokens"] and g["beam_score_diff"] <= 1e-12


@pytest.fixture(scope="module")
def part6_printed() -> str:
    """Part 6's quick output, printed once for the tests that read it (~3 s a run)."""
    printed = io.StringIO()
    common.seed_everything(0)   # as common.main does before each part
    with contextlib.redirect_stdout(printed):
        s03.show_encoder_decoder(argparse.Namespace(quick=True, seed=0, figures=None))
    return printed.getvalue()


def test_part6_prints_the_generation_and_the_parity_models_size(part6_printed):
    out = part6_printed
    assert ("Against PyTorch's own torch.nn.Transformer at a small size, d = 16, h = 4, "
            "2 + 2 layers, V = 11" in out)
    assert "differ by ≤ 1e-13: float64 rounding." in out and "MORE" not in out
    assert "add 64 parameters (= 4d = 64)" in out
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines()
            if line.startswith(("greedy, ", "beam search, "))}
    assert rows["greedy, with the KV cache"][-6:] == ["1", "55", "55", "55", "and", "53"]
    assert (rows["greedy, without (the whole prefix each pass)"][-6:]
            == ["1", "55", "1540", "55", "and", "53"])
    beam = "beam search, 4 beams, α = 0.6, "
    assert rows[beam + "with the KV cache"][-6:] == ["1", "55", "220", "55", "and", "53"]
    assert (rows[beam + "without (the whole prefix each pass)"][-6:]
            == ["1", "55", "6160", "55", "and", "53"])
    assert "the encoder runs once per source" in out
    assert "220 = 4 beams × 55 passes (equal), without it 6160 = 4·55·56/2 (equal)" in out
    assert "stops by its source length + 50. The cache's search equals the recompute's: the same " \
           "tokens, scores (sums of log p) differ by ≤ 1e-12." in out
    assert "The encoder runs once; the decoder makes one pass per generated token (55 passes" in out
    assert "each\nrow stops at its source length + 50 (5 + 50 = 55, 3 + 50 = 53)" in out
    assert "1540 = 55·56/2 (equal)" in out
    assert "max |Δ logits| ≤ 1e-12, the same tokens." in out


def test_part6_prints_the_torch_nn_models_counts_on_unmarked_rows(part6_printed):
    """d = 16 (d_ff = 4d), 2 + 2 layers, V = 11, one shared table, sinusoidal positions: the
    parameters by the paper's formula, Pre-LN's two final norms 4d more; tensors likewise."""
    lines = part6_printed.splitlines()
    d, d_ff, L, V = 16, 64, 2, 11
    post = V * d + L * (4 * d * d + 2 * d * d_ff + 9 * d + d_ff) + L * (
        8 * d * d + 2 * d * d_ff + 15 * d + d_ff)
    # the table; per encoder layer 8 + 4 + 2·2, per decoder layer 16 + 4 + 3·2
    post_tensors = 1 + L * 16 + L * 26
    rows = {line.split("  ")[0]: line.split()[-3:] for line in lines
            if line.startswith(("Post-LN (the paper)  ", "Pre-LN  "))}
    assert rows == {"Post-LN (the paper)": ["no", f"{post:,}", str(post_tensors)],
                    "Pre-LN": ["yes", f"{post + 4 * d:,}", str(post_tensors + 4)]}
    marked = [line for line in lines if line.startswith(f"{common.KERNELS} P")]
    assert len(marked) == 2 and not any(f"{post:,}" in line for line in marked)


def test_part5_says_what_each_count_counts(capsys):
    s03.show_op_counts(argparse.Namespace(quick=True, seed=0, figures=None))
    out = capsys.readouterr().out
    assert "68 primitive calls = 8 matmuls + 60 others" in out
    assert "of our 60 others, 51 are elementwise ops and reductions and 9 rearrange the layout " \
           "(4 view, 4 permute, 1 contiguous)" in out
    assert ("The 8 view/permute calls only change strides" in out
            and "60 of the 68 calls touch memory" in out)
    assert "(8 matmuls, 51 elementwise ops and reductions, 1 contiguous copy)" in out


def test_rounding_level_values_print_as_bounds():
    assert common.at_most(3.6e-15, 1e-13) == "≤ 1e-13"
    assert common.at_most(2e-13, 1e-13) == "2.0e-13, MORE than the 1e-13 of rounding"


def test_script_runs_every_part_draws_and_repeats_its_kernel_digits(capsys, tmp_path,
                                                                    part6_printed):
    """The whole quick run, with figures (test_outputs checks its unmarked lines, on other
    kernels); its ⚙ lines, all in parts 4 and 6, repeat bit for bit on this machine: part 4 run
    again, part 6 as part6_printed printed it."""
    common.main(s03.__doc__, s03.PARTS, argv=["--quick", "--figures", str(tmp_path)])
    printed = capsys.readouterr().out
    assert all(f"Part {k} ·" in printed for k in s03.PARTS)
    assert (tmp_path / "03_op_counts.png").exists() and (tmp_path / "03_fusion.png").exists()
    assert sum(line.startswith(common.TIMER) for line in printed.splitlines()) == 3
    marked = {part for part in s03.PARTS
              if any(common.KERNELS in line for line in section(printed, part))}
    assert marked == {4, 6}
    common.seed_everything(0)
    s03.show_parity(argparse.Namespace(quick=True, seed=0, figures=None))
    again = {4: capsys.readouterr().out, 6: part6_printed}
    for part, printed_again in again.items():   # (the next part's header adds a blank line)
        assert ("\n".join(section(printed, part)).rstrip()
                == "\n".join(section(printed_again, part)).rstrip())


# ---- part 7 · beyond the notes: what fusion buys
def test_fusion_counts_from_shapes_equal_a_real_run():
    """The quadratic-in-S extrapolation from S = 2, 4, 6 (checked at 8) gives exactly what a run at
    S = 13 counts."""
    assert costs.fusion_counts_from_shapes(12, 3, 13) == costs.fusion_counts(12, 3, 13)


def traffic_formulas(S: int, d: int, h: int) -> dict:
    """Elements each path's Pre-LN layer (B = 1, FFN 4d, biases) moves forward and backward, and
    what the composed path saves, summed launch by launch from tensor.py's rule: a forward launch
    reads every input and writes its output (and a fused kernel's per-row statistics); a backward
    launch reads the gradient and its saved arrays and writes a gradient per input that needs one.
    A single constant (0-d) is 1 element; view and permute move nothing, nor does contiguous's
    backward, nor a contiguous() whose input is contiguous already (the flash core's output)."""
    # S·d, the FFN's hidden S·4d, the h × S × S scores, and the statistics of their h·S rows
    n, X, A, score_rows = S * d, 4 * S * d, h * S * S, h * S

    def linear(i: int, o: int) -> tuple[int, int]:
        """x W + b, forward: matmul (x, W -> y), add (y, b -> y); backward: add (g -> g, db),
        matmul (g, saved W and x -> dx, dW)."""
        return ((S * i + i * o + S * o) + (2 * S * o + o),
                (2 * S * o + o) + (S * o + 2 * i * o + 2 * S * i))

    # q, k, v and out_projection d -> d, linear_in d -> 4d, linear_out 4d -> d; the two residual
    # adds (x, y -> x + y) read 2 and write 1, and backward hands g to both
    linears = [linear(d, d)] * 4 + [linear(d, 4 * d), linear(4 * d, d)]
    common_fwd = sum(forward for forward, _ in linears) + 2 * 3 * n
    common_bwd = sum(backward for _, backward in linears) + 2 * 3 * n
    scores_fwd, scores_bwd = 2 * n + A, A + 4 * n                 # q @ kT
    av_fwd, av_bwd = A + 2 * n, 3 * n + 2 * A                     # weights @ v
    copy = 2 * n                                                  # contiguous() merging the heads
    # LayerNorm composed: sum, ×1/d, sub, c·c, sum, ×1/d, +eps, log, ×-0.5, exp, ×r, ×w, +b
    ln_fwd = ((n + S) + (2 * S + 1) + (2 * n + S) + 3 * n + (n + S) + (2 * S + 1) + (2 * S + 1)
              + 2 * S + (2 * S + 1) + 2 * S + (2 * n + S) + (2 * n + d) + (2 * n + d))
    ln_bwd = ((n + S) + (2 * S + 1) + (2 * n + S) + 5 * n + (n + S) + (2 * S + 1) + 2 * S
              + 3 * S + (2 * S + 1) + 3 * S + (3 * n + 2 * S) + (3 * n + 2 * d) + (2 * n + d))
    # softmax composed, on the scores: ×scale, +mask (1, 1, S, S), max, sub, exp, sum, log, sub, exp
    softmax_fwd = ((2 * A + 1) + (2 * A + S * S) + (A + score_rows) + (2 * A + score_rows) + 2 * A
                   + (A + score_rows) + 2 * score_rows + (2 * A + score_rows) + 2 * A)
    # (max is a constant: no backward)
    softmax_bwd = ((2 * A + 1) + 2 * A + 2 * A + 3 * A + (A + score_rows) + 3 * score_rows
                   + (2 * A + score_rows) + 3 * A)
    # GELU composed on X: x·x, ·x, ×0.044715, x +, ×√(2/π), ×2, sigmoid, x ·
    gelu_fwd = 3 * X + 3 * X + (2 * X + 1) + 3 * X + (2 * X + 1) + (2 * X + 1) + 2 * X + 3 * X
    gelu_bwd = 5 * X + 5 * X + (2 * X + 1) + 3 * X + (2 * X + 1) + (2 * X + 1) + 3 * X + 5 * X
    fused_ln_fwd, fused_ln_bwd = 2 * n + 2 * d + 2 * S, 3 * n + 3 * d + 2 * S   # x, w, b; μ, 1/σ
    fused_softmax_fwd, fused_softmax_bwd = 2 * A + S * S, 3 * A
    fused_gelu_fwd, fused_gelu_bwd = 2 * X, 3 * X
    # q, kT, v -> out, and per row max and log-sum; backward also writes dq, dkT, dv
    flash_fwd, flash_bwd = 4 * n + 2 * score_rows, 8 * n + 2 * score_rows
    return {
        "composed": dict(forward=common_fwd + 2 * ln_fwd + scores_fwd + softmax_fwd + av_fwd
                         + copy + gelu_fwd,
                         backward=common_bwd + 2 * ln_bwd + scores_bwd + softmax_bwd + av_bwd
                         + gelu_bwd,
                         # fused's, plus one S·d per LayerNorm (its centred and its normalised
                         # input, where the fused kernel keeps x), GELU's x² and sigmoid,
                         # softmax's first exp and its log's input
                         saved=16 * n + A + 4 * S + 2 * n + 2 * X + A + score_rows),
        "fused": dict(forward=common_fwd + 2 * fused_ln_fwd + scores_fwd + fused_softmax_fwd
                      + av_fwd + copy + fused_gelu_fwd,
                      backward=common_bwd + 2 * fused_ln_bwd + scores_bwd + fused_softmax_bwd
                      + av_bwd + fused_gelu_bwd),
        "fused + flash": dict(forward=common_fwd + 2 * fused_ln_fwd + flash_fwd + fused_gelu_fwd,
                              backward=common_bwd + 2 * fused_ln_bwd + flash_bwd
                              + fused_gelu_bwd)}


@pytest.mark.parametrize("S,d,h", [(10, 16, 4), (7, 12, 3), (5, 8, 2)])
def test_fusion_launches_flops_and_bytes(S, d, h):
    composed, fused, flash = costs.fusion_counts(d, h, S)
    assert ((composed["forward_calls"], fused["forward_calls"], flash["forward_calls"])
            == (68, 29, 27))
    # the flash path's contiguous() finds the heads merged already: a call, no launch
    assert ((composed["forward_moving"], fused["forward_moving"], flash["forward_moving"])
            == (60, 21, 18))
    for row in (composed, fused, flash):                               # notes §8.2: matmuls only
        assert row["forward_flops"] == 24 * S * d * d + 4 * S * S * d
    assert fused["backward_flops"] == composed["backward_flops"] == 2 * composed["forward_flops"]
    assert flash["backward_flops"] - composed["backward_flops"] == 2 * S * S * d   # q kᵀ recomputed
    formulas = traffic_formulas(S, d, h)
    for row in (composed, fused, flash):                               # float64: 8 bytes each
        assert row["forward_bytes"] == 8 * formulas[row["path"]]["forward"], row["path"]
        assert row["backward_bytes"] == 8 * formulas[row["path"]]["backward"], row["path"]
    assert composed["saved"] == 8 * formulas["composed"]["saved"]
    assert fused["saved"] == 8 * (16 * S * d + h * S * S + 4 * S)
    assert flash["saved"] == 8 * (16 * S * d + 2 * h * S + 4 * S)


def test_part7_prints_the_counts_of_gpt2_smalls_layer_by_their_formulas(capsys):
    """Every byte count part 7 prints, at d = 768, h = 12, S = 1024, from traffic_formulas."""
    s03.show_fusion(argparse.Namespace(quick=True, seed=0, figures=None))
    out = capsys.readouterr().out
    d, h, S = (costs.GPT2_LAYER[k] for k in ("d", "h", "S"))
    formulas, mib = traffic_formulas(S, d, h), 2 ** 20 / 8
    printed = {line.split("  ")[0]: line.split()[-10:] for line in out.splitlines()
               if line.startswith(costs.FUSION_PATHS)}
    for path, f in formulas.items():
        moved = [f["forward"] / mib, f["backward"] / mib, (f["forward"] + f["backward"]) / mib]
        assert printed[path][4:7] == [f"{x:,.0f}" for x in moved], path
    assert printed["composed"][-1] == f"{formulas['composed']['saved'] / mib:,.0f}"
    assert printed["fused + flash"][:4] == ["27", "18", "27", "18"]   # calls, launches
    total = {p: f["forward"] + f["backward"] for p, f in formulas.items()}
    assert (f"launches 118 -> 41, bytes moved ÷ {total['composed'] / total['fused']:.2f}; with the "
            f"flash core: launches 36, bytes ÷ {total['composed'] / total['fused + flash']:.2f}."
            in out)
    assert "printed when you run it" in out


def test_a_contiguous_call_that_copies_nothing_is_found_and_one_that_copies_is_not():
    x = tensor.Tensor(np.ones((2, 3, 4)), requires_grad=True)
    merged = x.permute(1, 0, 2).permute(1, 0, 2).contiguous()       # back in order: no copy
    copied = x.permute(1, 0, 2).contiguous()                        # a real copy
    assert costs.contiguous_calls_that_copy_nothing(merged.sum()) == [merged]
    assert costs.contiguous_calls_that_copy_nothing(copied.sum()) == []


def test_fusion_path_names_are_checked():
    with pytest.raises(ValueError, match="unknown path 'flash'; choose one of composed, fused, "
                                         "fused \\+ flash"):
        costs.fusion_switch("flash")
