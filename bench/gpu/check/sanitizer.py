"""compute-sanitizer on a pump run: where the tool is, and which of its reports are pump's
expected API errors.  Before CUDA 13.2 the driver has no parameter-count call, so the shim
learns where a kernel's parameters end by asking cuFuncGetParamInfo (or cuKernelGetParamInfo)
for the index past the last and being refused with CUDA_ERROR_INVALID_VALUE (shim/lookup/layouts.c):
one refused call per kernel layout, which memcheck reports as "Program hit ... on CUDA API
call to cuFuncGetParamInfo".  Those, from libpump's frames, on such a driver, are expected;
any other report fails the check."""

import os
import pathlib
import re
import shutil

PARAM_COUNT_SINCE = 13020  # cuFuncGetParamCount and cuKernelGetParamCount (cudaTypedefs.h: _v13020)
HIT = re.compile(r"=+ Program hit (CUDA_ERROR_\w+) .* on CUDA API call to (cu\w+)\.")
SUMMARY = re.compile(r"=+ (?:ERROR|RACECHECK) SUMMARY: (\d+) (?:error|hazard)")


def tool():
    """compute-sanitizer's path, or None."""
    cuda = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer"
    return shutil.which("compute-sanitizer") or (str(cuda) if cuda.exists() else None)


def reports(lines):
    """Each report of the tool's output as its lines: a block opened by a line "========= X"
    after a blank "=========" (or the banner) and closed by the next blank one."""
    blocks, block = [], None
    for line in lines:
        body = line.strip().lstrip("=").strip()
        if not line.strip().startswith("========="):
            continue
        if not body:
            if block:
                blocks.append(block)
            block = None
        elif block is not None:
            block.append(body)
        elif not body.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY")):
            block = [body]
    if block:
        blocks.append(block)
    return blocks


def judge(lines, driver_version: int) -> dict:
    """{"errors" (the tool's count), "expected" (pump's parameter-end probes), "unexpected"
    (each other report's first line)} of one run's output."""
    summary = [int(m.group(1)) for m in map(SUMMARY.search, lines) if m]
    expected, unexpected = 0, []
    for block in reports(lines):
        hit = HIT.search("========= " + block[0])
        probe = (hit and hit.group(1) == "CUDA_ERROR_INVALID_VALUE"
                 and hit.group(2) in ("cuFuncGetParamInfo", "cuKernelGetParamInfo")
                 and any("libpump.so" in frame for frame in block[1:]) and driver_version < PARAM_COUNT_SINCE)
        if probe:
            expected += 1
        else:
            unexpected.append(block[0])
    errors = summary[-1] if summary else None
    if errors is not None and errors > expected + len(unexpected):
        unexpected.append(f"{errors - expected - len(unexpected)} error(s) counted but not shown")
    return {"errors": errors, "expected": expected, "unexpected": unexpected}
