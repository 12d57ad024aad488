"""CUPTI's Unified Memory counters for the GPU suite: builds bench/cupti/um_counters.c (an
injection library) against the CUPTI the machine has, gives the environment that loads it into
a run, and reads what it wrote.  Counter runs are separate from timed runs: CUPTI's records
perturb timing."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
SOURCE = REPO / "bench" / "cupti" / "um_counters.c"


class Unavailable(Exception):
    """No CUPTI to build against, or the build failed; str() says which and where it looked."""


def _roots():
    """Where CUPTI may live: the toolkit (CUDA_HOME, /usr/local/cuda) and pip's nvidia-cuda-cupti."""
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    roots = [pathlib.Path(r) for r in roots if r]
    dirs = []
    for r in roots:
        dirs += [(r / "extras" / "CUPTI" / "include", r / "extras" / "CUPTI" / "lib64"),
                 (r / "include", r / "lib64"), (r / "include", r / "lib"),
                 (r / "targets" / "x86_64-linux" / "include", r / "targets" / "x86_64-linux" / "lib")]
    for entry in sys.path:
        base = pathlib.Path(entry or ".") / "nvidia"
        for sub in ("cu13", "cuda_cupti"):
            dirs.append((base / sub / "include", base / sub / "lib"))
    return dirs, roots


def find():
    """(CUPTI include dir, its library dir, CUDA include dirs): the first place with cupti.h and
    libcupti.so*; cupti.h needs cuda.h and crt/host_defines.h, from the toolkit's include dir."""
    dirs, roots = _roots()
    looked = []
    for inc, lib in dirs:
        looked.append(str(inc))
        if (inc / "cupti.h").is_file() and lib.is_dir() and any(lib.glob("libcupti.so*")):
            extra = [str(r / "include") for r in roots if (r / "include" / "crt" / "host_defines.h").is_file()]
            return str(inc), str(lib), [d for d in extra if d != str(inc)]
    raise Unavailable("no CUPTI (cupti.h beside a libcupti.so) in " + ", ".join(dict.fromkeys(looked)))


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise Unavailable("no C compiler (cc or gcc) to build bench/cupti/um_counters.c")
    return cc


def command(cc, inc, extra, lib, libcupti, out) -> list:
    """The compiler command that builds um_counters.c into out against libcupti (a file name) in
    lib: C11, every warning an error."""
    return [cc, "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
            f"-I{inc}", *(f"-I{d}" for d in extra), str(SOURCE), "-o", str(out), f"-L{lib}", f"-l:{libcupti}",
            f"-Wl,-rpath,{lib}", "-lpthread"]


def build(out_dir) -> str:
    """Compile the injection library into out_dir; return its path (raises Unavailable)."""
    inc, lib, extra = find()
    cc = compiler()
    libcupti = sorted(pathlib.Path(lib).glob("libcupti.so*"))[0].name
    out = pathlib.Path(out_dir) / "libum_counters.so"
    cmd = command(cc, inc, extra, lib, libcupti, out)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Unavailable(f"building {SOURCE.name} failed ({' '.join(cmd)}):\n{proc.stderr.strip()}")
    return str(out)


def env(library: str, report: str) -> dict:
    """The variables that load the library into a run and name its report file."""
    return {"CUDA_INJECTION64_PATH": library, "PUMP_BENCH_CUPTI_OUT": report}


REFUSED = "CUPTI refused the Unified Memory counters"


def read(report: str) -> dict:
    """The report um_counters wrote, or {"error": why} when there is none or CUPTI refused; a
    report with an "error" has no counters to show (its zeros were never counted)."""
    try:
        doc = json.loads(pathlib.Path(report).read_text())
    except FileNotFoundError:
        return {"error": "no CUPTI report: the process did not reach its exit handler, or the driver "
                         "did not load the injection library"}
    except ValueError as exc:
        return {"error": f"unreadable CUPTI report {report}: {exc}"}
    if doc.get("enable") != "CUPTI_SUCCESS":
        tries = doc.get("enable_tries")
        first = (doc.get("enable_log") or [{}])[0]
        where = (f" ({tries} tries; the first, at {first.get('at')}: {first.get('result')}; "
                 f"subscribing for the retries: {doc.get('subscribe')}, their callbacks: {doc.get('retry_callbacks')})"
                 if tries else "")
        doc["error"] = f"{REFUSED}: {doc.get('enable')}{where}"
    return doc


def refused(doc) -> bool:
    """Whether a read() report says CUPTI was there but refused the counters."""
    return str((doc or {}).get("error", "")).startswith(REFUSED)
