"""What pump's command-line tools (pump-run, pump) share: an error is one line
naming the tool, with a "did you mean" for a mistyped option or choice, and exits
with status 2."""

import argparse
import difflib
import re
import sys


def die(prog: str, message: str, code: int = 2):
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(code)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as ``TOOL: message (see TOOL [SUBCOMMAND] --help)``, not usage + message."""

    def error(self, message):
        die(self.prog.split()[0], f"{message}{self._did_you_mean(message)} (see {self.prog} --help)")

    def _did_you_mean(self, message: str) -> str:
        """'; did you mean X?' for the first mistyped option or choice the message names, or ''."""
        wrong = re.search(r"unrecognized arguments: (.*)", message)
        if wrong:
            for token in wrong.group(1).split():
                if token.startswith("-"):
                    return _closest(token.split("=")[0], sorted(self._options()))
            return ""
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            return _closest(choice.group(1), [c.strip(" '\"") for c in choice.group(2).split(",")])
        return ""

    def _options(self, argv=None):
        """The option strings of this parser and of the subcommands the command line names
        (argparse reports a subcommand's unknown option from the top parser)."""
        argv = sys.argv[1:] if argv is None else argv
        for action in self._actions:
            yield from action.option_strings
            if isinstance(action, argparse._SubParsersAction):
                named = next((word for word in argv if word in action.choices), None)
                if isinstance(action.choices.get(named), OneLineParser):
                    yield from action.choices[named]._options(argv[argv.index(named) + 1:])


def _closest(word: str, known) -> str:
    """The one or two known words nearest `word`: those it begins or that begin with it, else
    difflib's nearest (compared without leading dashes)."""
    known = list(dict.fromkeys(known))
    bare = word.lstrip("-")
    close = [k for k in known if bare and (k.lstrip("-").startswith(bare) or bare.startswith(k.lstrip("-")))][:2]
    if not close:
        names = {k.lstrip("-"): k for k in known}
        close = [names[n] for n in difflib.get_close_matches(bare, list(names), n=2, cutoff=0.7)]
    return f"; did you mean {' or '.join(close)}?" if close else ""
