"""Where libpump.so, the LD_PRELOAD shim, lives."""

import importlib.resources
import os
import pathlib

#: Developer override: the path of a libpump.so to use instead of the installed one
#: (a build tree's copy, or a stand-in in tests).  Not meant for users.
SHIM_PATH_ENV = "PUMP_SHIM_PATH"


class ShimNotFoundError(FileNotFoundError):
    """libpump.so is not where it should be."""


def shim_path() -> pathlib.Path:
    """Return the absolute path of libpump.so.

    That is ``$PUMP_SHIM_PATH`` when set (a developer override), else the copy
    installed in the ``pump`` package.  Raises ShimNotFoundError if the file is
    missing.
    """
    override = os.environ.get(SHIM_PATH_ENV)
    if override:
        path = pathlib.Path(override).absolute()
        if not path.is_file():
            raise ShimNotFoundError(f"{SHIM_PATH_ENV}={override}: no such file")
        return path
    path = pathlib.Path(str(importlib.resources.files("pump") / "libpump.so")).absolute()
    if not path.is_file():
        raise ShimNotFoundError(
            f"libpump.so is not installed (looked for {path}); "
            "build and install the package (pip install .)"
        )
    return path
