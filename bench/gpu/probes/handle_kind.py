#!/usr/bin/env python3
"""Which handle kind a program's launches carry (a CUkernel from cuLibraryGetKernel, or a
CUfunction from cuModuleGetFunction / cuKernelGetFunction) and what cuFuncGetParamInfo and
cuKernelGetParamInfo answer on each: issue 27 risk 3, on real PyTorch kernels.

    python bench/gpu/probes/handle_kind.py [--work DIR] [-- PROGRAM ARGS...]

Finds the driver the program would load, builds handle_kind.c (beside this file) as
libcuda.so.1 in --work, linked against that driver's full path so that every symbol the wrapper
does not define is the driver's own, checks that each of the driver's exports resolves through
the wrapper (a stand-in that lacks one fails the program: PyTorch dlsyms
cuDevicePrimaryCtxGetState), and runs the program (default: examples/train_gpt.py, 2 steps on
the GPU, whose AdamW runs PyTorch's multi_tensor_apply kernels) with the wrapper first on the
library path.  Prints one JSON line: the exports checked, launches per origin, per origin how
many described handles each call answered, the handles where cuFuncGetParamInfo accepted a
CUkernel (undefined by cuda.h) or the two calls' layouts differ, and the multi_tensor_apply
kernels' parameters."""

import argparse
import ctypes
import json
import mmap
import os
import pathlib
import struct
import subprocess
import sys
import tempfile

import probe

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULT_PROGRAM = [sys.executable, str(REPO / "examples" / "train_gpt.py"), "--device", "cuda", "--steps", "2",
                   "--json"]


def loaded_driver() -> str:
    """The path of the libcuda.so.1 this process loads (the one a program would)."""
    ctypes.CDLL("libcuda.so.1")
    for line in pathlib.Path("/proc/self/maps").read_text().splitlines():
        if line.endswith("libcuda.so.1") or "/libcuda.so" in line:
            return os.path.realpath(line.split(None, 5)[-1])
    raise RuntimeError("libcuda.so.1 loaded but not found in /proc/self/maps")


# The calls handle_kind.c defines itself (wrappers); every other export is the driver's.
WRAPPED = ("cuGetProcAddress", "cuGetProcAddress_v2", "cuDriverGetVersion", "cuLibraryGetKernel",
           "cuModuleGetFunction", "cuKernelGetFunction", "cuLaunchKernel", "cuLaunchKernel_ptsz",
           "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz")
# Symbols a linker may define in any shared library (older GNU ld exports them all).
LINKER_MADE = ("_init", "_fini", "_edata", "_end", "__bss_start", "_DYNAMIC", "_GLOBAL_OFFSET_TABLE_")


def exported_symbols(path) -> list:
    """The names a shared library defines for others (what `nm -D --defined-only` lists, less
    version names): global, weak or unique symbols of its .dynsym with a section, default or
    protected visibility.  ELF64 little-endian (x86-64, aarch64)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        names = set()
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind != 11:  # SHT_DYNSYM
                continue
            strtab = sections[link][4]
            for at in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
                name, info, other, shndx = struct.unpack_from("<IBBH", elf, at)
                if shndx == 0 or info >> 4 not in (1, 2, 10) or other & 3 not in (0, 3):
                    continue  # undefined, local, hidden or internal
                if shndx == 0xFFF1 and struct.unpack_from("<Q", elf, at + 8)[0] == 0:
                    continue  # a version's name (SHN_ABS, value 0), not a symbol
                end = elf.find(b"\0", strtab + name)
                names.add(elf[strtab + name:end].decode())
        return sorted(names)


def build(work: pathlib.Path, driver: str) -> pathlib.Path:
    """handle_kind.c as work/libcuda.so.1, with a DT_NEEDED entry naming the driver's full path
    (an empty library whose soname is that path stands in for it at link time: linking the
    driver itself would record its soname, libcuda.so.1, which the wrapper itself answers)."""
    link = work / "link"   # not on the library path: only the linker reads it
    link.mkdir(parents=True, exist_ok=True)
    stub = link / "libhandle_kind_driver.so"
    subprocess.run([probe.cc(), "-shared", "-fPIC", "-x", "c", os.devnull, f"-Wl,-soname,{driver}", "-o", str(stub)],
                   check=True)
    out = work / "libcuda.so.1"
    probe.compile_c("-shared", "-fPIC", "-fvisibility=hidden", HERE / "handle_kind.c", "-Wl,-soname,libcuda.so.1",
                    "-o", out, "-Wl,--no-as-needed", stub, "-ldl", "-lpthread")
    return out


# Run in the program's environment: which file answers each name, dlsym'd on the handle of
# dlopen("libcuda.so.1") as PyTorch's DriverAPI does.
_RESOLVE = r"""
import ctypes, json, sys
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]
try:
    dladdr = ctypes.CDLL(None).dladdr
except AttributeError:  # glibc before 2.34: in libdl
    dladdr = ctypes.CDLL("libdl.so.2").dladdr
dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
lib = ctypes.CDLL("libcuda.so.1")
where = {}
for name in json.load(sys.stdin):
    try:
        address = ctypes.cast(lib[name], ctypes.c_void_p).value
    except AttributeError:
        where[name] = None
        continue
    info = DlInfo()
    where[name] = info.fname.decode() if dladdr(address, ctypes.byref(info)) and info.fname else "?"
json.dump(where, sys.stdout)
"""


def resolve(names, env: dict) -> dict:
    """{name: the file that defines it as seen through libcuda.so.1 in env, or None}; raises
    RuntimeError when libcuda.so.1 does not load there."""
    proc = subprocess.run([sys.executable, "-c", _RESOLVE], input=json.dumps(list(names)), env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"libcuda.so.1 through the wrapper: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)


def forwarding(wrapper: pathlib.Path, driver: str, env: dict) -> dict:
    """Whether the wrapper, loaded as libcuda.so.1 in env, answers every export of the driver:
    the names the wrapper defines (the wrapped calls; an old linker's _init, _end and the like)
    with its own, every other name with the driver's.  Lists the first 20 names missing, answered
    by another library, or taken over by the wrapper beyond WRAPPED, with their counts."""
    names = exported_symbols(driver)
    where = resolve(names, env)
    defined = set(exported_symbols(wrapper))
    own, real = os.path.realpath(wrapper), os.path.realpath(driver)
    missing = [n for n in names if where.get(n) is None]
    wrong = [n for n in names if where.get(n) is not None
             and os.path.realpath(where[n]) != (own if n in defined else real)]
    taken = [n for n in names if n in defined and n not in WRAPPED and n not in LINKER_MADE]
    return {"driver_exports": len(names), "wrapped": [n for n in WRAPPED if n in names and n in defined],
            "missing_count": len(missing), "missing": missing[:20], "elsewhere_count": len(wrong),
            "elsewhere": [[n, where[n]] for n in wrong[:20]], "taken_over": taken[:20]}


def summarize(report: dict) -> dict:
    """The figures that answer risk 3, from the wrapper's report."""
    by_origin = {}
    accepted_cast, differ, multi_tensor = [], [], []
    for d in report["described"]:
        o = by_origin.setdefault(d["origin"], {"described": 0, "cuFuncGetParamInfo_ok": 0,
                                               "cuKernelGetParamInfo_ok": 0})
        o["described"] += 1
        func, kern = d["cuFuncGetParamInfo"], d.get("cuKernelGetParamInfo")
        o["cuFuncGetParamInfo_ok"] += func["first_result"] == 0
        o["cuKernelGetParamInfo_ok"] += bool(kern) and kern["first_result"] == 0
        if d["origin"] == "cuLibraryGetKernel" and func["first_result"] == 0:
            accepted_cast.append(d["name"])
            if kern and kern["params"] != func["params"]:
                differ.append(d["name"])
        if "multi_tensor_apply" in d["name"]:
            layout = kern if kern and kern["first_result"] == 0 else func
            multi_tensor.append({"name": d["name"][:120], "origin": d["origin"], "params": layout["params"],
                                 "largest_param_bytes": max((s for _, s in layout["params"]), default=0)})
    return {"launches_by_origin": report["launches_by_origin"], "made": report["made"], "by_origin": by_origin,
            "cuFuncGetParamInfo_accepted_a_CUkernel": accepted_cast[:20],
            "layouts_differ_between_the_calls": differ[:20], "multi_tensor_apply": multi_tensor[:8]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="handle_kind.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", help="where the wrapper is built (default a temporary folder)")
    ap.add_argument("program", nargs="*", help="the program to watch (default train_gpt.py, 2 steps on the GPU)")
    args = ap.parse_args(argv)
    try:  # the program's own check comes later; train_gpt.py's tiny preset peaks far below 1 GiB
        probe.membudget.check("handle_kind's program", probe.membudget.GiB, *probe.membudget.nvml_memory(0))
    except (probe.membudget.Refused, RuntimeError) as exc:
        probe.emit({"probe": "handle_kind", "refused_for_memory": str(exc)})
        return 3
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="pump-handle-kind-"))
    work.mkdir(parents=True, exist_ok=True)
    driver = loaded_driver()
    wrapper = build(work, driver)
    report_path = work / "handle_kind.json"
    env = dict(os.environ, HANDLE_PROBE_DRIVER=driver,
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(wrapper.parent), os.environ.get("LD_LIBRARY_PATH")])))
    doc = {"probe": "handle_kind", "driver": driver}
    # Every export of the driver must resolve through the wrapper before the program may run:
    # one the wrapper lacks fails the program, which measures nothing (the first H100 run).
    try:
        check = doc["forwarding"] = forwarding(wrapper, driver, env)
    except (OSError, ValueError, RuntimeError, subprocess.TimeoutExpired) as exc:
        check = {"error": str(exc)}
    if "error" in check or check["missing_count"] or check["elsewhere_count"] or check["taken_over"]:
        doc["finding"] = f"the wrapper does not stand in for {driver}: " + (
            check["error"] if "error" in check else
            f"{check['missing_count']} of its {check['driver_exports']} exports missing, "
            f"{check['elsewhere_count']} answered by another library, {len(check['taken_over'])} taken over")
        probe.emit(doc)
        return 1
    env["HANDLE_PROBE_OUT"] = str(report_path)
    proc = subprocess.run(args.program or DEFAULT_PROGRAM, env=env, capture_output=True, text=True, timeout=300)
    doc["program_rc"] = proc.returncode
    if proc.returncode != 0:
        doc["program_stderr"] = proc.stderr.strip().splitlines()[-5:]
    try:
        summary = summarize(json.loads(report_path.read_text()))
        # A failed program's figures are kept apart: not a measurement (the first H100 run's
        # zeros, from a program that never started CUDA, were read as one).
        if proc.returncode == 0:
            doc.update(summary)
        else:
            doc["partial"] = summary
    except (OSError, ValueError) as exc:
        doc["finding"] = f"no report from the wrapper: {exc}"
    probe.emit(doc)
    return 0 if proc.returncode == 0 and "finding" not in doc else 1


if __name__ == "__main__":
    sys.exit(main())
