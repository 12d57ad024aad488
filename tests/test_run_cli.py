"""pump-run end to end, as a subprocess (the installed console script).

Most tests point pump-run at a tiny empty shared library (PUMP_SHIM_PATH, the
developer override) to test pump-run alone; the transparency tests run with the
installed libpump.so as well.
"""

import json
import os
import pathlib
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import helpers
import pump
from pump import stats

PUMP_RUN = [helpers.PUMP_RUN]
IDLE = helpers.IDLE
GiB = 1 << 30


@pytest.fixture(scope="session")
def libdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("libs")
    for name in ("empty.so", "other.so"):
        subprocess.run(["cc", "-shared", "-o", str(d / name), "-x", "c", "/dev/null"], check=True)
    return d


@pytest.fixture
def env(libdir):
    e = helpers.clean_env()
    e["PUMP_SHIM_PATH"] = str(libdir / "empty.so")
    return e


def run(args, env, **kw):
    kw.setdefault("timeout", 60)
    return subprocess.run(args, env=env, capture_output=True, text=True, **kw)


def pump_run(args, env, **kw):
    return run(PUMP_RUN + list(args), env, **kw)


def one_line(text):
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


# --- options -------------------------------------------------------------------------

def test_version(env):
    r = pump_run(["--version"], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"pump-run {pump.__version__}\n", "")


def test_shim_path_installed(env):
    del env["PUMP_SHIM_PATH"]
    r = pump_run(["--shim-path"], env)
    assert r.returncode == 0, r.stderr
    path = pathlib.Path(r.stdout.strip())
    assert path.name == "libpump.so" and path.is_absolute() and path.is_file()


def test_shim_path_override(env):
    r = pump_run(["--shim-path"], env)
    assert (r.returncode, r.stdout) == (0, env["PUMP_SHIM_PATH"] + "\n")


def test_missing_shim_is_an_error(env, tmp_path):
    env["PUMP_SHIM_PATH"] = str(tmp_path / "nope.so")
    r = pump_run(["sh", "-c", "echo ran"], env)
    assert r.returncode == 2 and r.stdout == ""
    assert "nope.so" in one_line(r.stderr)


@pytest.mark.parametrize("value", ["12X", "0", "0%", "101%", "1.5G", "5 G", "-1", "HOST",
                                   "G", "%", "18446744073709551616", "20000000T"])
def test_bad_capacity(env, value):
    r = pump_run(["--capacity", value, "sh", "-c", "echo ran"], env)
    assert r.returncode == 2 and r.stdout == ""
    line = one_line(r.stderr)
    assert line.startswith("pump-run: ") and "--capacity" in line and repr(value) in line
    assert "8GiB" in line and "host" in line  # says what is allowed


@pytest.mark.parametrize("value", ["512MiB", "8G", "1073741824", "2TB", "7K", "1%", "100%",
                                   "host"])
def test_good_capacity_reaches_the_child(env, value):
    r = pump_run(["--capacity", value, "sh", "-c", 'printf %s "$PUMP_CAPACITY"'], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, value, IDLE)


def test_bad_policy(env):
    r = pump_run(["--policy", "fast", "sh", "-c", "echo ran"], env)
    assert r.returncode == 2 and r.stdout == ""
    line = one_line(r.stderr)
    assert "--policy" in line and "'fast'" in line and "launch" in line


def test_no_command(env):
    r = pump_run([], env)
    assert r.returncode == 2 and "no command" in one_line(r.stderr)


def test_options_stop_at_the_command(env):
    code = "import sys; print(sys.argv[1:])"
    r = pump_run(["--quiet", sys.executable, "-c", code, "--quiet", "-v", "--", "x"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "['--quiet', '-v', '--', 'x']\n"
    r = pump_run(["--", sys.executable, "-c", code, "--version"], env)
    assert r.stdout == "['--version']\n"


# --- the child's environment ---------------------------------------------------------

SHOW = 'printf "%s|%s|%s|%s" "$LD_PRELOAD" "${PUMP_POLICY-unset}" "${PUMP_CAPACITY-unset}" "${PUMP_LOG-unset}"'


def test_ld_preload_and_defaults(env):
    r = pump_run(["sh", "-c", SHOW], env)
    assert (r.returncode, r.stderr) == (0, IDLE)
    assert r.stdout == f"{env['PUMP_SHIM_PATH']}|unset|unset|unset"


def test_flags_set_pump_variables(env):
    r = pump_run(["--policy", "launch", "--capacity", "8G", "-vv", "sh", "-c", SHOW], env)
    assert r.stdout == f"{env['PUMP_SHIM_PATH']}|launch|8G|2"
    r = pump_run(["-v", "--policy", "off", "sh", "-c", SHOW], env)
    assert r.stdout == f"{env['PUMP_SHIM_PATH']}|off|unset|1"


@pytest.mark.parametrize("args,said", [
    (["--capcity", "8G", "true"], "pump-run: unrecognized arguments: --capcity; did you mean --capacity? (see pump-run --help)"),
    (["--policy", "lookahed", "true"], "did you mean lookahead? (see pump-run --help)"),
    (["--zzz", "true"], "pump-run: unrecognized arguments: --zzz (see pump-run --help)"),
])
def test_a_mistyped_option_or_choice_gets_a_did_you_mean(env, args, said):
    r = pump_run(args, env)
    assert r.returncode == 2 and one_line(r.stderr).endswith(said), r.stderr


@pytest.mark.parametrize("args,said", [
    (["simulte"], "did you mean simulate? (see pump --help)"),
    (["simulate", "x", "--gpu", "h100"], "did you mean h100-pcie or h100-sxm? (see pump simulate --help)"),
    (["simulate", "x", "--polcy", "launch"], "did you mean --policy? (see pump --help)"),
    (["trace", "stats", "--gpuu", "x"], "pump: unrecognized arguments: --gpuu (see pump --help)"),  # not simulate's --gpu
])
def test_pump_cli_did_you_mean(args, said):
    r = run([sys.executable, "-m", "pump.cli", *args], helpers.clean_env())
    assert r.returncode == 2 and one_line(r.stderr).endswith(said), r.stderr


def test_pump_off_runs_the_command_as_if_the_prefix_were_not_there(env):
    """PUMP=off: the command in pump-run's place (its pid, its exit code), nothing of pump in its
    environment, one line saying so; --quiet drops the line; another value is refused."""
    env = dict(env, PUMP="off")
    shown = SHOW + '; printf "|%s|%s" "${PYTORCH_CUDA_ALLOC_CONF-unset}" "${PUMP_MANAGED_ALL-unset}"; exit 3'
    r = pump_run(["--policy", "lookahead", "--capacity", "8G", "sh", "-c", shown], env)
    assert r.returncode == 3 and r.stdout == "|unset|unset|unset|unset|unset", r
    assert one_line(r.stderr) == "pump-run: PUMP=off: running without pump (no shim, no managed memory, no daemon)"
    r = pump_run(["--quiet", "true"], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r
    r = pump_run(["sh", "-c", "kill -TERM $$"], env)
    assert r.returncode == -signal.SIGTERM, r          # exec'd: no pump-run between it and us
    r = pump_run(["no-such-command-for-pump"], env)
    assert r.returncode == 127 and "no-such-command-for-pump: command not found" in r.stderr, r
    r = pump_run(["--serve-env"], env, input="")
    assert (r.returncode, r.stdout) == (0, "\0"), r
    for value in ("on", ""):
        r = pump_run(["sh", "-c", SHOW], dict(env, PUMP=value))
        assert (r.returncode, r.stdout) == (0, f"{env['PUMP_SHIM_PATH']}|unset|unset|unset"), r
    r = pump_run(["sh", "-c", "true"], dict(env, PUMP="no"))
    assert r.returncode == 2 and one_line(r.stderr) == "pump-run: PUMP='no': allowed: off (run the command without pump), on, or unset", r


# --- managed_all and PyTorch's allocator settings --------------------------------------

SHOW_MANAGED = ('printf "%s|%s|%s|%s" "${PUMP_MANAGED_ALL-unset}" "${PYTORCH_CUDA_ALLOC_CONF-unset}" '
                '"${PYTORCH_HIP_ALLOC_CONF-unset}" "${PYTORCH_ALLOC_CONF-unset}"')


def test_managed_all_is_on_by_default(env):
    r = pump_run(["sh", "-c", SHOW_MANAGED], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "1|unset|unset|expandable_segments:False", IDLE)


def test_no_managed_all_touches_no_allocator_setting(env):
    r = pump_run(["--no-managed-all", "sh", "-c", SHOW_MANAGED], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "0|unset|unset|unset", IDLE)
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    r = pump_run(["--no-managed-all", "sh", "-c", SHOW_MANAGED], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "0|expandable_segments:True|unset|unset", IDLE)


@pytest.mark.parametrize("user,shown", [
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"},
     "1|max_split_size_mb:128,expandable_segments:False|unset|unset"),
    ({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6"},
     "1|unset|unset|garbage_collection_threshold:0.6,expandable_segments:False"),
    # the variable PyTorch reads first gets the merge; the other is left as it was
    ({"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"},
     "1|expandable_segments:False|unset|max_split_size_mb:64"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, "1|expandable_segments:False|unset|unset"),
])
def test_allocator_settings_are_merged(env, user, shown):
    env.update(user)
    r = pump_run(["sh", "-c", SHOW_MANAGED], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, shown, IDLE)


def test_users_expandable_segments_win_with_one_notice(env):
    env["PYTORCH_ALLOC_CONF"] = "expandable_segments:True, max_split_size_mb:64"
    r = pump_run(["sh", "-c", SHOW_MANAGED], env)
    assert (r.returncode, r.stdout) == (0, "1|unset|unset|expandable_segments:True, max_split_size_mb:64")
    notice = one_line(r.stderr.removesuffix(IDLE))
    assert notice.startswith("pump-run: notice: PYTORCH_ALLOC_CONF sets expandable_segments:True: ")
    assert "cannot be managed" in notice and "device memory" in notice


def test_managed_all_from_the_config_file_and_the_flag_beats_it(env, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[memory]\nmanaged_all = false\n")
    r = pump_run(["--config", str(job), "sh", "-c", SHOW_MANAGED], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "0|unset|unset|unset", IDLE)
    r = pump_run(["--config", str(job), "--managed-all", "sh", "-c", SHOW_MANAGED], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "1|unset|unset|expandable_segments:False", IDLE)


@pytest.mark.parametrize("line,error", [
    ('managed_all = "yes"', 'managed_all: expected a boolean (true or false), got string "yes"'),
    ('torch_allocator = "cudaMallocAsync"',
     'torch_allocator: bad value "cudaMallocAsync"; allowed: "caching", "pump"'),
])
def test_bad_memory_setting_in_the_config_file(env, tmp_path, line, error):
    job = tmp_path / "job.toml"
    job.write_text(f"[memory]\n{line}\n")
    r = pump_run(["--config", str(job), "sh", "-c", "echo ran"], env)
    assert (r.returncode, r.stdout) == (2, "")
    assert one_line(r.stderr) == f"pump-run: {job}: [memory] {error}"


SHOW_TORCH = 'printf "%s|%s" "${PUMP_TORCH_ALLOCATOR-unset}" "${PYTHONPATH-unset}"'


def test_torch_allocator_pump_puts_the_start_up_hook_first(env, tmp_path):
    from pump import torch_env

    job = tmp_path / "job.toml"
    job.write_text('[memory]\ntorch_allocator = "pump"\n')
    env["PYTHONPATH"] = f"/mine{os.pathsep}{torch_env.BOOT_DIR}"
    r = pump_run(["--config", str(job), "sh", "-c", SHOW_TORCH], env)
    assert (r.returncode, r.stderr) == (0, IDLE)
    assert r.stdout == f"pump|{torch_env.BOOT_DIR}{os.pathsep}/mine"
    assert (torch_env.BOOT_DIR / "sitecustomize.py").is_file()


def test_managed_all_puts_the_hook_first_to_follow_the_caching_allocator(env, tmp_path):
    from pump import torch_env

    boot = str(torch_env.BOOT_DIR)
    assert pump_run(["sh", "-c", SHOW_TORCH], env).stdout == f"unset|{boot}"
    job = tmp_path / "job.toml"
    job.write_text('[memory]\ntorch_allocator = "caching"\n')
    assert pump_run(["--config", str(job), "sh", "-c", SHOW_TORCH], env).stdout == f"caching|{boot}"
    # Nothing managed, nothing to follow: no hook.
    r = pump_run(["--no-managed-all", "--config", str(job), "sh", "-c", SHOW_TORCH], env)
    assert r.stdout == "caching|unset"


def test_existing_ld_preload_is_kept_after_libpump(env, libdir):
    shim, other = env["PUMP_SHIM_PATH"], str(libdir / "other.so")
    env["LD_PRELOAD"] = other
    r = pump_run(["sh", "-c", 'printf %s "$LD_PRELOAD"'], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{shim}:{other}", IDLE)
    # already there (ld.so also splits on spaces): moved first, not repeated
    env["LD_PRELOAD"] = f"{other} {shim}"
    r = pump_run(["sh", "-c", 'printf %s "$LD_PRELOAD"'], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{shim}:{other}", IDLE)


def test_stats_dir_is_private_and_removed(env):
    show = 'printf %s "$PUMP_STATS_DIR"; stat -c %a "$PUMP_STATS_DIR" >&2'
    r = pump_run(["sh", "-c", show], env)
    assert r.returncode == 0
    assert r.stderr == "700\n" + IDLE
    assert r.stdout and not os.path.exists(r.stdout)


# --- transparency and exit codes -----------------------------------------------------

@pytest.mark.parametrize("shim", ["empty", "installed"], ids=["empty-shim", "libpump"])
@pytest.mark.parametrize("cmd", [
    [sys.executable, "-c", "print(1)"],
    [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(5)"],
    ["ls", "-a", "/"],
    ["ls", "/no/such/dir"],
], ids=["python-print", "python-exit5", "ls", "ls-missing"])
def test_same_as_the_bare_command(env, cmd, shim):
    if shim == "installed":
        del env["PUMP_SHIM_PATH"]
    bare = run(cmd, env)
    wrapped = pump_run(cmd, env)
    assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == \
        (bare.returncode, bare.stdout, bare.stderr + IDLE)


def test_exit_code(env):
    assert pump_run(["sh", "-c", "exit 3"], env).returncode == 3


def test_killed_by_signal(env):
    """Said as a shell says it (pump-run's own exit status hides the signal from the shell), with
    the exit status 128+N; SIGINT, as in a shell, says nothing."""
    r = pump_run(["sh", "-c", "kill -TERM $$"], env)
    assert (r.returncode, r.stderr) == (128 + signal.SIGTERM, "pump-run: the job was killed by SIGTERM (Terminated)\n" + IDLE)
    r = pump_run([sys.executable, "-c", "import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
                  "os.kill(os.getpid(), signal.SIGFPE)"], env)
    assert (r.returncode, r.stderr) == (128 + signal.SIGFPE,
                                        "pump-run: the job was killed by SIGFPE (Floating point exception)\n" + IDLE)
    assert pump_run(["sh", "-c", "kill -INT $$"], env).stderr == IDLE


def test_a_job_s_end_is_said_from_its_wait_status():
    from pump import run
    assert run.ending_of(0) is None and run.ending_of(3 << 8) == "the job exited with status 3"
    assert run.ending_of(signal.SIGSEGV | 0x80) == "the job was killed by SIGSEGV (Segmentation fault), core dumped"
    assert run.ending_of(signal.SIGKILL) == "the job was killed by SIGKILL (Killed)"


def test_command_not_found(env):
    r = pump_run(["no-such-command-pump-test", "x"], env)
    assert r.returncode == 127
    assert one_line(r.stderr) == "pump-run: no-such-command-pump-test: command not found"


def test_command_not_executable(env, tmp_path):
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    r = pump_run([str(script)], env)
    assert r.returncode == 126
    assert one_line(r.stderr) == f"pump-run: {script}: Permission denied"


# --- signals -------------------------------------------------------------------------

COUNTER = textwrap.dedent("""\
    import signal, sys, time
    n = 0
    def count(sig, frame):
        global n
        n += 1
    signal.signal(signal.SIGINT, count)
    signal.signal(signal.SIGTERM, count)
    print("ready", flush=True)
    deadline = time.monotonic() + 20
    while n == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # room for a second delivery
    print("count", n, flush=True)
""")


@pytest.fixture
def start():
    """Start pump-run in a session of its own (killed whole at teardown); wait for ready."""
    procs = []

    def start(args, env):
        p = subprocess.Popen(PUMP_RUN + args, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(p)
        assert p.stdout.readline() == "ready\n"
        return p

    yield start
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1],
                         ids=lambda sig: sig.name)
def test_signal_to_pump_run_is_forwarded_once(env, tmp_path, start, sig):
    script = tmp_path / "counter.py"
    script.write_text(COUNTER.replace("SIGTERM, count", f"{sig.name}, count"))
    p = start([sys.executable, str(script)], env)
    os.kill(p.pid, sig)
    out, err = p.communicate(timeout=30)
    assert (p.returncode, out, err) == (0, "count 1\n", IDLE)


def test_sigterm_kills_a_child_that_does_not_catch_it(env, start):
    p = start(["sh", "-c", "echo ready; exec sleep 30"], env)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 10


def test_sigterm_trapped_by_the_child(env, tmp_path, start):
    mark = tmp_path / "mark"
    p = start(["sh", "-c", 'trap \'echo term > "$0"; exit 7\' TERM; echo ready; '
               'while :; do sleep 0.05; done', str(mark)], env)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 7
    assert mark.read_text() == "term\n"


def test_ctrl_c_on_a_terminal_is_not_delivered_twice(env, tmp_path):
    """^C reaches the whole foreground process group: the child gets it once, directly."""
    script = tmp_path / "counter.py"
    script.write_text(COUNTER)
    pid, fd = pty.fork()
    if pid == 0:  # session leader with the pty as its controlling terminal
        try:
            os.execve(PUMP_RUN[0], PUMP_RUN + [sys.executable, str(script)], env)
        finally:
            os._exit(99)
    out = b""
    sent = False
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if not sent and b"ready" in out:
                os.write(fd, b"\x03")
                sent = True
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    chunk = os.read(fd, 1024)
                except OSError:  # EIO: the other side closed
                    break
                if not chunk:
                    break
                out += chunk
    finally:
        os.close(fd)
        for _ in range(50):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            os.killpg(pid, signal.SIGKILL)  # pty.fork's child leads its own session
            _, status = os.waitpid(pid, 0)
    assert sent, out
    assert b"count 1" in out, out
    assert os.waitstatus_to_exitcode(status) == 0


# --- records and the summary ---------------------------------------------------------

WRITER = textwrap.dedent("""\
    import os, subprocess, sys
    from pump import stats
    ffi = stats.get_ffi()

    def write(**fields):
        rec = ffi.new("struct pump_stats *")
        rec.magic, rec.version = stats.magic(), stats.version()
        rec.pid, rec.parent_pid = os.getpid(), os.getppid()
        for name, value in fields.items():
            setattr(rec, name, value)
        path = os.path.join(os.environ["PUMP_STATS_DIR"], f"pump-{os.getpid()}.stats")
        with open(path, "wb") as f:
            f.write(ffi.buffer(rec))

    if sys.argv[1:] == ["child"]:
        write(launches=234, launches_managed=200, prefetch_calls=7,
              prefetch_bytes=214748365, managed_bytes_peak=5)
        sys.exit(0)
    else:
        write(exited=1, launches=1000, launches_managed=800, prefetch_calls=50,
              prefetch_bytes=1 << 30, managed_bytes_peak=9)
        subprocess.run([sys.executable, __file__, "child"], check=True)
    if os.environ.get("CORRUPT"):
        with open(os.path.join(os.environ["PUMP_STATS_DIR"], "pump-1.stats"), "wb") as f:
            f.write(b"junk")
    print("done")
    sys.exit(int(os.environ.get("RC", "0")))
""")

SUMMARY = ("pump: 1234 launches (1000 on managed memory), 57 prefetch calls, "
           "1.2 GiB prefetched, 0 B evicted, 0 events dropped, 2 processes")


@pytest.fixture
def writer(tmp_path):
    path = tmp_path / "writer.py"
    path.write_text(WRITER)
    return [sys.executable, str(path)]


def test_summary_over_the_process_tree(env, writer, tmp_path):
    env["RC"] = "4"
    out = tmp_path / "stats.json"
    r = pump_run(["--stats", str(out)] + writer, env)
    assert (r.returncode, r.stdout) == (4, "done\n")
    assert r.stderr == SUMMARY + "; the job exited with status 4\n"
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == 4
    assert doc["command"] == writer
    t = doc["totals"]
    assert (t["processes"], t["launches"], t["launches_managed"]) == (2, 1234, 1000)
    assert t["prefetch_bytes"] == (1 << 30) + 214748365
    assert t["managed_bytes_peak"] == 9 and t["exited_processes"] == 1
    parent, child = sorted(doc["processes"], key=lambda rec: rec["launches"], reverse=True)
    assert child["parent_pid"] == parent["pid"]
    assert set(parent) == set(stats.fields())
    assert doc["bad_records"] == []


def test_quiet(env, writer):
    r = pump_run(["--quiet"] + writer, env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "done\n", "")


def test_a_job_that_never_used_cuda_gets_its_end_line_too(env):
    idle = "pump-run: pump was idle: no process of the job called the CUDA driver (a job on the CPU, " \
           "or CUDA never initialised)\n"
    for args in (["true"], ["-v", "true"]):
        r = pump_run(args, env)
        assert (r.returncode, r.stderr) == (0, idle), r.stderr
    r = pump_run(["--quiet", "true"], env)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr


def test_corrupt_record_is_reported_not_fatal(env, writer):
    env["CORRUPT"] = "1"
    r = pump_run(writer, env)
    assert r.returncode == 0
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and "pump-1.stats" in lines[0] and "warning" in lines[0]
    assert lines[1] == SUMMARY


def test_stats_without_records(env, tmp_path):
    out = tmp_path / "stats.json"
    r = pump_run(["--stats", str(out), "sh", "-c", "exit 0"], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", IDLE)
    doc = json.loads(out.read_text())
    assert doc["totals"]["processes"] == 0 and doc["processes"] == []


def test_stats_file_that_cannot_be_written(env, tmp_path):
    r = pump_run(["--stats", str(tmp_path / "no" / "dir.json"), "sh", "-c", "echo ran"], env)
    assert r.returncode == 2 and r.stdout == ""
    assert "--stats" in one_line(r.stderr)
