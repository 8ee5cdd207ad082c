"""python -m hostring_cli: the `hostring` command."""

import sys

from hostring_cli.cli import main

if __name__ == "__main__":
    sys.exit(main())
