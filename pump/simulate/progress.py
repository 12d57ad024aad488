"""How far a long command is, on stderr: a simulation of a large trace, or a trace generated
from a large model, takes a minute or more (`pump simulate`, `pump trace generate`).
On a terminal, one bar redrawn in place; elsewhere (a log, a pipe), a line per unit of work.
With eta, each unit after the first says about how long the rest will take, at the mean time
of the units so far."""

import sys
import time

BAR_WIDTH = 30


def duration(seconds: float) -> str:
    """A time to wait, as a person reads it: 40 s, 3 min 20 s."""
    seconds = max(0, round(seconds))
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60:02d} s"


class Progress:
    def __init__(self, total: int, stream=None, label: str = "simulate", unit: str = "run", eta: bool = False):
        self.total, self.done = total, 0
        self.label, self.unit, self.eta = label, unit, eta
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty()
        self.started = time.monotonic()
        self.goal = ""      # what the time left is to: "" the end, or e.g. " to the first answer"

    def expect(self, total: int):
        """The work now known to be coming: `total` units in all (a bisection's runs are known
        as it goes)."""
        self.total = max(total, self.done)

    def left(self) -> str:
        """'; about T left', from the units done so far, or ''."""
        if not self.eta or self.done < 2:
            return ""
        per = (time.monotonic() - self.started) / (self.done - 1)
        return f"; about {duration(per * (self.total - self.done + 1))} left{self.goal}"

    def step(self, what: str):
        """A unit begins: `what` says which (a policy at a capacity; a training step)."""
        self.done += 1
        self.total = max(self.total, self.done)
        what += self.left()
        if self.terminal:
            filled = BAR_WIDTH * (self.done - 1) // self.total
            print(f"\r{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} {what:<60}",
                  end="", file=self.stream, flush=True)
        else:
            print(f"{self.label}: {self.unit} {self.done}/{self.total}: {what}", file=self.stream, flush=True)

    def say(self, line: str):
        """A line of its own (what is to come; a first answer), the bar redrawn below it."""
        if self.terminal and self.done:
            print("\r" + " " * (BAR_WIDTH + 80) + "\r", end="", file=self.stream)
        print(line, file=self.stream, flush=True)

    def close(self):
        """Done: the bar's line is cleared (lines stay)."""
        if self.terminal and self.done:
            print("\r" + " " * (BAR_WIDTH + 80) + "\r", end="", file=self.stream, flush=True)
