"""What a ``grpokit`` command turns into one line of error (the rule of :mod:`grpokit.cli.main`'s docstring)."""

from __future__ import annotations

import os

import yaml

#: what a CLI command turns into one line of error (see the module docstring)
USER_ERRORS = (ValueError, OSError, ImportError, RuntimeError, TypeError, yaml.YAMLError)


def one_line(e: BaseException) -> str:
    """The message of ``e`` on one line (its lines joined), or its type's name when it has none."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return text or type(e).__name__


def show_traceback() -> bool:
    return os.environ.get("GRPOKIT_TRACEBACK", "") not in ("", "0")


def finite_float(text: str) -> float:
    """``argparse`` type of a float flag: a finite number (``nan``, ``inf`` refused, as recipe keys refuse them).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a number, or not finite (argparse names the flag, exit 2).
    """
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value
