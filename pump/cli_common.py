"""What pump's command-line tools (pump-run, pump) share: an error is one line
naming the tool, and exits with status 2."""

import argparse
import sys


def die(prog: str, message: str, code: int = 2):
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(code)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as ``TOOL: message (see TOOL [SUBCOMMAND] --help)``, not usage + message."""

    def error(self, message):
        die(self.prog.split()[0], f"{message} (see {self.prog} --help)")
