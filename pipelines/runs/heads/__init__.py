"""The ``heads`` and ``study heads`` run kinds: cross-seed stability of attention heads (Bali et al. 2026)."""
