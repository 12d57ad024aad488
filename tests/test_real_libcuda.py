"""pump against NVIDIA's real driver library: Debian's non-free libcuda1, bookworm's 535
series (CUDA 12.2, no parameter-info calls) and trixie's 550 series (CUDA 12.4, the first
with them), fetched by scripts/fetch-libcuda into build/libcuda/SUITE. Both load without a
GPU, answer cuGetProcAddress before cuInit, and cuInit answers 100 (no device).

For every hook in shim/hooks/hooks.h and every (symbol, version, flags) lookup the CUDA 12 and
13 runtimes make (traced: each runtime from PyPI is run over tests/c/procaddr_tracer.c),
pump's cuGetProcAddress (both forms) and dlsym must hand back pump's hook of exactly the
pointer the driver returned; each hook and pump's own calls must wrap the driver's
function, never a hook; cuInit's answer must reach the program unchanged; the 535
driver's missing parameter-info calls must be detected. fakecuda's cuGetProcAddress table
is compared with the real answers, so the model cannot drift from the driver.

Where the libraries cannot be had the tests are skipped; under CI (CI set) having
neither fails.  PUMP_REAL_LIBCUDA=DIR checks the libcuda.so.1 in DIR instead (suite "machine"):
scripts/gpu-check's preflight points it at the GPU machine's own driver."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import clean_env
from pump import stats

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBCUDA = ROOT / "build" / "libcuda"
MACHINE = os.environ.get("PUMP_REAL_LIBCUDA")
SUITES = ["machine"] if MACHINE else ["bookworm", "trixie"]
# nvidia/ is a namespace package: its runtimes may lie in more than one site-packages.
NVIDIA_DIRS = ([pathlib.Path(p) for p in __import__("nvidia").__path__]
               if __import__("importlib").util.find_spec("nvidia") else [])
RUNTIMES = {"12": "cuda_runtime/lib/libcudart.so.12", "13": "cu13/lib/libcudart.so.13"}
SYMBOL_NOT_FOUND = 1  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND


def driver_dir(suite):
    return pathlib.Path(MACHINE) if suite == "machine" else LIBCUDA / suite


def driver_label(suite):
    """The Debian package version of a fetched driver, or the machine's driver's folder."""
    version = driver_dir(suite) / "VERSION"
    return version.read_text().strip() if version.exists() else f"the machine's, in {driver_dir(suite)}"


def test_ci_has_a_real_driver():
    """CI fetches the drivers (.ci/run calls scripts/fetch-libcuda): without any, the
    checks below would silently not run."""
    have = [s for s in SUITES if (driver_dir(s) / "libcuda.so.1").exists()]
    if not have:
        if os.environ.get("CI"):
            pytest.fail(f"no real libcuda in {LIBCUDA} (scripts/fetch-libcuda could fetch neither suite)")
        pytest.skip(f"no real libcuda in {LIBCUDA}: run scripts/fetch-libcuda")
    print("real drivers:", {s: driver_label(s) for s in have})


@pytest.fixture(scope="module", params=SUITES)
def suite(request):
    if not (driver_dir(request.param) / "libcuda.so.1").exists():
        pytest.skip(f"{driver_dir(request.param)}/libcuda.so.1 missing: run scripts/fetch-libcuda")
    return request.param


def hooks():
    """(ABI symbol, base name, version, per-thread) of every hook in shim/hooks/hooks.h."""
    text = (ROOT / "shim" / "hooks" / "hooks.h").read_text().replace("\\\n", " ")
    found = []
    for abi, pfn in re.findall(r'X\(\w+,\s*"(cu\w+)",\s*(\w+)\)', text):
        m = re.fullmatch(r"(?:PFN_(cu\w+?)|pump_pfn_\w+?)_v(\d+)(_ptsz)?", pfn)
        assert m, pfn
        base = m.group(1) or re.sub(r"(_v\d+)?(_ptsz)?$", "", abi)
        found.append((abi, base, int(m.group(2)), bool(m.group(3))))
    assert len(found) >= 30, found
    return found


def trace_runtime(c_build, tmp_path, major):
    """The lookups one CUDA runtime makes while it starts (cudaGetDeviceCount), traced
    over fakecuda: they are the runtime's, whatever the driver answers."""
    runtime = next((d / RUNTIMES[major] for d in NVIDIA_DIRS if (d / RUNTIMES[major]).exists()), None)
    if runtime is None:
        pytest.skip(f"the CUDA {major} runtime is not installed (pip install '.[test]')")
    out = tmp_path / f"trace{major}.txt"
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain" / "tracer"),
               PUMP_TRACE_DRIVER=str(c_build / "plain" / "libcuda.so.1"), PUMP_TRACE_OUT=str(out))
    code = "import ctypes, sys; n = ctypes.c_int(); ctypes.CDLL(sys.argv[1]).cudaGetDeviceCount(ctypes.byref(n))"
    proc = subprocess.run([sys.executable, "-c", code, str(runtime)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    # the runtime's first lookup is of "" (an answer of NULL tells it the driver is real)
    lookups = {(s, int(v), int(f)) for s, v, f in (l.rsplit(" ", 2) for l in out.read_text().splitlines()) if s}
    assert len(lookups) > 300, f"the CUDA {major} runtime made only {len(lookups)} lookups"
    print(f"{runtime.name}: {len(lookups)} lookups ({sum(f == 2 for _, _, f in lookups)} per-thread)")
    return lookups


@pytest.fixture(scope="module")
def queries(c_build, tmp_path_factory):
    """Every lookup to check: the runtimes' and, for each hook's family, every version
    either runtime asks for and the hook's own, under each flag."""
    tmp = tmp_path_factory.mktemp("traces")
    asked = trace_runtime(c_build, tmp, "12") | trace_runtime(c_build, tmp, "13")
    versions = {}
    for symbol, version, _ in asked:
        versions.setdefault(symbol, set()).add(version)
    families = set()
    for _, base, version, _ in hooks():
        # and the versions programs built against CUDA 12.0 to 13.0 ask for
        for v in versions.get(base, set()) | {version, 12000, 12020, 12040, 13000}:
            families |= {(base, v, flags) for flags in (0, 1, 2)}
    return sorted(asked | families)


def probe(c_build, driver, queries, *, variant="plain", linked=False, pump=True, env=None, tmp_path=None):
    """Runs tests/c/lookup_probe over one driver directory; returns (process, answers)."""
    name = "lookup_probe_linked" if linked else "lookup_probe"
    full_env = dict(clean_env(), LD_LIBRARY_PATH=str(driver))
    if pump and not linked:
        from pump import shim
        full_env["LD_PRELOAD"] = str(shim.shim_path())
    if tmp_path is not None:
        full_env["PUMP_STATS_DIR"] = str(tmp_path)
    full_env.update(env or {})
    requests = [f"q {s} {v} {f}" for s, v, f in queries] + [f"d {abi}" for abi, *_ in hooks()]
    proc = subprocess.run([str(c_build / variant / name)], input="\n".join(requests) + "\n", env=full_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, [json.loads(l) for l in proc.stdout.splitlines()]


def expected_answer(driver_answer, hook_names):
    """What the program must get under pump: pump's hook of the pointer the driver returned."""
    if driver_answer is not None and driver_answer.startswith("driver:") and driver_answer[7:] in hook_names:
        return "pump:" + driver_answer[7:]
    return driver_answer


def check_answers(answers, hook_names):
    failures = []
    checked_hooks = 0
    for a in answers:
        if "q" in a:
            want = expected_answer(a["driver"], hook_names)
            if (a["rc_v2"], a["status_v2"], a["program_v2"]) != (a["rc"], a["status"], want):
                failures.append(f"cuGetProcAddress_v2{tuple(a['q'])}: driver {a['driver']}, program got "
                                f"{a['program_v2']} (want {want})")
            if a["rc_v1"] == 0 and a["program_v1"] != want:
                failures.append(f"cuGetProcAddress{tuple(a['q'])}: program got {a['program_v1']} (want {want})")
            checked_hooks += want != a["driver"]
        elif "d" in a:
            want = "pump:" + a["d"] if a["driver"] is not None else None
            if a["program"] != want:
                failures.append(f"dlsym(libcuda, {a['d']}): {a['program']} (want {want})")
            if a["default"] is not None:
                failures.append(f"dlsym(RTLD_DEFAULT, {a['d']}) with libcuda loaded locally: {a['default']}")
        elif "hook" in a:
            if a["wraps"] != ("driver:" + a["hook"] if a["driver_has"] else None):
                failures.append(f"pump's {a['hook']} wraps {a['wraps']}")
        elif "own" in a:
            if a["is"] is not None and not a["is"].startswith("driver:"):
                failures.append(f"pump's own {a['own']} is {a['is']}")
    return failures, checked_hooks


def annotate(answers):
    """Gives each hook line whether the driver exports that name (from the dlsym lines)."""
    exported = {a["d"]: a["driver"] is not None for a in answers if "d" in a}
    for a in answers:
        if "hook" in a:
            a["driver_has"] = exported[a["hook"]]
    return answers


def test_lookups_hand_back_pumps_hook_of_the_drivers_pointer(c_build, suite, queries, tmp_path):
    hook_names = {abi for abi, *_ in hooks()}
    proc, answers = probe(c_build, driver_dir(suite), queries, env={"PUMP_LOG": "1"}, tmp_path=tmp_path)
    version = answers[0]["driver_version"]
    print(f"{suite}: libcuda1 {driver_label(suite)}, "
          f"cuDriverGetVersion {version}, {len(queries)} lookups")
    failures, substituted = check_answers(answers, hook_names)
    print(f"{suite}: {substituted} of them answered with one of pump's hooks")
    assert failures == [], "\n".join(failures[:40])
    assert substituted > 50, substituted  # the check compared hooks, not only pass-through answers
    # Without pump the program gets the driver's answers (the probe's own sanity).
    _, bare = probe(c_build, driver_dir(suite), queries, pump=False)
    assert [a.get("driver") for a in bare if "q" in a] == [a["driver"] for a in answers if "q" in a]
    assert all(a["program_v2"] == a["driver"] for a in bare if "q" in a)


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_each_hook_and_pumps_own_calls_wrap_the_driver(c_build, suite, queries, variant):
    env = {"ASAN_OPTIONS": "detect_leaks=0", "TSAN_OPTIONS": "halt_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    proc, answers = probe(c_build, driver_dir(suite), queries, variant=variant, linked=True, env=env)
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr[-4000:]
    answers = annotate(answers)
    failures, _ = check_answers(answers, {abi for abi, *_ in hooks()})
    assert failures == [], "\n".join(failures[:40])
    wraps = {a["hook"]: a["wraps"] for a in answers if "hook" in a}
    assert sorted(wraps) == sorted(abi for abi, *_ in hooks())  # the list parsed is the shim's
    assert wraps["cuLaunchKernel_ptsz"] == "driver:cuLaunchKernel_ptsz"
    own = {a["own"]: a["is"] for a in answers if "own" in a}
    assert own["mem_get_info"] == "driver:cuMemGetInfo_v2"
    assert own["prefetch_v2"] == "driver:cuMemPrefetchAsync_v2"
    # CUDA 12.4 brought the parameter-info calls; the 535 driver (12.2) lacks them.
    has_param_info = answers[0]["driver_version"] >= 12040
    assert own["func_param_info"] == ("driver:cuFuncGetParamInfo" if has_param_info else None)
    assert own["kernel_param_info"] == ("driver:cuKernelGetParamInfo" if has_param_info else None)


def test_missing_parameter_info_is_detected(c_build, suite, tmp_path):
    proc, answers = probe(c_build, driver_dir(suite), [], env={"PUMP_LOG": "1"}, tmp_path=tmp_path)
    (loaded,) = [l for l in proc.stderr.splitlines() if "driver loaded" in l]
    with_layouts = answers[0]["driver_version"] >= 12040
    assert ("with parameter layouts" if with_layouts else "without parameter layouts") in loaded, loaded


def test_no_device_reaches_the_program_unchanged(c_build, suite, tmp_path):
    """cuInit answers 100 (CUDA_ERROR_NO_DEVICE); every hooked call after it answers what
    the driver answers, and pump does nothing of its own."""
    if suite == "machine":
        pytest.skip("the machine's driver has a device: cuInit succeeds there")
    _, bare = probe(c_build, driver_dir(suite), [], pump=False)
    proc, under = probe(c_build, driver_dir(suite), [], tmp_path=tmp_path)
    assert bare[-1]["aside"]["cuInit"] == 100, bare[-1]
    assert under[-1] == bare[-1]
    assert proc.stderr == ""
    totals = stats.aggregate(stats.read_dir(tmp_path))
    assert totals.get("prefetch_calls", 0) == 0 and totals.get("managed_allocs", 0) == 0
    assert totals.get("errors", 0) == 0


def test_fakecuda_answers_lookups_as_the_real_driver(c_build, suite, queries):
    """fakecuda, told the real driver's version, must pick the same ABI variant for every
    lookup of a name it models (and answer NULL exactly where the driver does)."""
    _, real = probe(c_build, driver_dir(suite), queries, pump=False)
    version = real[0]["driver_version"]
    _, fake = probe(c_build, c_build / "plain", queries, pump=False, env={"FAKECUDA_DRIVER_VERSION": str(version)})
    compared, differ = 0, []
    for r, f in zip((a for a in real if "q" in a), (a for a in fake if "q" in a)):
        assert r["q"] == f["q"]
        if f["status"] == SYMBOL_NOT_FOUND:
            continue  # a name fakecuda does not model
        compared += 1
        if f["driver"] != r["driver"]:
            differ.append(f"{tuple(r['q'])}: driver {version} gives {r['driver']} (status {r['status']}), "
                          f"fakecuda {f['driver']} (status {f['status']})")
    print(f"{suite}: {compared} lookups compared with fakecuda")
    assert compared > 150, compared
    assert differ == [], f"{len(differ)} lookups differ:\n" + "\n".join(differ)
