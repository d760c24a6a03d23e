"""`python -m streamback <stage>`: the same CLI as the `streamback` script (used by the rules); a torchrun
worker ends through `cli.exit_with` (its status, without the interpreter's finalization)."""

from streamback.cli import exit_with, main

exit_with(main())
