"""``python -m simkit.servers ENV_ID --num-envs N --bind ...`` (same as ``simkit serve``)."""

import sys

from simkit.servers._cli import main

sys.exit(main())
