"""``python -m grpokit …`` (and ``torchrun … -m grpokit train …``): the ``grpokit`` command."""

from grpokit.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
