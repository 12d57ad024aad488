"""What every stage of scripts/gpu-check shares: the log, running a command under a time limit,
the stage's JSON document, and the environment that points a dry run at fakecuda.

A stage writes two files into the results folder, <stage>.json and <stage>.log (the device tool
brings back at most 8 files from $OUT, so three stages fit in one folder with room to spare)."""

import datetime
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[3]
PYTHON = sys.executable
BIN = pathlib.Path(PYTHON).parent
PROBES = REPO / "bench" / "gpu" / "probes"
FAKE_NVML = pathlib.Path(__file__).resolve().parent / "fakenvml"
RESERVE_S = 10                   # kept back from a stage's budget to write its results


class Log:
    """Everything printed goes to stdout and to the stage's log file."""

    def __init__(self, path):
        self.file = open(path, "w", encoding="utf-8")
        self.lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)
            self.file.write(text + "\n")
            self.file.flush()


class Stage:
    """One stage's run: its results folder, log, deadline, JSON document and "replaces" list.

    fakecuda: the directory of fakecuda's libcuda.so.1 for a dry run (CI), else None."""

    def __init__(self, name: str, out: pathlib.Path, timeout: float, fakecuda=None):
        self.name, self.out, self.timeout, self.fakecuda = name, out, timeout, fakecuda
        out.mkdir(parents=True, exist_ok=True)
        self.log = Log(out / f"{name}.log")
        self.t0 = time.monotonic()
        self.doc = {"stage": name, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    "timeout_s": timeout, "python": PYTHON, "dry_run_on_fakecuda": bool(fakecuda), "parts": {}}

    def left(self) -> float:
        return self.timeout - (time.monotonic() - self.t0) - RESERVE_S

    def env(self, extra=None) -> dict:
        """The environment of every command: on a dry run, fakecuda first on the library path and
        the stand-in NVML (bench/gpu/check/fakenvml, answered by fakecuda) first on sys.path."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.fakecuda:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.fakecuda), env.get("LD_LIBRARY_PATH")]))
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKE_NVML), env.get("PYTHONPATH")]))
        env.update(extra or {})
        return env

    def run(self, argv, timeout: float, env_extra=None, cwd=REPO, keep_output=False) -> dict:
        """Run argv with its output streamed into the log; stop its process group at the timeout.
        Returns {"rc" (None when stopped or not started), "seconds", "output" (its last 60 lines)},
        and with keep_output "all_output", every line."""
        timeout = min(timeout, self.left())
        self.log(f"$ {' '.join(map(str, argv))}")
        if timeout <= 1:
            self.log("  not run: no time left")
            return {"rc": None, "seconds": 0.0, "output": "not run: no time left"}
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=self.env(env_extra), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        except OSError as exc:
            self.log(f"  cannot start it: {exc}")
            return {"rc": None, "seconds": 0.0, "output": f"cannot start {argv[0]}: {exc}"}
        lines = []

        def copy_output():
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                self.log("  " + lines[-1])

        reader = threading.Thread(target=copy_output, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the group this command started, and only it
            proc.wait()
            rc = None
            self.log(f"  STOPPED: over its {timeout:.0f} s")
        reader.join(5)
        seconds = time.monotonic() - t0
        self.log(f"  exit status {rc}, {seconds:.1f} s")
        result = {"rc": rc, "seconds": round(seconds, 2), "output": "\n".join(lines[-60:])}
        return dict(result, all_output=lines) if keep_output else result

    def finish(self, failed: list) -> int:
        """Write <stage>.json; 0 when nothing failed, else 1."""
        self.doc["seconds"] = round(time.monotonic() - self.t0, 1)
        self.doc["failures"] = failed
        self.doc["passed"] = not failed
        (self.out / f"{self.name}.json").write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        for line in failed:
            self.log(f"FAILED {line}")
        self.log(f"gpu-check {self.name}: {'PASSED' if not failed else 'FAILED'}; wrote {self.out}/{self.name}.json "
                 f"and {self.name}.log ({self.doc['seconds']} s)")
        return 1 if failed else 0


def last_json(output: str):
    """The last line of a command's output that is a JSON object, parsed, or None."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None
