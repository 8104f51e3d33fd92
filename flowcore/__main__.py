"""`python -m flowcore` is the `flowcore` command."""
import sys

from flowcore.cli import main

sys.exit(main())
