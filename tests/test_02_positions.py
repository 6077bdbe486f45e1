"""Script 02 (notes §4.1-§4.4): every claim of the notes it serves, and
exercise 4."""
import math

import numpy as np
import pytest

from conftest import load_script

m = load_script("02_positions")
D = 512
OMEGA = 10000.0 ** (-np.arange(0, D, 2) / D)      # the notes' formula, written out independently


# ---- Part 1 · §4.2 (S4.2-a..e) -------------------------------------------------------------------
def test_sinusoidal_encoding_over_2048_positions():
    r = m.sinusoidal()
    assert r["d"] == D and r["n_positions"] == 2048
    assert (abs(r["fastest_wavelength"] - 6.3) < 0.05
            and abs(r["fastest_wavelength"] - 2 * math.pi) < 1e-12)
    assert abs(r["slowest_wavelength"] / 60611 - 1) < 1e-5
    assert abs(r["min_distance"] - 3.714) < 5e-4
    assert abs(r["max_nearest_distance"] - r["min_distance"]) < 1e-9       # the same for every t
    assert abs(r["adjacent_distance_formula"] - math.sqrt(2 * (1 - np.cos(OMEGA)).sum())) < 1e-12
    assert r["nearest_is_adjacent"] is True
    assert -1.0 <= r["min_component"] and r["max_component"] <= 1.0


def test_the_encoding_is_the_notes_formula():
    pe = m.sinusoidal(n_positions=64)["pe"]
    t = np.arange(64)[:, None]
    assert np.abs(pe[:, 0::2] - np.sin(t * OMEGA)).max() < 1e-12
    assert np.abs(pe[:, 1::2] - np.cos(t * OMEGA)).max() < 1e-12


# ---- Part 2 · §4.2 (S4.2-f, S4.2-g, Ex4) ---------------------------------------------------------
def test_rotation_and_distance_only_dot_product():
    r = m.rotation()
    assert (r["t_rotate"], r["t_dot"]) == (512, 64)
    assert [row["k"] for row in r["rows"]] == [1, 5, 10, 100]
    for row in r["rows"]:
        k = row["k"]
        # the bounds the table prints in place of these rounding-level values
        assert row["rotation_error"] <= m.ROTATION_ROUNDING
        assert row["dot_std"] <= m.DOT_ROUNDING
        assert abs(row["dot_mean"] - row["sum_cos"]) <= m.DOT_ROUNDING
        assert abs(row["dot_mean"] - np.cos(OMEGA * k).sum()) <= 1e-9      # Ex4: Σᵢ cos(ωᵢk)
        assert abs(row["sum_cos"] - np.cos(OMEGA * k).sum()) <= 1e-12


def test_both_rounding_errors_grow_with_t():
    """The sentence under part 2's table, by the numbers its ⚙ line prints: the largest error over
    the last 64 positions below 512 against the first 64 (AMD EPYC: rotation 6.3e-14 against
    2.1e-14, dot product 2.0e-13 against 5.7e-14; asserted with room for other sin and cos)."""
    rows = m.rotation()["rows"]
    for kind in ("rotation_error", "dot_error"):
        early, late = (max(row[f"{kind}_{band}"] for row in rows) for band in ("early", "late"))
        assert late > 2 * early, kind
    assert max(row["rotation_error_late"] for row in rows) == max(row["rotation_error"]
                                                                   for row in rows)


def test_dot_curves_coincide_for_every_start():
    c = m.dot_curves(starts=(0, 100, 1000), max_k=50)
    for curve in c["curves"].values():
        assert np.abs(curve - c["sum_cos"]).max() < 1e-11
    assert abs(c["sum_cos"][0] - D / 2) < 1e-12          # PE(t)·PE(t) = d/2


# ---- Part 3 · §4.3 (S4.3-a, S4.3-b) --------------------------------------------------------------
def test_learned_table_refuses_a_longer_input_sinusoidal_does_not():
    r = m.learned_limit()
    learned, sinusoidal = r["models"]["learned"], r["models"]["sinusoidal"]
    assert learned["fits"] == (1, 8, 10) and learned["longer"] is None
    assert "sequence length 9" in learned["error"] and "n_positions=8" in learned["error"]
    assert sinusoidal["error"] is None and sinusoidal["longer"] == (1, 9, 10)
    assert r["far"] == 9999 and r["pe_far_finite"]
    assert -1.0 <= r["pe_far_min"] and r["pe_far_max"] <= 1.0
    assert (abs(r["pe_far"][0] - math.sin(9999)) < 1e-12
            and abs(r["pe_far"][1] - math.cos(9999)) < 1e-12)


# ---- Part 4 · §4.4 (S4.4-a..d) -------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_embedding_scale(seed):
    r = m.embedding_scale(seed=seed)
    assert r["n_positions"] >= 2048
    assert abs(r["pe_norm_min"] - 16) < 1e-9 and abs(r["pe_norm_max"] - 16) < 1e-9
    assert 0.8 < r["e_norm_mean"] < 1.2
    assert 0.04 < r["cos_plain"] < 0.09
    assert abs(r["cos_scaled"] - 0.816) < 0.02
    assert (abs(r["cos_plain_expected"] - 0.0624) < 1e-4
            and abs(r["cos_scaled_expected"] - math.sqrt(2 / 3)) < 1e-12)


# ---- Part 5 · §4.1 (S4.1-a..d) -------------------------------------------------------------------
def test_parameter_table():
    r = m.parameter_table()
    assert r["n_vocab"] == 37000
    base, big = r["rows"]["base"], r["rows"]["big"]
    expected = {"base": (44_138_496, 63_082_496, 100_970_496),
                "big": (176_357_376, 214_245_376, 290_021_376)}
    for name, (body, shared, unshared) in expected.items():
        row = r["rows"][name]
        assert (row["shared"], row["unshared"]) == (shared, unshared)
        for tables, total in ((1, shared), (3, unshared)):
            formula, modules = row["counts"][tables]
            assert formula["body"] == modules["body"] == body
            assert formula["total"] == modules["total"] == total
    assert round(100 * base["saving"], 2) == 37.52 and abs(100 * base["saving"] - 37.5) < 0.05
    assert round(100 * big["saving"], 2) == 26.13
    assert base["saving"] > big["saving"]
    assert round(100 * base["saving_two_tables"], 2) == 23.09
    assert abs(base["shared"] / 65e6 - 1) < 0.05 and abs(big["shared"] / 213e6 - 1) < 0.05
    assert base["counts"][1][1]["final_norms"] == 2 * 2 * 512


def test_conclusions_print_what_the_tables_show(capsys):
    m.common.main(m.__doc__, m.PARTS, ["--quick", "--no-figures"], uses_torch=False)
    out = capsys.readouterr().out
    assert "Every encoding is different (smallest distance 3.714 > 0), neighbours are closest, " \
           "and nothing grows with t" in out
    assert "(‖e‖ ≈ 1.00 against ‖PE‖ = 16: cos 0.063); scaled by √d, the token dominates " \
           "again" in out
    assert "(‖√d·e‖ ≈ 22.6 against 16: cos 0.816; notes: 0.064 and 0.816)" in out
    assert "The saving is larger for the smaller model (37.52% against 26.13%): the table is a " \
           "bigger share of it (30.0% of base, 17.7% of big)." in out
    assert "Both errors are rounding, and grow with t" in out
    assert f"{m.common.KERNELS} Largest at t < 64 against 448 ≤ t < 512 (any k): " in out
    # one bound per k for the rotation, two for the dot product (|mean − Σ cos| and std over t)
    assert (out.count(f"≤ {m.ROTATION_ROUNDING:.0e}") == 4
            and out.count(f"≤ {m.DOT_ROUNDING:.0e}") == 8)


# ---- every part runs as the script runs it (`--quick`), figures included -------------------------
def test_every_part_prints_and_draws(tmp_path, capsys):
    m.common.main(m.__doc__, m.PARTS, ["--quick", "--figures", str(tmp_path)], uses_torch=False)
    out = capsys.readouterr().out
    assert all(f"Part {n} · §" in out for n in range(1, 6))
    assert all(text in out for text in ("3.714", "60,611", "63,082,496", "37.52", "ValueError"))
    figures = ["02_embedding_scale.png", "02_pe_dot.png", "02_pe_heatmap.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == figures
