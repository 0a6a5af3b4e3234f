"""``python -m simkit``: the same as the ``simkit`` console script."""

from simkit.cli import main

raise SystemExit(main())
