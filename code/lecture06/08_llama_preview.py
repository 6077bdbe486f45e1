"""Script 08 · §14's preview: from the notes' GPT to a LLaMA-style decoder, one change at a time.

Beyond the notes' seven scripts: §14 promises that lecture 7 turns the small GPT into LLaMA's
structure item by item (Pre-RMSNorm, SwiGLU, RoPE, GQA). Each part measures one change with
llama.py's modules (tensor.py primitives; llama_ref.py is the float64 torch twin):
part 1 RMSNorm's reductions against LayerNorm's, part 2 SwiGLU's hidden size at equal parameters,
part 3 RoPE (the score depends only on m − n; the table it does not need; length extrapolation),
part 4 GQA (the KV cache's bytes; a multi-head model converted by mean-pooling), part 5 the ladder
from GPT to LLaMA-style trained on the city language, each step's effect counted over seeds.

    python code/lecture06/08_llama_preview.py [--part N] [--seed S] [--quick] [--no-figures]
"""
from __future__ import annotations

import common  # first: one BLAS thread before numpy loads, and lecture 5's code importable


# ---- Part 1 · §14, RMSNorm ----------------------------------------------------------------------
def show_norm_reductions(args):
    common.header(1, "§14", "RMSNorm against LayerNorm: the reductions a row needs")
    common.note("(not built yet)")


# ---- Part 2 · §14, SwiGLU -----------------------------------------------------------------------
def show_swiglu_sizes(args):
    common.header(2, "§14", "SwiGLU against GELU at equal parameters")
    common.note("(not built yet)")


# ---- Part 3 · §14, RoPE -------------------------------------------------------------------------
def show_rope(args):
    common.header(3, "§14", "RoPE: relative by construction, no table, length extrapolation")
    show_rope_relative(args)
    show_extrapolation(args)


def show_rope_relative(args):
    common.note("(not built yet: the m − n property and the table RoPE does not need)")


# ---- Part 4 · §14, GQA --------------------------------------------------------------------------
def show_gqa(args):
    common.header(4, "§14", "Grouped-query attention: the KV cache, and converting a trained model")
    show_kv_cache(args)
    show_gqa_conversion(args)


def show_kv_cache(args):
    common.note("(not built yet: KV-cache bytes measured and by formula)")


# ---- Trained parts: part 3's extrapolation, part 4's conversion, part 5's ladder ----------------
def show_extrapolation(args):
    common.note("(not built yet: length extrapolation on the city language)")


def show_gqa_conversion(args):
    common.note("(not built yet: mean-pooled KV heads, before and after uptraining)")


def show_ladder(args):
    common.header(5, "§14", "The ladder: GPT -> +RMSNorm -> +SwiGLU -> +RoPE -> +GQA")
    common.note("(not built yet)")


PARTS = {1: show_norm_reductions, 2: show_swiglu_sizes, 3: show_rope, 4: show_gqa, 5: show_ladder}

if __name__ == "__main__":
    common.main(__doc__, PARTS)
