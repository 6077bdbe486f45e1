"""What the parity tests share: the largest difference between two arrays or tensors, and LayerNorms
moved off their initial weights 1 and biases 0 (there, a wrong gradient for them could hide)."""
import numpy as np
import torch

from lecture06 import transformer


def max_diff(a, b) -> float:
    a = a.detach().numpy() if torch.is_tensor(a) else np.asarray(a)
    b = b.detach().numpy() if torch.is_tensor(b) else np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def randomize_layernorms(model, seed=1):
    """Every transformer.LayerNorm in our model gets weights U(0.5, 1.5) and biases N(0, 0.3²)."""
    rng = np.random.default_rng(seed)
    for _, m in model.named_modules():
        if isinstance(m, transformer.LayerNorm):
            m.weights.data[...] = rng.uniform(0.5, 1.5, m.weights.shape)
            m.bias.data[...] = rng.normal(0.0, 0.3, m.bias.shape)
    return model
