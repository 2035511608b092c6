"""The benchmark suite: ``attn-parity bench`` (see ``run``, ``implementations``, ``output``)."""
