"""pump: the command for looking at and checking pump.

    pump config check [--daemon] FILE...   check job files (or, --daemon, pumpd.toml files)
    pump status [--json] [--socket PATH]   the jobs pumpd runs that the caller may see
    pump trace show|stats FILE             read a trace (pump-run --trace)
    pump trace export --perfetto OUT FILE  a trace as a timeline (Chrome Trace Event JSON)
    pump trace generate MODEL -o FILE      a real model's training steps as a trace, without a GPU
                  (--model MODULE:CALLABLE: your own model)
    pump simulate TRACE --capacity SIZE    model a trace under each prefetch policy

Exit codes: 0 ok; 1 a checked file has errors (each on its own line on stderr), no
daemon answers, or a trace file is bad; 2
pump's own errors (one line on stderr, "pump: ...").
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

import pump
from pump.cli_common import OneLineParser, die
from pump import config, tracegen

PROG = "pump"


def _die(message: str, code: int = 2):
    die(PROG, message, code)


# --- pump config check ---------------------------------------------------------------------

def _config_check(args) -> int:
    from pump import config_advice
    load = config.load_daemon_file if args.daemon else config.load_job_file
    advise = config_advice.daemon_warnings if args.daemon else config_advice.job_warnings
    rc = 0
    for path in args.files:
        try:
            cfg = load(path)
        except config.ConfigError as exc:
            for line in exc.errors:
                print(line, file=sys.stderr)
            rc = 1
        else:
            print(f"{path}: ok")
            for line in advise(path, cfg):
                print(line, file=sys.stderr)
    return rc


# --- pump status ---------------------------------------------------------------------------

def _status(args) -> int:
    # Imported here: `pump config` needs none of what status imports.
    return importlib.import_module("pump.status").main(args)


# --- pump trace ----------------------------------------------------------------------------

def _trace(args) -> int:
    from pump import trace
    try:
        if args.trace_command == "show":
            trace.show(args.file, sys.stdout)
        else:
            doc = trace.stats(args.file)
            if args.json:
                json.dump(doc, sys.stdout, indent=2)
                print()
            else:
                print(trace.stats_text(doc))
    except trace.TraceError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `pump trace show FILE | head`
        sys.stderr.close()
    return 0


def _trace_export(args) -> int:
    from pump import timeline_cli
    return timeline_cli.export(args)


def _trace_generate(args) -> int:
    try:
        from pump.tracegen import generate, user
        from pump.simulate.progress import Progress
    except ImportError as exc:
        _die(f"trace generate needs PyTorch ({exc}); install pump[models]")
    if (args.model is None) == (args.user_model is None):
        _die("trace generate: give MODEL or --model MODULE:CALLABLE, one of them")
    if args.user_model and any(v is not None for v in (args.size, args.batch, args.seq)):
        _die("trace generate: --size, --batch and --seq are for the built-in models; with --model the "
             "callable makes the model and its batch")
    make = (lambda: user.load(args.user_model)) if args.user_model else \
        (lambda: generate.builtin(args.model, args.size or "full", args.batch, args.seq))
    progress = Progress(args.steps, label="trace generate", unit="pass" if args.inference else "step")
    try:
        summary = generate.generate(args.output, make, args.steps, args.last_batch, args.eval_every, progress.step,
                                    args.inference)
    except ValueError as exc:
        _die(f"trace generate: {exc}")
    except OSError as exc:
        _die(f"trace generate: cannot write {args.output}: {exc.strerror}")
    finally:
        progress.close()
    print(summary.line(args.output))
    return 0


# --- pump simulate ------------------------------------------------------------------------

def _simulate(args) -> int:
    return importlib.import_module("pump.simulate.cli").main(args)


# --- the parser ----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Look at and check pump (the CUDA Unified Memory prefetcher).",
                allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"{PROG} {pump.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    cfg = sub.add_parser("config", help="check configuration files", allow_abbrev=False,
                         description="Check pump's configuration files.")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    check = cfg_sub.add_parser(
        "check", allow_abbrev=False,
        help="validate job files (or pumpd.toml files with --daemon)",
        description="Validate each FILE: print 'FILE: ok' (and on stderr a warning for each value that is "
                    "valid but can hardly be meant), or every error on stderr (exit 1).",
    )
    check.add_argument("--daemon", action="store_true",
                       help="FILE is the service's own file (pumpd.toml), not a job file")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(handler=_config_check)

    status = sub.add_parser("status", help="the jobs pumpd runs that you may see", allow_abbrev=False,
                            description="The jobs the caller may see (own jobs; root sees all).")
    status.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    status.add_argument("--socket", metavar="PATH",
                        help="ask only the pumpd on this socket (default: the system's, yours and your jobs')")
    status.set_defaults(handler=_status)

    tr = sub.add_parser("trace", help="read a trace file (pump-run --trace), or generate one", allow_abbrev=False,
                        description="Read a trace file that pump-run --trace recorded, or generate one.")
    tr_sub = tr.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)
    show = tr_sub.add_parser("show", allow_abbrev=False, help="every record, one line each",
                             description="Every record: pid, milliseconds from the start, kind, what.")
    show.add_argument("file", metavar="FILE")
    show.set_defaults(handler=_trace)
    st = tr_sub.add_parser("stats", allow_abbrev=False, help="totals: records, launches, functions, memory",
                           description="Totals over the trace: records per kind, launches, functions, "
                                       "peak managed bytes, the busiest functions.")
    st.add_argument("--json", action="store_true", help="one JSON document")
    st.add_argument("file", metavar="FILE")
    st.set_defaults(handler=_trace)
    importlib.import_module("pump.timeline_cli").add_export_parser(tr_sub, _trace_export)
    gen = tr_sub.add_parser(
        "generate", allow_abbrev=False, help="a real model's training steps as a trace, without a GPU",
        description="Run MODEL's training steps (AdamW, fp32), or your own model's (--model), on PyTorch's meta "
                    "device, with a model of "
                    "its CUDA caching allocator, and write what a GPU would run as a trace: per kernel "
                    "the byte ranges it reads and writes, its FLOPs and bytes.")
    gen.add_argument("model", metavar="MODEL", choices=tracegen.MODEL_NAMES, nargs="?",
                     help=f"one of {', '.join(tracegen.MODEL_NAMES)}")
    gen.add_argument("--model", dest="user_model", metavar="MODULE:CALLABLE",
                     help="your own model instead: CALLABLE in MODULE (importable, or path/to/file.py) returns "
                          "(model, batch[, optimizer[, loss_fn]]), built under torch.device('meta'); docs/trace.md")
    gen.add_argument("-o", "--output", metavar="FILE", required=True, help="the trace file to write")
    gen.add_argument("--size", choices=tracegen.SIZES,
                     help="the published configuration (full, the default) or a tiny one for tests")
    gen.add_argument("--batch", type=int, metavar="N", help="batch size (default: the model's)")
    gen.add_argument("--seq", type=int, metavar="N", help="sequence length (bert-base, gpt2-medium)")
    gen.add_argument("--steps", type=int, metavar="N", default=3, help="training steps (default 3)")
    gen.add_argument("--last-batch", type=int, metavar="N", help="the last step's smaller batch")
    gen.add_argument("--eval-every", type=int, metavar="K",
                     help="an evaluation forward (no_grad) after every K steps")
    gen.add_argument("--inference", action="store_true",
                     help="forward passes only (eval mode, no_grad, no loss or optimizer), --steps of them: "
                          "a model serving requests, as a forward-only profile holds")
    gen.set_defaults(handler=_trace_generate)
    importlib.import_module("pump.simulate.cli").add_parser(sub, _simulate)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
