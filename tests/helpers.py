"""What several test files share: the installed pump-run, and an environment
free of pump's and fakecuda's variables."""

import os
import pathlib
import sys

# The console script installed beside this Python: it imports the installed
# package (with libpump.so), never the source tree's.
PUMP_RUN = str(pathlib.Path(sys.executable).parent / "pump-run")


def clean_env(*drop):
    """os.environ without LD_PRELOAD, PUMP_* and FAKECUDA_*, nor the names in drop."""
    gone = {"LD_PRELOAD", *drop}
    return {k: v for k, v in os.environ.items() if k not in gone and not k.startswith(("PUMP_", "FAKECUDA_"))}
