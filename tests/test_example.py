"""The examples, run as a user would. examples/managed_saxpy.py: bare, under pump-run,
and under pump-run --policy off. examples/train_gpt.py (the README's main job): its
interface, bit-identical runs, and pump-run (on a GPU where there is one).

The environment is clean (no LD_PRELOAD, LD_LIBRARY_PATH, PUMP_* or FAKECUDA_*), so the
example finds no libcuda.so.1 and takes its own way to fakecuda: it re-executes itself
with build/tests/plain on the library path. That build comes from the c_build fixture,
which also keeps it current with the sources."""

import json
import math
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import PUMP_RUN, clean_env, has_gpu, needs_gpu

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "managed_saxpy.py"
STEPS, MIB = 3, 4
ARGS = [sys.executable, str(EXAMPLE), "--mib", str(MIB), "--steps", str(STEPS)]
FAKECUDA_NOTE = "no CUDA driver here: running on pump's CPU model of the driver (fakecuda)"


@pytest.fixture(scope="module")
def example_env(c_build):
    return clean_env("LD_LIBRARY_PATH")


def run(args, env):
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    out = proc.stdout
    assert out.splitlines()[0] == FAKECUDA_NOTE, out
    assert len(re.findall(r"^step \d+: ", out, re.M)) == STEPS, out
    checksum = re.search(r"^checksum (\S+) \(\d+ samples match the host\)", out, re.M)
    faults = re.search(r"^fakecuda: (\d+) GPU faults", out, re.M)
    assert checksum and faults, out
    return proc, checksum.group(1), int(faults.group(1))


@pytest.fixture(scope="module")
def bare(example_env):
    return run(ARGS, example_env)


def test_bare(bare):
    proc, checksum, faults = bare
    assert float(checksum) > 0
    # Plain Unified Memory: one GPU fault per 64 KiB page of the four buffers.
    assert faults == 4 * MIB * 16, proc.stdout
    assert "pump:" not in proc.stderr  # not under pump


def test_pump_run(bare, example_env, tmp_path):
    stats_file = tmp_path / "stats.json"
    proc, checksum, faults = run([PUMP_RUN, "--stats", str(stats_file), *ARGS], example_env)
    assert checksum == bare[1]
    assert faults == 0, proc.stdout  # every page was prefetched before its kernel ran
    summary = [l for l in proc.stderr.splitlines() if l.startswith("pump: ")]
    assert len(summary) == 1, proc.stderr
    assert f"{2 * STEPS} launches" in summary[0] and "prefetch" in summary[0], summary
    totals = json.loads(stats_file.read_text())["totals"]
    assert totals["launches"] == 2 * STEPS
    assert totals["launches_managed"] == 2 * STEPS
    assert totals["prefetch_bytes"] > 0
    assert totals["processes"] == 1  # the re-executed process keeps its pid and its record


def test_pump_run_policy_off(bare, example_env):
    proc, checksum, faults = run([PUMP_RUN, "--policy", "off", *ARGS], example_env)
    assert checksum == bare[1]
    assert faults == bare[2] > 0, proc.stdout  # pump counted launches and moved nothing
    assert re.search(rf"^pump: {2 * STEPS} launches .* 0 B prefetched", proc.stderr, re.M), proc.stderr


def test_the_first_build_of_fakecuda_says_how_far_it_is(c_build):
    """managed_saxpy builds fakecuda on first use with scripts/build-tests --progress (here the
    build is done already, so it counts straight to 100%)."""
    build = subprocess.run([str(ROOT / "scripts" / "build-tests"), "--progress"], capture_output=True, text=True,
                           env=dict(clean_env(), PYTHON=sys.executable), timeout=600)
    assert build.returncode == 0 and build.stdout == "", build.stderr
    lines = build.stderr.splitlines()
    assert lines[-2:] == ["build-tests: 100%", "build-tests: done"], build.stderr
    bad = subprocess.run([str(ROOT / "scripts" / "build-tests"), "--fast"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr == "build-tests: unknown option --fast; allowed: --progress\n"


# --- examples/train_gpt.py, the README's main job ------------------------------------------

TRAIN_GPT = [sys.executable, str(ROOT / "examples" / "train_gpt.py")]
STEP_KEYS = {"step", "loss", "loss_hex", "ms"}
FINAL_KEYS = {"steps", "checksum_hex", "params", "device", "peak_bytes", "preset", "config", "warmup",
              "filler_bytes"}


def train(args, env, pump_run=()):
    proc = subprocess.run([*pump_run, *TRAIN_GPT, *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def train_json(args, env, pump_run=()):
    proc = train(["--json", *args], env, pump_run)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return proc, lines[:-1], lines[-1]


@pytest.fixture(scope="module")
def gpt_env():
    return clean_env()


@pytest.fixture(scope="module")
def cpu_run(gpt_env):
    return train_json(["--device", "cpu", "--steps", "3"], gpt_env)


def test_train_gpt_json_schema(cpu_run):
    _, steps, final = cpu_run
    assert [s["step"] for s in steps] == [0, 1, 2]
    for s in steps:
        assert set(s) == STEP_KEYS
        assert float.fromhex(s["loss_hex"]) == s["loss"] and math.isfinite(s["loss"])
        assert isinstance(s["ms"], float) and s["ms"] > 0
    assert set(final) == FINAL_KEYS
    assert final["steps"] == 3 and final["warmup"] == 0 and final["preset"] == "tiny"
    assert final["device"] == "cpu" and final["peak_bytes"] is None
    assert re.fullmatch(r"[0-9a-f]{64}", final["checksum_hex"])
    assert 1_000_000 < final["params"] < 10_000_000  # tiny: a few M parameters
    assert final["config"] == {"layers": 4, "d_model": 192, "heads": 6, "seq": 64, "batch": 8, "vocab": 4096}
    assert steps[0]["loss"] == pytest.approx(math.log(4096), rel=0.05)  # untrained: uniform over the vocabulary


def test_train_gpt_is_bit_identical_and_warmup_is_training(cpu_run, gpt_env):
    _, steps, final = cpu_run
    _, again, final_again = train_json(["--device", "cpu", "--steps", "3"], gpt_env)
    assert [s["loss_hex"] for s in again] == [s["loss_hex"] for s in steps]
    assert final_again["checksum_hex"] == final["checksum_hex"]
    # two warmup steps, then one timed: the same training as three steps
    _, warm, final_warm = train_json(["--device", "cpu", "--warmup", "2", "--steps", "1"], gpt_env)
    assert [(s["step"], s["loss_hex"]) for s in warm] == [(0, steps[2]["loss_hex"])]
    assert final_warm["checksum_hex"] == final["checksum_hex"]


def test_train_gpt_another_seed_trains_another_model(cpu_run, gpt_env):
    _, steps, final = cpu_run
    _, other, final_other = train_json(["--device", "cpu", "--steps", "3", "--seed", "1"], gpt_env)
    assert other[0]["loss_hex"] != steps[0]["loss_hex"]
    assert final_other["checksum_hex"] != final["checksum_hex"]


def test_train_gpt_overrides_and_text_output(gpt_env):
    proc = train(["--device", "cpu", "--steps", "2", "--layers", "1", "--d-model", "32", "--heads", "2",
                  "--seq", "16", "--batch", "2", "--vocab", "64"], gpt_env)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("tiny: 0.0M parameters, GPTConfig(layers=1, d_model=32, heads=2, seq=16, "
                               "batch=2, vocab=64), on cpu"), proc.stdout
    assert len(re.findall(r"^step \d: loss \d+\.\d{4}, \d+\.\d ms$", proc.stdout, re.M)) == 2, proc.stdout
    assert re.fullmatch(r"checksum [0-9a-f]{16} after 2 steps", lines[-1]), proc.stdout
    assert "pump's CPU model" not in proc.stdout  # --device cpu: asked for, so no demo


@pytest.mark.parametrize("args,message", [
    (["--heads", "5"], "--d-model 192 is not a multiple of --heads 5"),
    (["--layers", "0"], "--layers: allowed: an integer >= 1"),
    (["--steps", "0"], "allowed: --steps N >= 1 and --warmup N >= 0"),
    (["--preset", "gpt5"], "invalid choice: 'gpt5'"),
    (["--filler-bytes", "-1"], "--filler-bytes -1: allowed: N >= 0"),
    (["--filler-bytes", "1"], "--filler-bytes: there is no GPU to fill here"),   # --device cpu
])
def test_train_gpt_bad_arguments(gpt_env, args, message):
    proc = subprocess.run([*TRAIN_GPT, "--device", "cpu", *args], env=gpt_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and message in proc.stderr, proc.stderr


def test_train_gpt_under_pump_run_on_the_cpu(cpu_run, gpt_env, tmp_path):
    """The same losses and checksum under pump-run. On the CPU no process uses CUDA, so by
    pump-run's rule there is no summary line (test_train_gpt_on_the_gpu has one)."""
    stats_file = tmp_path / "stats.json"
    proc, steps, final = train_json(["--device", "cpu", "--steps", "3"], gpt_env,
                                    pump_run=(PUMP_RUN, "--stats", str(stats_file)))
    assert [s["loss_hex"] for s in steps] == [s["loss_hex"] for s in cpu_run[1]]
    assert final["checksum_hex"] == cpu_run[2]["checksum_hex"]
    if not has_gpu():  # (a CUDA build of PyTorch on a GPU machine may initialise CUDA all the same)
        assert "pump: " not in proc.stderr
        assert json.loads(stats_file.read_text())["processes"] == []


@pytest.mark.skipif(has_gpu(), reason="the demo is for machines without a GPU")
def test_train_gpt_without_a_gpu_shows_pump_on_the_model(example_env):
    """The README's first command where there is no GPU: after training on the CPU, the job
    shows managed_saxpy on fakecuda under pump and under --policy off, labelled a model."""
    proc = train(["--steps", "1"], example_env, pump_run=(PUMP_RUN,))
    out = proc.stdout
    assert "No GPU here, so the job trained on the CPU and pump had nothing to do." in out, out
    assert "pump's CPU model of the driver\n(fakecuda; counts of a model, not GPU timings)" in out, out
    rows = dict(re.findall(r"^  (under pump-run.*?)\s{2,}(\d+)\s+[\d.]+ MiB\s+[\d.]+ MiB$", out, re.M))
    assert rows["under pump-run"] == "0", out
    assert int(rows["under pump-run --policy off (the driver alone)"]) == 4 * 4 * 16, out  # 64 KiB pages
    assert "checksums: the same" in out, out
    # --no-demo and --json train alone (--device cpu: test_train_gpt_overrides_and_text_output).
    for args in (["--no-demo"], ["--json"]):
        assert "pump's CPU model" not in train(["--steps", "1", *args], example_env).stdout


def test_train_gpt_without_pytorch_shows_pump_on_the_model(example_env, tmp_path):
    """The light first look (pip install . brings no PyTorch): before, the job died on
    'import torch'; now it says why it cannot train and shows the demo, GPU or not."""
    hidden = tmp_path / "torch"
    hidden.mkdir()
    (hidden / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'torch\'", name="torch")\n')
    env = dict(example_env, PYTHONPATH=str(tmp_path))
    proc = train([], env, pump_run=(PUMP_RUN,))
    out = proc.stdout
    assert out.startswith("PyTorch is not installed, so this job cannot train here"), out
    rows = dict(re.findall(r"^  (under pump-run.*?)\s{2,}(\d+)\s+[\d.]+ MiB\s+[\d.]+ MiB$", out, re.M))
    assert rows == {"under pump-run": "0", "under pump-run --policy off (the driver alone)": str(4 * 4 * 16)}, out
    assert "checksums: the same" in out, out
    no_demo = subprocess.run([*TRAIN_GPT, "--no-demo"], env=env, capture_output=True, text=True, timeout=60)
    assert no_demo.returncode == 1 and "pump's CPU model" not in no_demo.stdout


def test_pip_install_puts_fakecuda_in_the_package():
    """A plain pip install . has no CUDA headers to build fakecuda with later: the package
    carries it (pump/fakecuda/libcuda.so.1), which managed_saxpy runs on where there is no
    checkout build."""
    # Run away from the checkout, as the example runs (its own directory first on sys.path), so
    # that `import pump` is the installed package.
    out = subprocess.run([sys.executable, "-c", "import ctypes, sys; sys.path.insert(0, sys.argv[1]); "
                          "import managed_saxpy; d = managed_saxpy.installed_fakecuda_dir(); print(d); "
                          "lib = ctypes.CDLL(str(d / 'libcuda.so.1')); "
                          "print(hasattr(lib, 'fakecuda_register_kernel'), lib.cuInit(0))", str(EXAMPLE.parent)],
                         cwd="/", capture_output=True, text=True, timeout=60)
    folder, *loaded = out.stdout.split()
    assert folder.endswith("/pump/fakecuda") and pathlib.Path(folder).parent != ROOT / "pump", out.stdout + out.stderr
    assert loaded == ["True", "0"], out.stderr


@needs_gpu
def test_train_gpt_on_the_gpu(gpt_env, tmp_path):
    """On a GPU: bit-identical losses and checksum with and without pump-run (managed_all on
    by default), pump's summary line, launches on managed memory, and the caching allocator's
    tensors followed."""
    args = ["--device", "cuda", "--steps", "5"]
    _, bare_steps, bare_final = train_json(args, gpt_env)
    stats_file = tmp_path / "stats.json"
    proc, steps, final = train_json(args, gpt_env, pump_run=(PUMP_RUN, "--stats", str(stats_file)))
    assert [s["loss_hex"] for s in steps] == [s["loss_hex"] for s in bare_steps]
    assert final["checksum_hex"] == bare_final["checksum_hex"]
    assert final["device"].startswith("cuda") and final["peak_bytes"] > 0
    assert len([line for line in proc.stderr.splitlines() if line.startswith("pump: ")]) == 1, proc.stderr
    totals = json.loads(stats_file.read_text())["totals"]
    assert totals["launches"] > 0 and totals["launches_managed"] > 0, totals
    # PyTorch's caching allocator followed (pump/boot/torch_trace.cpp): tensors, not segments.
    assert "not followed" not in proc.stderr, proc.stderr
    assert totals["torch_tensor_allocs"] > 0 and totals["torch_tensor_frees"] > 0, totals


@needs_gpu
def test_train_gpt_with_pumps_allocator_on_the_gpu(gpt_env, tmp_path):
    """On a GPU, `[memory] torch_allocator = "pump"`: every tensor goes through libpump
    (pump/boot/sitecustomize.py installs it), and the losses and checksum stay bit-identical."""
    args = ["--device", "cuda", "--steps", "5"]
    _, bare_steps, bare_final = train_json(args, gpt_env)
    job = tmp_path / "job.toml"
    job.write_text('[memory]\ntorch_allocator = "pump"\n')
    stats_file = tmp_path / "stats.json"
    proc, steps, final = train_json(args, gpt_env,
                                    pump_run=(PUMP_RUN, "--config", str(job), "--stats", str(stats_file)))
    assert "not installed" not in proc.stderr, proc.stderr
    assert [s["loss_hex"] for s in steps] == [s["loss_hex"] for s in bare_steps]
    assert final["checksum_hex"] == bare_final["checksum_hex"]
    totals = json.loads(stats_file.read_text())["totals"]
    assert totals["torch_allocs"] > 0 and totals["torch_frees"] > 0, totals
    assert totals["managed_allocs"] >= totals["torch_allocs"] - totals["torch_frees"], totals
