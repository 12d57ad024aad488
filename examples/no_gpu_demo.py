"""What pump does, shown where there is no GPU: examples/managed_saxpy.py on pump's CPU
model of the driver (fakecuda), under pump-run and under pump-run --policy off (the
driver alone), side by side.  examples/train_gpt.py ends with this when it found no GPU
(its PyTorch job then trains on the CPU, where pump has nothing to do).

    python examples/no_gpu_demo.py

The figures are fakecuda's counts (page faults, bytes moved), not GPU timings.
"""
import pathlib
import re
import subprocess
import sys

from managed_saxpy import fakecuda_dir  # beside this file

HERE = pathlib.Path(__file__).resolve().parent
# Small enough to take seconds (fakecuda's kernels are Python), large enough for many pages.
JOB = [str(HERE / "managed_saxpy.py"), "--mib", "4", "--steps", "4"]
FAKECUDA_LINE = re.compile(r"^fakecuda: (\d+) GPU faults in \d+ batches, ([\d.]+) MiB moved by prefetches, "
                           r"([\d.]+) MiB moved by faults$", re.M)
CHECKSUM = re.compile(r"^checksum (\S+)", re.M)


def pump_run():
    """The pump-run installed beside this Python, else the one on PATH."""
    beside = pathlib.Path(sys.executable).parent / "pump-run"
    return str(beside) if beside.exists() else "pump-run"


def run(policy):
    """(faults, MiB moved by prefetches, MiB moved by faults, checksum) of one run, or why not."""
    try:
        proc = subprocess.run([pump_run(), "--quiet", "--policy", policy, sys.executable, *JOB, "--fakecuda"],
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"could not run pump-run: {e}"
    counts, checksum = FAKECUDA_LINE.search(proc.stdout), CHECKSUM.search(proc.stdout)
    if proc.returncode != 0 or counts is None or checksum is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"pump-run --policy {policy} failed (exit status {proc.returncode}): {tail[0]}"
    return int(counts.group(1)), float(counts.group(2)), float(counts.group(3)), checksum.group(1)


def show(out=sys.stdout):
    """Prints the comparison; returns False (and says why) when it could not be made."""
    print("What pump does for a job on a GPU, shown on pump's CPU model of the driver\n"
          "(fakecuda; counts of a model, not GPU timings):", file=out, flush=True)
    fakecuda_dir()  # built now if it must be, its progress shown (the runs' output is captured)
    runs = {policy: run(policy) for policy in ("launch", "off")}
    failed = [r for r in runs.values() if isinstance(r, str)]
    if failed:
        print(f"  (not shown: {failed[0]})", file=out)
        return False
    command = "python " + " ".join(["examples/managed_saxpy.py", *JOB[1:]])
    print(f"  {command:<52}{'GPU faults':>11}{'moved by faults':>17}{'by prefetches':>15}", file=out)
    for policy, label in (("launch", "under pump-run"), ("off", "under pump-run --policy off (the driver alone)")):
        faults, prefetched, faulted, _ = runs[policy]
        print(f"  {label:<52}{faults:>11}{f'{faulted:.1f} MiB':>17}{f'{prefetched:.1f} MiB':>15}", file=out)
    same = runs["launch"][3] == runs["off"][3]
    print(f"  checksums: {'the same' if same else 'DIFFERENT'} ({runs['launch'][3]}"
          f"{'' if same else ' and ' + runs['off'][3]})", file=out)
    return same


if __name__ == "__main__":
    sys.exit(0 if show() else 1)
