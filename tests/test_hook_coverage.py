"""A silent pass-through is never silent (issue 27, item 2).

pump swaps in its hook where cuGetProcAddress answers with libcuda's export of a name it hooks
(pointer identity, shim/hooks/procaddr.c). A driver whose table answers with another function (issue 27
item 4: the CUDA 13 entries were never resolved on a 580 driver) leaves pump nothing to swap: the
program's calls through it pass pump by. fakecuda's FAKECUDA_PROCADDR_INTERNAL makes its table
answer so for the launch entry points named. pump then says so once per name on stderr, counts it
(`procaddr_unmatched`), says at exit that no launch reached it though the job allocated managed
memory and looked launches up, and pump-run's summary shows the hook coverage. Before, the same
runs printed nothing: 0 launches seen, and not a word."""

import json
import subprocess

from conftest import LOCK_HELD_LINE
from helpers import clean_env
from pump import stats

INTERNAL = {"FAKECUDA_PROCADDR_INTERNAL": "cuLaunchKernel_ptsz,cuLaunchKernelEx_ptsz,cuLaunchCooperativeKernel_ptsz"}
UNMATCHED = "answered with a function that is not libcuda's"
NO_LAUNCH = "no kernel launch reached pump's hooks"


def test_hooks_matched_say_nothing(run_program):
    run = run_program("touch_procaddr")
    t = run.totals
    assert run.proc.returncode == 0 and UNMATCHED not in run.proc.stderr and NO_LAUNCH not in run.proc.stderr
    assert t["procaddr_unmatched"] == 0 and t["launches"] > 0
    assert t["procaddr_hooks"] >= 10 and t["launch_lookups"] >= 3
    assert t["dlsym_hooks"] >= 1  # cuGetProcAddress_v2 itself, found by dlsym before the driver was loaded
    assert f"hooks {t['procaddr_hooks']} via cuGetProcAddress + {t['dlsym_hooks']} via dlsym, 1 process" in \
        stats.summary_line(t)


def test_a_launch_entry_pump_cannot_match_is_said(run_program):
    bare = run_program("touch_procaddr", pump=False, env=INTERNAL)
    run = run_program("touch_procaddr", env=INTERNAL)
    assert run.proc.returncode == 0 and run.result["checksum"] == bare.result["checksum"]
    t = run.totals
    assert t["launches"] == 0 and t["procaddr_unmatched"] == 3
    err = run.proc.stderr
    for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel"):
        assert err.count(f'cuGetProcAddress("{name}") {UNMATCHED} {name}') == 1, err
    assert err.count(NO_LAUNCH) == 1 and "PUMP_LOG=2" in err
    assert "(3 unmatched)" in stats.summary_line(t)


def test_each_name_is_said_once(c_build, libpump, tmp_path):
    """Asked again and again, the same unmatched name is counted each time and said once."""
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), LD_PRELOAD=str(libpump),
               PUMP_STATS_DIR=str(tmp_path), FAKECUDA_PROCADDR_INTERNAL="cuLaunchKernel")
    requests = ["q cuLaunchKernel 4000 0"] * 3 + ["q cuLaunchKernelEx 11060 0"]
    proc = subprocess.run([str(c_build / "plain" / "lookup_probe")], input="\n".join(requests) + "\n", env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and LOCK_HELD_LINE not in proc.stderr, proc.stderr
    answers = [json.loads(l) for l in proc.stdout.splitlines() if '"q"' in l]
    assert [a["program_v2"] for a in answers[:3]] == [answers[0]["driver"]] * 3  # the driver's, not pump's
    assert answers[3]["program_v2"] == "pump:cuLaunchKernelEx"
    assert proc.stderr.count(UNMATCHED) == 1, proc.stderr
    t = stats.aggregate(stats.read_dir(tmp_path))
    assert t["procaddr_unmatched"] == 6  # 3 lookups, each through cuGetProcAddress_v2 and the 4-argument form


def test_the_knob_refuses_an_unknown_entry_point(run_program):
    run = run_program("touch_procaddr", pump=False, env={"FAKECUDA_PROCADDR_INTERNAL": "cuLaunchKernel,cuMemAlloc"})
    assert run.proc.returncode == 2
    assert 'FAKECUDA_PROCADDR_INTERNAL: unknown entry point "cuMemAlloc"; allowed: cuLaunchKernel' in run.proc.stderr
