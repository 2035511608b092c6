"""jax_attn's blockwise loops (``blockwise``); the rest of its fast paths is framework-neutral, in
``numpy_attn.fast``."""
