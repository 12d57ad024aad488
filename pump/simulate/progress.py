"""How far a long command is, on stderr: a simulation of a large trace, or a trace generated
from a large model, takes a minute or more (`pump simulate`, `pump trace generate`).
On a terminal, one bar redrawn in place; elsewhere (a log, a pipe), a line per unit of work."""

import sys

BAR_WIDTH = 30


class Progress:
    def __init__(self, total: int, stream=None, label: str = "simulate", unit: str = "run"):
        self.total, self.done = total, 0
        self.label, self.unit = label, unit
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty()

    def step(self, what: str):
        """A unit begins: `what` says which (a policy at a capacity; a training step)."""
        self.done += 1
        if self.terminal:
            filled = BAR_WIDTH * (self.done - 1) // self.total
            print(f"\r{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} {what:<40}",
                  end="", file=self.stream, flush=True)
        else:
            print(f"{self.label}: {self.unit} {self.done}/{self.total}: {what}", file=self.stream, flush=True)

    def close(self):
        """Done: the bar's line is cleared (lines stay)."""
        if self.terminal and self.done:
            print("\r" + " " * (BAR_WIDTH + 60) + "\r", end="", file=self.stream, flush=True)
