"""The training loop and what it is built from: :mod:`.loop` (``train`` → ``run_step``),
:mod:`.update` (``optimize``: the gradient passes of a step), :mod:`.build` (a run's parts from a
recipe), :mod:`.collect` (sampling, scoring and advantages of a step), :mod:`.checkpoint`,
:mod:`.state`, :mod:`.optim`, :mod:`.stopping`, and the supervised warm-up :mod:`.sft`."""
