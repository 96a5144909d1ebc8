"""Advantage estimators and policy losses behind one seam (``algo.estimator``): :mod:`.base` (the
``Algorithm`` protocol and the registry), :mod:`.grpo`, and the PPO baseline (:mod:`.ppo` with its
value model, :mod:`.value`)."""
