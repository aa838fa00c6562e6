"""The `kvtier` command of the Python package: the same command line as the `kvtier` binary,
run by the extension in this process (`pip install ./python` puts it on the environment's
PATH). The processes it starts (`kvtier up`, `kvtier demo`, the benchmarks' clusters) run
this script again, named by `KVTIER_EXE`.
"""

from __future__ import annotations

import os
import sys

from kvtier import _kvtier


def main() -> None:
    """Runs `sys.argv` as the `kvtier` binary would and exits with its status."""
    script = os.path.abspath(sys.argv[0])
    if os.path.isfile(script) and os.access(script, os.X_OK):
        os.environ.setdefault("KVTIER_EXE", script)
    sys.exit(_kvtier.run_cli(["kvtier", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
