"""The GPU suite's case f, real oversubscription by a filler of device memory, without a GPU: the
filler's sizing and refusals (bench/gpu/filler.py), the case's plan, the suite running it on
fakecuda with a stand-in job (the probe first; a run that reaches its cap is a result), and the
filler itself (examples/device_filler.py): device memory that pump's managed_all leaves alone,
where a cuMemAlloc would have been made managed."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import PUMP_RUN, clean_env
from test_bench_gpu import fake_gpu, fake_nvml  # noqa: F401 (fake_gpu: the fixture)
from test_real_client import cuda_torch  # noqa: F401 (the fixture that skips without torch's CUDA build)
from test_real_client_training import PERSONA

import filler  # noqa: E402  (bench/gpu, on sys.path by test_bench_gpu)
import membudget
import suite
import table

ROOT = pathlib.Path(__file__).resolve().parent.parent
GiB, MiB = membudget.GiB, membudget.MiB


# ---------------------------------------------------------------- sizing and refusals
def test_the_filler_leaves_half_the_working_set_beside_the_headroom():
    s = filler.size("case f", 7 * GiB, 21 * GiB // 2, 2.0, 79 * GiB, 128 * GiB)
    assert s["room_bytes"] == 7 * GiB // 2 and s["headroom_bytes"] == filler.HEADROOM_BYTES == 3 * GiB
    assert s["filler_bytes"] == 79 * GiB - 7 * GiB // 2 - 3 * GiB and s["filler_bytes"] % filler.BLOCK == 0
    assert s["left_bytes"] == s["room_bytes"] + s["headroom_bytes"] and s["free_bytes"] == 79 * GiB
    assert s["ratio_range"] == [7 / 6.5, 2.0]       # the context takes none of the headroom, or all of it
    # The probe's milder ratio leaves more room, so its filler is smaller.
    probe = filler.size("probe", 7 * GiB, 21 * GiB // 2, filler.PROBE_RATIO, 79 * GiB, 128 * GiB)
    assert probe["room_bytes"] == int(7 * GiB / 1.2) // filler.BLOCK * filler.BLOCK
    assert probe["filler_bytes"] < s["filler_bytes"]
    # Whole blocks: the room rounds down, the filler with it; at least one block of room.
    odd = filler.size("odd", 7 * GiB + 3, 8 * GiB, 2.0, 79 * GiB + 5, 128 * GiB)
    assert odd["room_bytes"] % filler.BLOCK == 0 and odd["filler_bytes"] % filler.BLOCK == 0
    assert filler.room(1, 2.0) == filler.BLOCK


def test_the_filler_refuses_managed_memory_past_half_the_hosts_ram():
    filler.size("at half", 7 * GiB, 64 * GiB, 2.0, 79 * GiB, 128 * GiB)       # exactly half: allowed
    with pytest.raises(membudget.Refused) as exc:
        filler.size("case f", 7 * GiB, 64 * GiB + 1, 2.0, 79 * GiB, 128 * GiB)
    text = str(exc.value)
    assert text.startswith("REFUSED case f") and "half the host's 128.00 GiB of RAM" in text, text


def test_the_filler_refuses_a_card_with_nothing_to_fill():
    with pytest.raises(membudget.Refused, match=r"REFUSED case f: the GPU has 6.00 GiB free.*nothing to fill"):
        filler.size("case f", 7 * GiB, 10 * GiB, 2.0, 6 * GiB, 128 * GiB)    # 3.5 room + 3 headroom > 6
    with pytest.raises(membudget.Refused, match="nothing to fill"):
        filler.size("case f", 7 * GiB, 10 * GiB, 2.0, 7 * GiB // 2 + 3 * GiB + MiB, 128 * GiB)  # under a block


def test_case_f_plans_the_drivers_own_unified_memory_and_pumps_policies_without_a_budget():
    program = suite.gpt_args(1.0, "train.py")
    peak = 7 * GiB
    f = suite.plan_filler(program, peak, 79 * GiB, 128 * GiB)
    request = int(peak * suite.TORCH_SLACK)
    assert [v.name for v in f.variants] == ["ideal", "naive", "launch", "lookahead"]
    assert f.variants[0].pump is None and f.variants[0].memory == "device"
    assert [v.pump for v in f.variants[1:]] == [["--policy", p, "--capacity", str(request)]
                                               for p in ("off", "launch", "lookahead")]
    assert not f.emulated and f.filler_working_set == peak and f.traced == "launch"
    assert f.capacity == peak // 2 + filler.HEADROOM_BYTES            # all the filler leaves: the bound's
    assert "real oversubscription" in f.title and "a filler of 72.50 GiB" in f.title, f.title
    assert "leaves 6.50 GiB of the 79.00 GiB free" in f.title and "1.08x to 2.00x" in f.title, f.title
    # The filler goes to the program, after the step counts; the ideal run never has one.
    argv = suite.command(f, f.variants[1], 2, 8, filler_bytes=64 * MiB)
    assert argv[argv.index("--") + 1:][-6:] == ["--warmup", "2", "--steps", "8", "--filler-bytes", str(64 * MiB)]
    assert "--filler-bytes" not in suite.command(f, f.variants[0], 2, 8)
    with pytest.raises(membudget.Refused, match="half the host's"):
        suite.plan_filler(program, peak, 79 * GiB, 16 * GiB)


def test_case_f_is_asked_for_by_name_only():
    assert "f" not in suite.CASES and suite.parse_args(["--cases", "cf"]).cases == "cf"
    with pytest.raises(SystemExit):
        suite.parse_args(["--cases", "g"])


def test_the_table_says_real_oversubscription_and_a_timed_out_run():
    case = {"case": "f", "real_oversubscription": True,
            "variants": {"ideal": {"step_ms": table.summarize([100])},
                         "naive": {"timed_out": "timed out after 100 s, 1 of 8 timed steps done after 2 warm-up"},
                         "launch": {"step_ms": table.summarize([400]), "identical": True}}}
    table.add_ratios(case)
    text = table.render([case])
    assert "| f (real oversubscription) | naive | timed out after 100 s, 1 of 8 timed steps done" in text, text
    assert "| f (real oversubscription) | launch | 400.00 | 0.0% | 4.000x | - | - | yes |" in text, text


# ---------------------------------------------------------------- the suite, on fakecuda
# A stand-in for train_gpt.py: its JSON, the filler it was given, and on request a slow naive
# (the driver alone: pump-run --policy off) or a probe that never ends.
STAND_IN = """
import argparse, json, os, struct, time
ap = argparse.ArgumentParser()
for name in ("--preset", "--batch", "--seq", "--steps", "--warmup", "--device"):
    ap.add_argument(name)
ap.add_argument("--filler-bytes", type=int, default=0)
ap.add_argument("--json", action="store_true")
a = ap.parse_args()
naive = os.environ.get("PUMP_POLICY") == "off"
if naive and os.environ.get("STAND_IN_HANG_PROBE") and a.steps == "1":
    time.sleep(600)
loss = 10.0
for step in range(int(a.steps) + int(a.warmup)):
    loss *= 0.9
    if naive and os.environ.get("STAND_IN_SLOW_NAIVE"):
        time.sleep(float(os.environ["STAND_IN_SLOW_NAIVE"]))
    if step >= int(a.warmup):
        print(json.dumps({"step": step - int(a.warmup), "loss": loss, "loss_hex": struct.pack(">d", loss).hex(),
                          "ms": 1.0}), flush=True)
print(json.dumps({"steps": int(a.steps), "checksum_hex": "ab" * 32, "params": 1, "device": "cuda",
                  "peak_bytes": 64 << 20, "warmup": int(a.warmup), "filler_bytes": a.filler_bytes}))
"""


@pytest.fixture
def run_f(fake_gpu, monkeypatch, tmp_path):  # noqa: F811
    """suite.main(--cases f) with the stand-in, on a 24 GiB card with 20 GiB free, 1 GiB of
    headroom and short caps (10 s a run, probe_cap for the probe); returns (its JSON, its exit
    status, what it printed)."""
    monkeypatch.setattr(suite, "TIMED", {"chain": (1, 2), "gpt": (1, 3)})
    monkeypatch.setattr(suite, "UNTIMED_STEPS", 3)
    monkeypatch.setattr(suite, "versions", lambda: {"python": "test"})
    monkeypatch.setattr(suite, "MIN_RUN_S", 1)
    monkeypatch.setattr(suite, "FILLER_RUN_CAP_S", 10)
    monkeypatch.setattr(filler, "HEADROOM_BYTES", GiB)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(20 * GiB, 24 * GiB))
    (tmp_path / "train.py").write_text(STAND_IN)

    def run(capsys, probe_cap=20, **env):
        monkeypatch.setattr(suite, "PROBE_CAP_S", probe_cap)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        out = tmp_path / "suite.json"
        status = suite.main(["--cases", "f", "--scale", "0.01", "--json", str(out), "--work", str(tmp_path / "w"),
                             "--train-script", str(tmp_path / "train.py"), "--budget-seconds", "240"])
        return json.loads(out.read_text()), status, capsys.readouterr().out
    return run


def test_suite_runs_case_f_on_fakecuda_probe_first(run_f, capsys):
    doc, status, printed = run_f(capsys)
    assert status == 0 and doc["failures"] == [], doc["failures"]
    (f,) = doc["cases"]
    assert f["real_oversubscription"] and "real oversubscription" in f["title"]
    room = filler.room(64 * MiB, filler.RATIO)
    assert f["capacity_bytes"] == room + GiB and f["request_bytes"] == 96 * MiB
    probe = f["probe"]
    assert probe["filler"]["ratio"] == filler.PROBE_RATIO and probe["command"][-2:][0] == "--filler-bytes"
    assert printed.index("--steps 1 --filler-bytes") < printed.index("--policy launch")   # the probe came first
    variants = f["variants"]
    assert variants["ideal"]["command"][-4:] == ["--warmup", "1", "--steps", "3"]        # no filler, no pump
    for name in ("naive", "launch", "lookahead"):
        v = variants[name]
        assert v["identical"] is True and v["step_ms"]["n"] == 3, v
        assert v["filler"]["filler_bytes"] == 20 * GiB - room - GiB, v["filler"]
        assert v["command"][v["command"].index("--filler-bytes") + 1] == str(v["filler"]["filler_bytes"])
        assert "--budget" not in v["command"]
    assert variants["naive"]["command"][1:3] == ["--policy", "off"]
    assert "| f (real oversubscription) | launch | 1.00 |" in doc["table"]
    assert "real oversubscription" in doc["real_note"]


def test_a_slow_naive_is_timed_out_and_reported_not_failed(run_f, capsys, monkeypatch):
    monkeypatch.setattr(suite, "FILLER_RUN_CAP_S", 5)
    doc, status, _ = run_f(capsys, STAND_IN_SLOW_NAIVE="2")   # 4 steps of 2 s pass the cap of 5 (the probe's 2 not)
    (f,) = doc["cases"]
    naive = f["variants"]["naive"]
    assert status == 0 and doc["failures"] == [], doc["failures"]
    done = r"timed out after \d+ s, [0-2] of 3 timed steps done after 1 warm-up"
    assert re.fullmatch(done, naive["timed_out"]), naive
    assert "step_ms" not in naive and naive["cupti"]["error"].startswith("not run: the timed run timed out")
    assert f["variants"]["launch"]["identical"] is True and f["variants"]["launch"]["speedup_over_naive"] is None
    assert "| f (real oversubscription) | naive | timed out after " in doc["table"]


def test_a_probe_that_does_not_finish_skips_the_case(run_f, capsys):
    doc, status, printed = run_f(capsys, probe_cap=3, STAND_IN_HANG_PROBE="1")
    (f,) = doc["cases"]
    assert status == 0 and "variants" not in f
    assert f["skipped"].startswith("case f's probe (naive under a filler of ") and "timed out after " in f["skipped"]
    assert "none of the case's runs is made" in f["skipped"] and "--policy launch" not in printed


# ---------------------------------------------------------------- the filler itself
FILLER_JOB = """
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
import device_filler
cuda = ctypes.CDLL("libcuda.so.1")
def free():
    f, t = ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t)) == 0
    return f.value
with device_filler.DeviceFiller(int(sys.argv[2]), 0) as held:
    during = free()
    # What pump's managed_all makes of a cuMemAlloc, which is why the filler is not one.
    ptr, managed = ctypes.c_uint64(), ctypes.c_uint()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(2 << 20)) == 0
    assert cuda.cuPointerGetAttribute(ctypes.byref(managed), 8, ptr) == 0   # CU_POINTER_ATTRIBUTE_IS_MANAGED
    assert cuda.cuMemFree_v2(ptr) == 0
    print(json.dumps({"held": held.nbytes, "free_during": during, "alloc_managed": managed.value}))
print(json.dumps({"free_after": free()}))
"""


def filler_job(env, nbytes, pump=()):
    proc = subprocess.run([*pump, sys.executable, "-c", FILLER_JOB, str(ROOT / "examples"), str(nbytes)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return dict(lines[0], **lines[1]), proc


def test_the_filler_is_device_memory_under_pump_where_cumemalloc_is_made_managed(fake_gpu, tmp_path):  # noqa: F811
    bare, _ = filler_job(fake_gpu, 64 * MiB + 1)
    assert bare["held"] == 66 * MiB and bare["alloc_managed"] == 0          # rounded up to the granularity
    assert bare["free_after"] - bare["free_during"] == 66 * MiB             # taken from the card, given back
    stats = tmp_path / "stats.json"
    pumped, proc = filler_job(fake_gpu, 64 * MiB, (PUMP_RUN, "--stats", str(stats), "--"))
    assert pumped["held"] == 64 * MiB and pumped["alloc_managed"] == 1      # managed_all took the cuMemAlloc
    totals = json.loads(stats.read_text())["totals"]
    assert totals["vmm_allocs"] == 1 and totals["managed_all_allocs"] == 1, totals
    assert "memory from cuMemCreate" in proc.stderr and "stays device memory" in proc.stderr, proc.stderr


def test_train_gpt_holds_its_filler_under_pump_and_trains_the_same(cuda_torch, c_build, tmp_path):  # noqa: F811
    """The real client (torch's CUDA build on fakecuda's H100 persona) under pump-run --policy off:
    the filler is held (pump counts one cuMemCreate), the job's memory is made managed beside it,
    and it trains as without the filler (fakecuda computes no values: no loss is compared); one
    the card cannot hold ends the job with status 4, saying why, before it trains."""
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_PERSONA=PERSONA,
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    job = [cuda_torch, str(ROOT / "examples" / "train_gpt.py"), "--device", "cuda", "--steps", "2", "--json"]

    def run(*args, pump=()):
        proc = subprocess.run([*pump, *job, *args], env=env, capture_output=True, text=True, timeout=600)
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        return proc, lines
    proc, plain = run()
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = tmp_path / "stats.json"
    proc, filled = run("--filler-bytes", str(GiB), pump=(PUMP_RUN, "--policy", "off", "--stats", str(stats), "--"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert filled[-1]["filler_bytes"] == GiB and plain[-1]["filler_bytes"] == 0
    assert [s["step"] for s in filled[:-1]] == [s["step"] for s in plain[:-1]] == [0, 1]
    totals = json.loads(stats.read_text())["totals"]
    assert totals["vmm_allocs"] == 1 and totals["managed_all_allocs"] > 0, totals
    proc, out = run("--filler-bytes", str(1 << 40))                          # 1 TiB: more than the card
    assert proc.returncode == 4 and out == [], proc.stdout
    assert "train_gpt.py: --filler-bytes 1099511627776: cuMemCreate failed: CUresult 2" in proc.stderr, proc.stderr
