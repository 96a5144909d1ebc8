"""The ``grpokit`` command: :mod:`.main` (``train``, ``sft``, ``eval``, ``plot``), :mod:`.eval`
(``grpokit eval``), :mod:`.recipe_args` (recipe overrides from flags) and :mod:`.errors` (what
becomes one line of error)."""

from grpokit.cli.main import main

__all__ = ["main"]
