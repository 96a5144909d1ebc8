"""Held-out evaluation: :mod:`.evaluate` (greedy and sampled accuracy, the in-run evaluator),
:mod:`.stats` (pass@k, maj@k, intervals, paired tests) and :mod:`.compare` (what ``grpokit eval``
prints when two models are paired)."""
