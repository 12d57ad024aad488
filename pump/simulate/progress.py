"""How far `pump simulate` is, on stderr: a simulation of a large trace takes a minute or more.
On a terminal, one bar redrawn in place; elsewhere (a log, a pipe), a line per run."""

import sys

BAR_WIDTH = 30


class Progress:
    def __init__(self, total: int, stream=None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty()

    def step(self, what: str):
        """A run begins: `what` says which (a policy, at a capacity)."""
        self.done += 1
        if self.terminal:
            filled = BAR_WIDTH * (self.done - 1) // self.total
            print(f"\rsimulate [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} {what:<40}",
                  end="", file=self.stream, flush=True)
        else:
            print(f"simulate: run {self.done}/{self.total}: {what}", file=self.stream, flush=True)

    def close(self):
        """Done: the bar's line is cleared (lines stay)."""
        if self.terminal and self.done:
            print("\r" + " " * (BAR_WIDTH + 60) + "\r", end="", file=self.stream, flush=True)
