"""Lecture 6 of CMU 11-868 LLM Systems: the Transformer, built on lecture 5's autodiff framework.

`from lecture06 import transformer` (every HW3 module, ending with DecoderLM), `encoder_decoder`,
`decoding`, `optim`, `kernels`, `llama`; their PyTorch twins `torch_ref` and `llama_ref`; `costs`,
the cost models that scripts 03, 06 and 09 share; the city language and its training (`city_lab`,
`city_train`, `city_llama`); and the numbered scripts beside them, run as files
(`python code/lecture06/01_attention.py`). Importing the package loads nothing: the scripts'
`common` must set the BLAS threads before numpy loads.
"""
