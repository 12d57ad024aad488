"""scripts/gpu-check's three stages, each one `run` call of the device tool, well under its
10 minutes: preflight (the software, pump's build, the real-driver identity test and the
single-purpose probes), tests (the `gpu`-marked tests) and benchmarks (the suite, and
compute-sanitizer on one pump run).  docs/gpu-check.md lists what each records."""

import json
import os
import pathlib
import re
import subprocess
import tempfile

import replaces
import sanitizer
from common import BIN, PROBES, PYTHON, REPO, last_json

RUNTIME_WHEELS = {"cffi": "cffi", "pycparser": "pycparser", "prometheus_client": "prometheus_client",
                  "nvidia.cuda_runtime": "nvidia_cuda_runtime_cu12"}   # module: wheel name
WHEEL_HELP = "scripts/make-wheels (on a machine with a registry), and carry .whl"


# ---------------------------------------------------------------- the build
def missing_modules(stage, names) -> list:
    code = ("import importlib.util, sys\nfor n in sys.argv[1:]:\n    try:\n        found = importlib.util.find_spec(n)\n"
            "    except ImportError:\n        found = None\n    if found is None:\n        print(n)")
    probe = subprocess.run([PYTHON, "-c", code, *names], capture_output=True, text=True, cwd="/", env=stage.env())
    return probe.stdout.split()


def install_wheels(stage, wheel_dir: pathlib.Path) -> dict:
    """What pump needs that the machine lacks, from the carried wheels, with pip's index off."""
    missing = missing_modules(stage, RUNTIME_WHEELS)
    if not missing:
        return {"rc": 0, "seconds": 0.0, "output": "every runtime need already importable"}
    wheels = [w for m in missing for w in sorted(wheel_dir.glob(f"{RUNTIME_WHEELS[m]}-*.whl"))[-1:]]
    lacking = [m for m in missing if not any(w.name.startswith(RUNTIME_WHEELS[m] + "-") for w in wheels)]
    if lacking:
        text = (f"not importable here and no wheel in {wheel_dir}: {', '.join(lacking)}. "
                f"The GPU machine has no registry: make the wheels with {WHEEL_HELP}")
        stage.log(text)
        return {"rc": 1, "seconds": 0.0, "output": text}
    return stage.run([PYTHON, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir", *wheels], 60,
                     {"PIP_NO_INDEX": "1"})


def install_pump(stage) -> dict:
    cmd = [PYTHON, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q", "."]
    headers = subprocess.run([PYTHON, str(REPO / "scripts" / "find-cuda-headers")], capture_output=True, text=True)
    toolkit = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    if headers.returncode != 0 and (toolkit / "cudaTypedefs.h").is_file():
        stage.log(f"CUDA headers: not from nvidia-cuda-runtime; using the toolkit's {toolkit}")
        cmd.insert(-1, f"--config-settings=cmake.define.PUMP_CUDA_INCLUDE_DIR={toolkit}")
    return stage.run(cmd, 240, {"PIP_NO_INDEX": "1"})


def ensure_pump(stage, args) -> list:
    """Installs the wheels and pump where this machine lacks them (a machine given back after
    preflight comes back bare); [] when pump is importable, else the failure."""
    if not missing_modules(stage, ["pump"]):
        return []
    stage.log("pump is not installed here (a fresh machine): installing it first")
    parts = stage.doc["parts"]
    parts["runtime_wheels"] = install_wheels(stage, pathlib.Path(args.wheels))
    if parts["runtime_wheels"]["rc"] != 0:
        return ["runtime wheels: " + parts["runtime_wheels"]["output"][-300:]]
    parts["install"] = install_pump(stage)
    return [] if parts["install"]["rc"] == 0 else ["pump's install failed"]


def pytest_argv() -> list:
    # The installed console script (or python -P), so that tests import the installed pump; in one
    # process: the GPU machine has pytest but not pytest-xdist, which pyproject's `-n auto` needs.
    run = [BIN / "pytest"] if (BIN / "pytest").exists() else [PYTHON, "-P", "-m", "pytest"]
    return [*run, "-o", "addopts="]


def pytest_summary(output: str) -> str:
    """pytest's last summary line ('3 passed, 1 skipped in 9.1s'), or ''."""
    found = [l for l in output.splitlines() if re.search(r"\b(passed|failed|skipped|error|deselected)\b", l)]
    return found[-1].strip(" =") if found else ""


def machine_driver_dir(stage) -> str:
    """The directory of the libcuda.so.1 programs load here (fakecuda's on a dry run)."""
    if stage.fakecuda:
        return str(stage.fakecuda)
    code = ("import ctypes, os\nctypes.CDLL('libcuda.so.1')\nfor l in open('/proc/self/maps'):\n"
            "    if 'libcuda.so' in l:\n        print(os.path.dirname(os.path.realpath(l.split()[-1]))); break")
    return subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=stage.env()).stdout.strip()


# ---------------------------------------------------------------- stages
def preflight(stage, args) -> list:
    parts, failed = stage.doc["parts"], []
    probes = stage.doc["probes"] = {}
    work = pathlib.Path(tempfile.mkdtemp(prefix="pump-gpu-check-"))

    def run_probe(name, argv, timeout=90, env_extra=None):
        r = stage.run([PYTHON, *map(str, argv)], timeout, env_extra)
        r["result"] = last_json(r["output"]) or {}
        r.pop("output") if r["result"] else None
        probes[name] = r
        if r["rc"] == 3:
            stage.log(f"probe {name}: refused before allocating (not a failure): {r['result'].get('refused_for_memory')}")
        elif r["rc"] != 0:
            failed.append(f"probe {name}: exit status {r['rc']}")
        return r

    run_probe("software", [PROBES / "software.py"])
    gvisor = probes["software"]["result"].get("gvisor", {}).get("detected")
    stage.doc["gvisor"] = gvisor
    if gvisor:
        stage.log("gVisor detected: managed memory and cuMemAdvise may be refused (issue 27 risk 6); "
                  "refusals below are findings")
    parts["runtime_wheels"] = install_wheels(stage, pathlib.Path(args.wheels))
    if parts["runtime_wheels"]["rc"] != 0:
        return failed + ["runtime wheels: " + parts["runtime_wheels"]["output"][-300:]]
    parts["install"] = install_pump(stage)
    if parts["install"]["rc"] != 0:
        return failed + ["pump's install failed"]
    driver = machine_driver_dir(stage)
    stage.doc["libcuda_dir"] = driver
    # The dry run leaves out the ASan and TSan builds' runs (CI's own pytest runs them against the
    # real 535 and 550 drivers): they are most of the test's time on 2 cores.
    quick = ["-k", "not asan and not tsan"] if stage.fakecuda else []
    r = parts["real_libcuda"] = stage.run([*pytest_argv(), "tests/test_real_libcuda.py", "-q", "-rs", "-p",
                                           "no:cacheprovider", *quick], 240, {"PUMP_REAL_LIBCUDA": driver})
    r["summary"] = pytest_summary(r["output"])
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped)", r["summary"])}
    # One skip is expected (no-device test: the machine has one); more means a driver or a
    # runtime was missing and the lookups went unchecked, which must not pass quietly.
    if r["rc"] != 0 or not counts.get("passed") or counts.get("skipped", 0) > 1:
        failed.append(f"tests/test_real_libcuda.py against {driver}/libcuda.so.1: {r['summary'] or r['rc']}")
    run_probe("managed", [PROBES / "managed.py"])
    run_probe("prefetch_cost", [PROBES / "prefetch_cost.py"])
    run_probe("host_calls", [PROBES / "host_calls.py", "--work", work / "host_calls"], 120)
    run_probe("prefetch_bandwidth", [REPO / "bench" / "gpu" / "prefetch_bw.py", "--mib", str(args.bandwidth_mib)])
    run_probe("driver_evict", [PROBES / "driver_evict.py"], 120)
    run_probe("concurrent_moves", [PROBES / "concurrent_moves.py"], 120)
    run_probe("host_writes", [PROBES / "host_writes.py"], 120)
    run_probe("discard_order", [PROBES / "discard_order.py",
                                *(["--mib", "4", "--busy", "2", "--rounds", "1"] if stage.fakecuda else [])], 120)
    run_probe("discard_writes", [PROBES / "discard_writes.py", *(["--mib", "2", "--rounds", "1"] if stage.fakecuda else [])],
              60)
    run_probe("discard_late", [PROBES / "discard_late.py",
                               *(["--mib", "2", "--busy", "2", "--rounds", "1"] if stage.fakecuda else [])], 90)
    run_probe("launch_kinds", [PROBES / "launch_kinds.py"])
    kinds_program = ([] if stage.fakecuda else
                     ["--", PYTHON, REPO / "examples" / "train_gpt.py", "--device", "cuda", "--steps", "2", "--json"])
    run_probe("handle_kind", [PROBES / "handle_kind.py", "--work", work / "handle_kind",
                              *(kinds_program or ["--", PYTHON, PROBES / "launch_kinds.py"])], 180)
    run_probe("uvm_counters", [PROBES / "uvm_counters.py", "--work", work / "cupti"], 90)
    # On the dry run torch is a CPU build (issue 26's CUDA-build tier has not landed): the job runs
    # on the CPU under pump-run, which checks the probe and pump-run's start, not PyTorch on CUDA.
    run_probe("torch_job", [PROBES / "torch_job.py", *(["--device", "cpu", "--steps", "2"] if stage.fakecuda
                                                       else ["--device", "cuda"])], 240)
    stage.doc["replaces"] = replaces.lines(probes)
    replaces.say(stage.log, stage.doc["replaces"])
    return failed


def gpu_test_files() -> list:
    """The test files with `gpu`-marked tests: only they are collected, since others import what
    the GPU machine lacks (hypothesis, found by the dry run)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")
                  if re.search(r"mark\.gpu\b|\bneeds_gpu\b", p.read_text()))


def tests(stage, args) -> list:
    failed = ensure_pump(stage, args)
    if failed:
        return failed
    files = stage.doc["test_files"] = gpu_test_files()
    r = stage.doc["parts"]["pytest_gpu"] = stage.run(
        [*pytest_argv(), "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", *files], 480)
    r["summary"] = pytest_summary(r["output"])
    selected = re.search(r"(\d+) (passed|skipped|failed)", r["summary"])
    if r["rc"] != 0:
        return [f"pytest -m gpu: {r['summary'] or 'exit status ' + str(r['rc'])}"]
    return [] if selected else [f"pytest -m gpu selected no test: {r['summary']}"]


EVIDENCE = "benchmarks-evidence.tar.gz"  # a third file of the stage's, beside its JSON and log
EVIDENCE_MAX = 24 << 20                   # compressed bytes: well within what a call brings back
EVIDENCE_KINDS = (".trace", ".json", ".log", ".txt", ".csv")  # not the CUPTI library built there


def keep_evidence(work: pathlib.Path, out: pathlib.Path) -> dict:
    """What the suite left in its work folder that the simulator needs to replay the run (the
    traced variants' pump traces, the suite's JSON, CUPTI's reports), compressed into one file
    of the stage's, at most EVIDENCE_MAX; a file past it is named in "left_out", not kept."""
    import tarfile
    import zlib
    kept, left_out, room = [], [], EVIDENCE_MAX - 4096   # the archive's own headers and ends
    path = out / EVIDENCE
    with tarfile.open(path, "w:gz", compresslevel=6) as tar:
        for f in sorted(p for p in work.rglob("*") if p.is_file() and p.suffix in EVIDENCE_KINDS):
            size = len(zlib.compress(f.read_bytes(), 1)) + 1024   # at most this, compressed more
            if size > room:
                left_out.append(f"{f.relative_to(work)} ({f.stat().st_size} bytes)")
                continue
            room -= size
            tar.add(f, arcname=str(f.relative_to(work)))
            kept.append(str(f.relative_to(work)))
    return {"file": EVIDENCE, "bytes": path.stat().st_size, "kept": kept, "left_out": left_out}


def benchmarks(stage, args) -> list:
    parts, failed = stage.doc["parts"], ensure_pump(stage, args)
    if failed:
        return failed
    work = pathlib.Path(tempfile.mkdtemp(prefix="pump-gpu-bench-"))
    suite_json = work / "suite.json"
    budget = max(30, int(stage.left() - args.sanitizer_s - 40))
    r = parts["suite"] = stage.run([PYTHON, REPO / "bench" / "gpu" / "suite.py", "--json", suite_json, "--scale",
                                    args.scale, "--cases", args.cases, "--work", work, "--budget-seconds", budget,
                                    *(["--variants", args.variants] if args.variants else []),
                                    *(["--quick"] if stage.fakecuda else [])], budget + 30)
    if not suite_json.exists():
        return [f"bench/gpu/suite.py wrote no results (exit status {r['rc']})"]
    suite = json.loads(suite_json.read_text())
    parts["evidence"] = evidence = keep_evidence(work, stage.out)
    stage.log(f"evidence: {len(evidence['kept'])} files in {EVIDENCE} ({evidence['bytes']} bytes)"
              + (f"; left out: {', '.join(evidence['left_out'])}" if evidence["left_out"] else ""))
    if not any(name.endswith(".trace") for name in evidence["kept"]):
        failed.append(f"{EVIDENCE} holds no pump trace: the simulator cannot replay this run")
    stage.doc["device"], stage.doc["versions"] = suite.pop("device", None), suite.pop("versions", None)
    stage.doc["suite"] = suite
    if r["rc"] not in (0, 1) or (r["rc"] == 1 and not stage.fakecuda):
        failed.append(f"bench/gpu/suite.py: exit status {r['rc']}")
    elif r["rc"] == 1:
        # On fakecuda the ideal chain cannot run (no pinned memory or explicit copies): that alone is expected.
        other = [f for f in stage.doc.get("suite", {}).get("failures", []) if not re.match(r"case [ab], ideal:", f)]
        failed += [f"suite: {f}" for f in other]
    tool = sanitizer.tool()
    driver = stage.doc.get("device") or {}
    major, _, minor = str(driver.get("cuda_driver_version", "0.0")).partition(".")
    driver_version = int(major) * 1000 + int(minor or 0) * 10
    job = [PYTHON, REPO / "examples" / "managed_saxpy.py", "--steps", "4"]
    for check in ("memcheck", "racecheck"):
        if tool is None or stage.fakecuda or args.sanitizer_s <= 0:
            parts[f"sanitizer_{check}"] = {"rc": None, "output": "compute-sanitizer is not here" if tool is None
                                           else "not run on fakecuda (compute-sanitizer needs a real GPU)"
                                           if stage.fakecuda else "not run: --sanitizer-s 0"}
            stage.log(f"compute-sanitizer {check}: {parts[f'sanitizer_{check}']['output']}")
            continue
        pump_run = BIN / "pump-run"
        parts[f"sanitizer_{check}"] = s = stage.run([tool, "--tool", check, "--target-processes", "all",
                                                     "--error-exitcode", "9", pump_run, "--", *job],
                                                    args.sanitizer_s / 2, keep_output=True)
        s.update(sanitizer.judge(s.pop("all_output", []), driver_version))
        if s["rc"] not in (0, 9) or s["errors"] is None:
            failed.append(f"compute-sanitizer {check} did not finish (exit status {s['rc']})")
        elif s["unexpected"]:
            failed.append(f"compute-sanitizer {check} found errors in a pump run: " + "; ".join(s["unexpected"][:3]))
        elif s["expected"]:
            stage.log(f"compute-sanitizer {check}: {s['expected']} expected API error(s): pump's parameter-end "
                      f"probes on a driver without cuFuncGetParamCount (bench/gpu/check/sanitizer.py)")
    return failed


STAGES = {"preflight": preflight, "tests": tests, "benchmarks": benchmarks}
