"""`python -m streamback <stage>`: the same CLI as the `streamback` script (used by the rules)."""

import sys

from streamback.cli import main

sys.exit(main())
