"""The shim's fuzz targets (tests/fuzz, docs/fuzzing.md): what pumpd hands a
job (the reply to attach, the ring, the plan) against the shim's checks,
under AddressSanitizer and UndefinedBehaviorSanitizer.

The seed inputs replay with any compiler, and must reach the paths they are
named for; then libFuzzer (clang) mutates them for PUMP_FUZZ_SECONDS (20)
per target from seed PUMP_FUZZ_SEED (1), and must find nothing. CI installs
clang; elsewhere the libFuzzer part is skipped without it."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from helpers import clean_env
from pump import stats

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
import seeds  # noqa: E402

FUZZ_SECONDS = int(os.environ.get("PUMP_FUZZ_SECONDS", "20"))
FUZZ_SEED = int(os.environ.get("PUMP_FUZZ_SEED", "1"))
CLANGS = ("clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14")


@pytest.fixture(scope="module")
def seed_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("seeds")
    seeds.write(directory)
    return directory


def target_env(library_dir, stats_dir=None):
    env = clean_env()
    env.update(PUMP_SOCKET="", LD_LIBRARY_PATH=str(library_dir))
    if stats_dir is not None:
        env["PUMP_STATS_DIR"] = str(stats_dir)
    return env


def replay(c_build, target, inputs, tmp_path):
    stats_dir = tmp_path / f"stats-{target}"
    stats_dir.mkdir()
    proc = subprocess.run([str(c_build / "asan" / f"replay_{target}"), str(inputs)],
                          env=target_env(c_build / "asan", stats_dir), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [record] = stats.read_dir(stats_dir)
    return proc, record


def test_attach_seeds_replay_clean_and_the_valid_ones_attach(c_build, seed_dir, tmp_path):
    proc, record = replay(c_build, "attach", seed_dir / "attach", tmp_path)
    assert f"replayed {len(seeds.attach_seeds())} inputs" in proc.stdout
    # Two seeds attach and launch on the channel; the others are refused.
    assert record["events_written"] > 0 and record["launches"] > 0


@pytest.mark.parametrize("name", sorted(seeds.attach_seeds()))
def test_each_attach_seed_is_taken_or_refused_as_named(c_build, seed_dir, tmp_path, name):
    proc, record = replay(c_build, "attach", seed_dir / "attach" / name, tmp_path)
    attached = record["events_written"] > 0
    assert attached == (name in ("valid", "three_descriptors")), proc.stderr


def test_plan_seeds_replay_clean_and_reach_the_plan(c_build, seed_dir, tmp_path):
    proc, record = replay(c_build, "plan", seed_dir / "plan", tmp_path)
    assert f"replayed {len(seeds.plan_seeds())} inputs" in proc.stdout
    assert record["plan_triggers"] > 0            # triggers were found and carried out
    assert record["plan_evict_ranges"] > 0 and record["bytes_evicted"] > 0
    assert record["plan_ranges_skipped"] > 0      # and ones past the limits were counted
    assert record["plan_prefetch_skips"] > 0      # the plan's budget bit
    assert record["events_dropped"] > 0           # a scribbled tail reads as a full ring


@pytest.fixture(scope="module")
def fuzz_build():
    if not any(shutil.which(cc) for cc in CLANGS):
        if os.environ.get("CI"):
            pytest.fail("CI must fuzz: clang is missing (.ci/run installs clang and libclang-rt-dev)")
        pytest.skip("no clang: apt-get install clang libclang-rt-dev")
    build = subprocess.run([str(ROOT / "scripts" / "build-fuzz")], env=dict(os.environ, PYTHON=sys.executable),
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    return pathlib.Path(build.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("target", ["attach", "plan"])
def test_libfuzzer_finds_nothing(fuzz_build, seed_dir, tmp_path, target):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    proc = subprocess.run(
        [str(fuzz_build / f"fuzz_{target}"), f"-seed={FUZZ_SEED}", f"-max_total_time={FUZZ_SECONDS}",
         "-timeout=10", "-rss_limit_mb=2048", f"-artifact_prefix={tmp_path}/", str(corpus),
         str(seed_dir / target)],
        env=target_env(fuzz_build), capture_output=True, text=True, timeout=FUZZ_SECONDS + 120)
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-"))]
    assert proc.returncode == 0 and not crashes, (
        f"libFuzzer found {crashes} (replay: build/tests/asan/replay_{target} FILE):\n{proc.stderr[-6000:]}")
    done = [line for line in proc.stderr.splitlines() if line.startswith("Done ")]
    assert done, proc.stderr[-2000:]
    runs = int(done[-1].split()[1])
    assert runs >= 100, done[-1]
