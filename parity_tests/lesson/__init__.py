"""The lesson: the book's chapters 3 and 4 computed in torch_ref, numpy_attn and jax_attn.

One module per part of the book (``simple``: section 3.3, ``trainable``: 3.4, ``causal``: 3.5,
``heads``: 3.6 and note 003, ``gpt_parts`` and ``gpt``: chapter 4, ``rope`` and ``grouped``: the
book's Llama 3 / Qwen3 bonus notebooks); each function returns the
``Shown`` steps of one stage of ``parity_tests.walkthrough``. ``printed`` holds what the notes
print, ``code`` reads the source lines shown, ``panel`` draws a step with rich and ``maps`` draws
attention weights and differences with matplotlib; the notebooks of ``notebooks/`` use them too.
"""
