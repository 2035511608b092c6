"""The fast paths of numpy_attn and jax_attn, apart from the reference math: the implementations
and their rules (``options``), ``attend``, ``attend_heads`` and ``fast_layer`` (``attend``), the
stacked QKV projection (``projections``), blocks and heads (``blocks``), NumPy's blockwise loops
(``blockwise``) and heads on threads (``threads``). jax_attn's loops: ``jax_attn.fast``."""
