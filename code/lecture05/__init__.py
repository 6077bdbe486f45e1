"""Lecture 5 of CMU 11-868 LLM Systems: `from lecture05.tensor import Tensor`, the small autodiff
framework lecture 6 builds on; `reviews`, its movie-review data set; `bag_of_words`, its
baseline."""
