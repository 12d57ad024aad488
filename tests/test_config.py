"""pump.config (job files, pumpd.toml, precedence) and `pump config check`.

Error messages are promises (they name the file, the key and what is allowed), so
they are asserted exactly.
"""

import argparse
import io
import os
import pathlib
import subprocess
import sys
import textwrap
import types

import pytest

import helpers
from pump import cli, config
from pump.config import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PUMP = str(pathlib.Path(sys.executable).parent / "pump")  # the installed console script

JOB_SECTIONS = "[job], [prefetch], [memory], [trace], [daemon]"
DAEMON_SECTIONS = "[daemon], [metrics], [telemetry], [budgets], [limits]"
SIZE = ('an integer > 0 (bytes), or a string: a byte count > 0 with an optional unit '
        '(K, M, G, T or KiB, MiB, GiB, TiB: binary; KB, MB, GB, TB: decimal; any case) such as "512MiB" or "8G"')
CAPACITY = SIZE + ', a percentage of the device "1%".."100%", or "host"'
BUDGET = SIZE + ', or a percentage of the device "1%".."100%"'
NAME = "a string of 1 to 64 characters: a letter or digit, then letters, digits, '.', '_' or '-'"
PATH = "a non-empty string (a path)"
BOOL = "a boolean (true or false)"
LISTEN = ('a string "HOST:PORT": an IPv4 address or localhost, or [an IPv6 address], '
          'and a port 1..65535, e.g. "127.0.0.1:9400" or "[::1]:9400"; or the absolute '
          'path of a Unix socket (at most 107 bytes)')
INTERVAL = "a number > 0 and <= 3600 (seconds)"
POOL = SIZE + ', or a percentage of each GPU\'s memory "1%".."100%" (known through NVML)'
SHARE = "a number > 0 and <= 1000000 (the job's weight; default 1)"
PRIORITY = "an integer -1000..1000 (higher first; default 0)"
ARBITER_FIELDS = ("share", "min_budget", "max_budget", "priority")


def write(tmp_path, text, name="job.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def job_errors(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        config.load_job_file(path)
    return path, exc.value.errors


def daemon_errors(tmp_path, text):
    path = write(tmp_path, text, "pumpd.toml")
    with pytest.raises(ConfigError) as exc:
        config.load_daemon_file(path)
    return path, exc.value.errors


# --- reading the file ------------------------------------------------------------------------

def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError) as exc:
        config.load_job_file(path)
    assert exc.value.errors == [f"{path}: cannot read: No such file or directory"]


def test_directory(tmp_path):
    with pytest.raises(ConfigError) as exc:
        config.load_daemon_file(str(tmp_path))
    assert exc.value.errors == [f"{tmp_path}: cannot read: Is a directory"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    path = write(tmp_path, "[job]\n")
    os.chmod(path, 0)
    with pytest.raises(ConfigError) as exc:
        config.load_job_file(path)
    assert exc.value.errors == [f"{path}: cannot read: Permission denied"]


@pytest.mark.parametrize("text", ["[prefetch]\npolicy = \n", "[job]\nname = 'a'\n[job]\n", "x = [1,\n"])
def test_not_toml(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(tomllib.TOMLDecodeError) as parser:
        tomllib.loads(text)
    with pytest.raises(ConfigError) as exc:
        config.load_job_file(path)
    assert exc.value.errors == [f"{path}: not valid TOML: {parser.value}"]
    assert "(at " in str(exc.value)  # the parser's message says where


def test_not_utf8(tmp_path):
    path = tmp_path / "job.toml"
    path.write_bytes(b"[job]\nname = \"\xff\"\n")
    with pytest.raises(ConfigError) as exc:
        config.load_job_file(str(path))
    assert exc.value.errors == [f"{path}: not valid TOML: not UTF-8 text (byte 0xff at offset 14)"]


def test_empty_file_sets_nothing(tmp_path):
    cfg = config.load_job_file(write(tmp_path, ""))
    assert cfg == config.JobConfig()
    assert cfg.source == {}


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "job.toml"
    path.write_bytes(b"\xef\xbb\xbf[job]\nname = \"a\"\n")
    assert config.load_job_file(str(path)).name == "a"


# --- sections and keys ----------------------------------------------------------------------

def test_unknown_section(tmp_path):
    path, errors = job_errors(tmp_path, """
        [job]
        name = "a"
        [memroy]
        capacity = "8G"
    """)
    assert errors == [f"{path}: unknown section [memroy] (did you mean [memory]?); allowed: {JOB_SECTIONS}"]


def test_unknown_section_daemon_file(tmp_path):
    path, errors = daemon_errors(tmp_path, "[prefetch]\npolicy = \"off\"\n")
    assert errors == [f"{path}: unknown section [prefetch]; allowed: {DAEMON_SECTIONS}"]


def test_unknown_top_level_key_and_dotted_section(tmp_path):
    path, errors = job_errors(tmp_path, """
        policy = "off"
        [\"my section\".sub]
        x = 1
    """)
    assert errors == [
        f"{path}: unknown section [policy]; allowed: {JOB_SECTIONS}",
        f'{path}: unknown section ["my section"]; allowed: {JOB_SECTIONS}',
    ]


@pytest.mark.parametrize("section,allowed", [
    ("job", "name"),
    ("prefetch", "policy, wait, epoch_launches"),
    ("memory", "capacity, budget, share, min_budget, max_budget, priority, managed_all, torch_allocator, evict_ahead, "
               "torch_discards, torch_names, held_discards"),
    ("trace", "file"),
    ("daemon", "mode, socket"),
])
def test_unknown_key_job_file(tmp_path, section, allowed):
    path, errors = job_errors(tmp_path, f"[{section}]\nbogus = 1\n")
    assert errors == [f"{path}: [{section}] unknown key 'bogus'; allowed: {allowed}"]


@pytest.mark.parametrize("section,allowed", [
    ("daemon", "socket, jobs_dir, log_level"),
    ("metrics", "listen, per_job, max_jobs"),
    ("telemetry", "nvml, interval_s"),
    ("budgets", "default_budget, gpu_pool"),
])
def test_unknown_key_daemon_file(tmp_path, section, allowed):
    path, errors = daemon_errors(tmp_path, f"[{section}]\nbogus = 1\n")
    assert errors == [f"{path}: [{section}] unknown key 'bogus'; allowed: {allowed}"]


def test_a_key_of_another_section_is_unknown(tmp_path):
    # capacity belongs to [memory]; the daemon file's keys are not the job file's
    path, errors = job_errors(tmp_path, "[prefetch]\ncapacity = \"8G\"\n[daemon]\nlog_level = \"info\"\n")
    assert errors == [
        f"{path}: [prefetch] unknown key 'capacity'; allowed: policy, wait, epoch_launches",
        f"{path}: [daemon] unknown key 'log_level'; allowed: mode, socket",
    ]


def test_subtable_is_an_unknown_key(tmp_path):
    path, errors = job_errors(tmp_path, "[prefetch.extra]\nx = 1\n")
    assert errors == [f"{path}: [prefetch] unknown key 'extra'; allowed: policy, wait, epoch_launches"]


@pytest.mark.parametrize("text,section", [("job = 3\n", "job"), ('memory = "8G"\n', "memory"),
                                          ("trace = [1]\n", "trace")])
def test_section_not_a_table(tmp_path, text, section):
    path, errors = job_errors(tmp_path, text)
    assert errors == [f"{path}: [{section}] must be a table"]


def test_section_not_a_table_daemon_file(tmp_path):
    path, errors = daemon_errors(tmp_path, "telemetry = true\n")
    assert errors == [f"{path}: [telemetry] must be a table"]


# --- wrong types ----------------------------------------------------------------------------

@pytest.mark.parametrize("section,key,toml,expected,got", [
    ("job", "name", "3", NAME, "integer 3"),
    ("prefetch", "policy", "true", 'one of "off", "launch", "lookahead"', "boolean true"),
    ("prefetch", "wait", '"yes"', BOOL, 'string "yes"'),
    ("prefetch", "wait", "1", BOOL, "integer 1"),
    ("prefetch", "epoch_launches", '"5"', "an integer 1..4294967295", 'string "5"'),
    ("prefetch", "epoch_launches", "5.0", "an integer 1..4294967295", "float 5.0"),
    ("prefetch", "epoch_launches", "true", "an integer 1..4294967295", "boolean true"),
    ("memory", "capacity", "1.5", CAPACITY, "float 1.5"),
    ("memory", "capacity", "true", CAPACITY, "boolean true"),
    ("memory", "budget", '["8G"]', BUDGET, 'array ["8G"]'),
    ("memory", "share", '"2"', SHARE, 'string "2"'),
    ("memory", "share", "true", SHARE, "boolean true"),
    ("memory", "min_budget", "1.5", SIZE, "float 1.5"),
    ("memory", "max_budget", "false", SIZE, "boolean false"),
    ("memory", "priority", "1.0", PRIORITY, "float 1.0"),
    ("memory", "priority", '"high"', PRIORITY, 'string "high"'),
    ("memory", "managed_all", '"yes"', BOOL, 'string "yes"'),
    ("memory", "managed_all", "1", BOOL, "integer 1"),
    ("memory", "managed_all", '"true"', BOOL, 'string "true"'),
    ("memory", "torch_allocator", "true", 'one of "caching", "pump"', "boolean true"),
    ("trace", "file", "7", PATH, "integer 7"),
    ("daemon", "mode", "{ a = 1 }", 'one of "auto", "system", "embedded", "none"', "table {a = 1}"),
    ("daemon", "socket", "1979-05-27T07:32:00Z", PATH, "offset date-time 1979-05-27T07:32:00+00:00"),
])
def test_wrong_type_job_file(tmp_path, section, key, toml, expected, got):
    path, errors = job_errors(tmp_path, f"[{section}]\n{key} = {toml}\n")
    assert errors == [f"{path}: [{section}] {key}: expected {expected}, got {got}"]


def test_wrong_type_example_from_the_docs(tmp_path):
    path, errors = job_errors(tmp_path, '[prefetch]\nwait = "yes"\n')
    assert errors == [f'{path}: [prefetch] wait: expected a boolean (true or false), got string "yes"']


@pytest.mark.parametrize("section,key,toml,expected,got", [
    ("daemon", "socket", "false", PATH, "boolean false"),
    ("daemon", "jobs_dir", "[]", PATH, "array []"),
    ("daemon", "log_level", "2", 'one of "error", "warning", "info", "debug"', "integer 2"),
    ("metrics", "listen", "9400", LISTEN, "integer 9400"),
    ("telemetry", "nvml", '"true"', BOOL, 'string "true"'),
    ("telemetry", "interval_s", '"2s"', INTERVAL, 'string "2s"'),
    ("telemetry", "interval_s", "true", INTERVAL, "boolean true"),
    ("budgets", "default_budget", "1979-05-27", BUDGET, "local date 1979-05-27"),
    ("budgets", "gpu_pool", "true", POOL, "boolean true"),
])
def test_wrong_type_daemon_file(tmp_path, section, key, toml, expected, got):
    path, errors = daemon_errors(tmp_path, f"[{section}]\n{key} = {toml}\n")
    assert errors == [f"{path}: [{section}] {key}: expected {expected}, got {got}"]


@pytest.mark.parametrize("toml,shown", [
    ('"a\\"b\\\\c\\n\\u0001"', r'"a\"b\\c\n\u0001"'),   # escapes as TOML writes them
    ("'literal'", '"literal"'),
    ("-inf", "-inf"),
    ("nan", "nan"),
    ("0x10", "16"),
    ("07:32:00", "07:32:00"),
    ("[1, 'a', [true]]", '[1, "a", [true]]'),
    ('{ "a b" = 1 }', '{"a b" = 1}'),
])
def test_values_are_shown_as_toml(tmp_path, toml, shown):
    path, errors = job_errors(tmp_path, f"[prefetch]\nwait = {toml}\n")
    assert len(errors) == 1
    assert errors[0].startswith(f"{path}: [prefetch] wait: expected {BOOL}, got ")
    assert errors[0].endswith(" " + shown)


def test_long_values_are_cut_short(tmp_path):
    path, errors = job_errors(tmp_path, f'[prefetch]\npolicy = "{"x" * 500}"\n')
    assert errors == [f'{path}: [prefetch] policy: bad value "{"x" * 199}...; '
                      'allowed: "off", "launch", "lookahead"']


# --- bad values -----------------------------------------------------------------------------

@pytest.mark.parametrize("section,key,toml,allowed", [
    ("job", "name", '""', NAME),
    ("job", "name", '"-lead"', NAME),
    ("job", "name", '".hidden"', NAME),
    ("job", "name", '"a/b"', NAME),
    ("job", "name", '"a b"', NAME),
    ("job", "name", '"ok\\n"', NAME),
    ("job", "name", f'"{"a" * 65}"', NAME),
    ("prefetch", "policy", '"fast"', '"off", "launch", "lookahead"'),
    ("prefetch", "policy", '"Launch"', '"off", "launch", "lookahead"'),
    ("prefetch", "epoch_launches", "0", "an integer 1..4294967295"),
    ("prefetch", "epoch_launches", "-1", "an integer 1..4294967295"),
    ("prefetch", "epoch_launches", "4294967296", "an integer 1..4294967295"),
    ("trace", "file", '""', PATH),
    ("trace", "file", '"a\\u0000b"', PATH),
    ("daemon", "mode", '"daemon"', '"auto", "system", "embedded", "none"'),
    ("daemon", "socket", '""', PATH),
    ("memory", "share", "0", SHARE),
    ("memory", "share", "-1.5", SHARE),
    ("memory", "share", "1000001", SHARE),
    ("memory", "share", "nan", SHARE),
    ("memory", "share", "inf", SHARE),
    ("memory", "min_budget", '"50%"', SIZE),
    ("memory", "min_budget", "0", SIZE),
    ("memory", "max_budget", '"host"', SIZE),
    ("memory", "priority", "1001", PRIORITY),
    ("memory", "priority", "-1001", PRIORITY),
])
def test_bad_value_job_file(tmp_path, section, key, toml, allowed):
    path, errors = job_errors(tmp_path, f"[{section}]\n{key} = {toml}\n")
    assert errors == [f"{path}: [{section}] {key}: bad value {toml}; allowed: {allowed}"]


@pytest.mark.parametrize("section,key,toml,allowed", [
    ("daemon", "socket", '""', PATH),
    ("daemon", "jobs_dir", '""', PATH),
    ("daemon", "log_level", '"warn"', '"error", "warning", "info", "debug"'),
    ("metrics", "listen", '"127.0.0.1:0"', LISTEN),
    ("metrics", "listen", '"127.0.0.1:65536"', LISTEN),
    ("metrics", "listen", '"127.0.0.1"', LISTEN),
    ("metrics", "listen", '":9400"', LISTEN),
    ("metrics", "listen", '"::1:9400"', LISTEN),
    ("metrics", "listen", '"[::1]"', LISTEN),
    ("metrics", "listen", '"[127.0.0.1]:9400"', LISTEN),
    ("metrics", "listen", '"256.0.0.1:9400"', LISTEN),
    ("metrics", "listen", '"example.com:9400"', LISTEN),
    ("metrics", "listen", '"localhost:http"', LISTEN),
    ("telemetry", "interval_s", "0", INTERVAL),
    ("telemetry", "interval_s", "-1.5", INTERVAL),
    ("telemetry", "interval_s", "3600.5", INTERVAL),
    ("telemetry", "interval_s", "nan", INTERVAL),
    ("telemetry", "interval_s", "inf", INTERVAL),
    ("budgets", "default_budget", '"host"', BUDGET),
    ("budgets", "default_budget", "0", BUDGET),
    ("budgets", "gpu_pool", '"host"', POOL),
    ("budgets", "gpu_pool", '"101%"', POOL),
    ("budgets", "gpu_pool", "0", POOL),
])
def test_bad_value_daemon_file(tmp_path, section, key, toml, allowed):
    path, errors = daemon_errors(tmp_path, f"[{section}]\n{key} = {toml}\n")
    assert errors == [f"{path}: [{section}] {key}: bad value {toml}; allowed: {allowed}"]


def test_bad_value_example_from_the_docs(tmp_path):
    path, errors = job_errors(tmp_path, '[prefetch]\npolicy = "fast"\n')
    assert errors == [f'{path}: [prefetch] policy: bad value "fast"; allowed: "off", "launch", "lookahead"']


# --- sizes, capacity, budget ----------------------------------------------------------------

BAD_SIZES = ["0", "0MiB", "0G", "1.5G", "8gx", "8gibb", "8 G", " 8G", "8G ", "-1", "+1", "G", "", "1e9",
             "18446744073709551616", "16777216TiB", "\u0663G"]  # the last: Arabic-Indic digit 3
BAD_PERCENTS = ["0%", "101%", "%", "50 %", "1.5%", "-5%", "50%%"]


@pytest.mark.parametrize("value", BAD_SIZES + BAD_PERCENTS + ["HOST", "Host"])
@pytest.mark.parametrize("key,allowed", [("capacity", CAPACITY), ("budget", BUDGET)])
def test_bad_size_strings(tmp_path, key, allowed, value):
    path, errors = job_errors(tmp_path, f'[memory]\n{key} = "{value}"\n')
    assert errors == [f'{path}: [memory] {key}: bad value "{value}"; allowed: {allowed}']


@pytest.mark.parametrize("value", ["0", "-1", "18446744073709551616"])
@pytest.mark.parametrize("key,allowed", [("capacity", CAPACITY), ("budget", BUDGET)])
def test_bad_size_integers(tmp_path, key, allowed, value):
    path, errors = job_errors(tmp_path, f"[memory]\n{key} = {value}\n")
    assert errors == [f"{path}: [memory] {key}: bad value {value}; allowed: {allowed}"]


def test_host_is_a_capacity_not_a_budget(tmp_path):
    cfg = config.load_job_file(write(tmp_path, '[memory]\ncapacity = "host"\n'))
    assert cfg.capacity == "host"
    path, errors = job_errors(tmp_path, '[memory]\nbudget = "host"\n')
    assert errors == [f'{path}: [memory] budget: bad value "host"; allowed: {BUDGET}']


GOOD_SIZES = {"512MiB": 512 << 20, "8G": 8 << 30, "1073741824": 1 << 30, "2TB": 2 * 10**12, "7K": 7 << 10,
              "1": 1, "3KB": 3000, "5MB": 5 * 10**6, "1GB": 10**9, "1T": 1 << 40, "4TiB": 4 << 40,
              "9KiB": 9 << 10, "2GiB": 2 << 30, "007M": 7 << 20,
              "8gb": 8 * 10**9, "8gib": 8 << 30, "8g": 8 << 30, "3Kb": 3000, "1tIb": 1 << 40,  # as written, any case
              "18446744073709551615": (1 << 64) - 1, "16777215TiB": 16777215 << 40}


@pytest.mark.parametrize("value", list(GOOD_SIZES) + ["1%", "100%", "50%"])
@pytest.mark.parametrize("key", ["capacity", "budget"])
def test_good_size_strings(tmp_path, key, value):
    cfg = config.load_job_file(write(tmp_path, f'[memory]\n{key} = "{value}"\n'))
    assert getattr(cfg, key) == value
    assert cfg.source == {key: str(tmp_path / "job.toml")}


@pytest.mark.parametrize("key", ["capacity", "budget"])
def test_integer_sizes_are_bytes(tmp_path, key):
    cfg = config.load_job_file(write(tmp_path, f"[memory]\n{key} = 1_073_741_824\n"))
    assert getattr(cfg, key) == "1073741824"  # what the shim reads: bytes
    cfg = config.load_job_file(write(tmp_path, f"[memory]\n{key} = 1\n"))
    assert getattr(cfg, key) == "1"


def test_integer_sizes_daemon_default_budget(tmp_path):
    cfg = config.load_daemon_file(write(tmp_path, "[budgets]\ndefault_budget = 4096\ngpu_pool = 25769803776\n"))
    assert (cfg.default_budget, cfg.gpu_pool) == ("4096", "25769803776")


@pytest.mark.parametrize("text,n", GOOD_SIZES.items())
def test_parse_size(text, n):
    assert config.parse_size(text) == n


@pytest.mark.parametrize("text", BAD_SIZES + ["50%", "host"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError) as exc:
        config.parse_size(text)
    assert str(exc.value) == f"bad value {text!r}; allowed: {config.SIZE_ALLOWED}"


@pytest.mark.parametrize("text", ["512MiB", "8G", "1%", "100%", "host"])
def test_check_capacity_accepts(text):
    assert config.check_capacity(text) == text


@pytest.mark.parametrize("text", BAD_SIZES + BAD_PERCENTS + ["HOST"])
def test_check_capacity_rejects(text):
    with pytest.raises(ValueError) as exc:
        config.check_capacity(text)
    assert str(exc.value) == f"bad value {text!r}; allowed: {config.CAPACITY_ALLOWED}"
    assert "8GiB" in str(exc.value) and "host" in str(exc.value) and "1%..100%" in str(exc.value)


@pytest.mark.parametrize("text", ["512MiB", "8G", "1%", "100%"])
def test_check_budget_accepts(text):
    assert config.check_budget(text) == text


@pytest.mark.parametrize("text", BAD_SIZES + BAD_PERCENTS + ["host"])
def test_check_budget_rejects(text):
    with pytest.raises(ValueError) as exc:
        config.check_budget(text)
    assert str(exc.value) == f"bad value {text!r}; allowed: {config.BUDGET_ALLOWED}"
    assert "host" not in config.BUDGET_ALLOWED


def test_checkers_as_argparse_types_keep_their_message(capsys):
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--capacity", type=config.check_capacity)
    p.add_argument("--budget", type=config.check_budget)
    p.add_argument("--name", type=config.check_name)
    assert p.parse_args(["--capacity", "host", "--budget", "8G", "--name", "a.b"]).capacity == "host"
    with pytest.raises(SystemExit):
        p.parse_args(["--budget", "host"])
    assert f"argument --budget: bad value 'host'; allowed: {config.BUDGET_ALLOWED}" in capsys.readouterr().err


@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:9400", ("127.0.0.1", 9400)), ("0.0.0.0:1", ("0.0.0.0", 1)),
    ("localhost:65535", ("localhost", 65535)), ("[::1]:9400", ("::1", 9400)),
    ("[::]:80", ("::", 80)), ("[2001:db8::1]:443", ("2001:db8::1", 443)),
])
def test_parse_listen(text, expected):
    assert config.parse_listen(text) == expected


# --- several errors ---------------------------------------------------------------------------

def test_all_errors_are_collected_in_file_order(tmp_path):
    path, errors = job_errors(tmp_path, """
        [job]
        name = "my job"
        [prefetch]
        policy = "fast"
        wait = "yes"
        epoch_launches = 10
        extra = 1
        [memory]
        capacity = "8gx"
        budget = "host"
        [nope]
        [trace]
        file = ""
    """)
    assert errors == [
        f'{path}: [job] name: bad value "my job"; allowed: {NAME}',
        f'{path}: [prefetch] policy: bad value "fast"; allowed: "off", "launch", "lookahead"',
        f'{path}: [prefetch] wait: expected {BOOL}, got string "yes"',
        f"{path}: [prefetch] unknown key 'extra'; allowed: policy, wait, epoch_launches",
        f'{path}: [memory] capacity: bad value "8gx"; allowed: {CAPACITY}',
        f'{path}: [memory] budget: bad value "host"; allowed: {BUDGET}',
        f"{path}: unknown section [nope]; allowed: {JOB_SECTIONS}",
        f'{path}: [trace] file: bad value ""; allowed: {PATH}',
    ]
    with pytest.raises(ConfigError) as exc:
        config.load_job_file(path)
    assert str(exc.value) == "\n".join(errors)


def test_all_errors_are_collected_daemon_file(tmp_path):
    path, errors = daemon_errors(tmp_path, """
        [daemon]
        log_level = "loud"
        [metrics]
        listen = "localhost:0"
        [telemetry]
        nvml = 1
        interval_s = 0
    """)
    assert errors == [
        f'{path}: [daemon] log_level: bad value "loud"; allowed: "error", "warning", "info", "debug"',
        f'{path}: [metrics] listen: bad value "localhost:0"; allowed: {LISTEN}',
        f"{path}: [telemetry] nvml: expected {BOOL}, got integer 1",
        f"{path}: [telemetry] interval_s: bad value 0; allowed: {INTERVAL}",
    ]


# --- good files -----------------------------------------------------------------------------

FULL_JOB = """
    [job]
    name = "train-1.b_c"
    [prefetch]
    policy = "lookahead"
    wait = false
    epoch_launches = 4294967295
    [memory]
    capacity = "host"
    budget = "75%"
    managed_all = false
    torch_allocator = "pump"
    evict_ahead = false
    torch_discards = true
    torch_names = true
    held_discards = true
    [trace]
    file = "/tmp/t.trace"
    [daemon]
    mode = "embedded"
    socket = "/run/x.sock"
"""


def test_full_job_file(tmp_path):
    path = write(tmp_path, FULL_JOB)
    cfg = config.load_job_file(path)
    assert cfg == config.JobConfig(
        name="train-1.b_c", policy="lookahead", wait=False, epoch_launches=4294967295, capacity="host",
        budget="75%", managed_all=False, torch_allocator="pump", evict_ahead=False, torch_discards=True,
        torch_names=True, held_discards=True, trace_file="/tmp/t.trace",
        daemon_mode="embedded",
        daemon_socket="/run/x.sock", source={f: path for f in config.JOB_FIELDS if f not in ARBITER_FIELDS},
    )


def test_arbiter_terms(tmp_path):
    path = write(tmp_path, """
        [memory]
        share = 2.5
        min_budget = "1GiB"
        max_budget = 8589934592
        priority = -5
    """)
    cfg = config.load_job_file(path)
    assert (cfg.share, cfg.min_budget, cfg.max_budget, cfg.priority) == (2.5, "1GiB", "8589934592", -5)
    assert cfg.source == {f: path for f in ARBITER_FIELDS}
    assert config.budget_terms(cfg) == {"budget": None, "share": 2.5, "min_budget": 1 << 30,
                                        "max_budget": 8 << 30, "priority": -5}


@pytest.mark.parametrize("budget,terms", [
    ('"75%"', {"budget": None, "budget_percent": 75}),
    ('"2GiB"', {"budget": 2 << 30}),
    ("4096", {"budget": 4096}),
])
def test_budget_terms_of_a_fixed_budget(tmp_path, budget, terms):
    cfg = config.load_job_file(write(tmp_path, f"[memory]\nbudget = {budget}\n"))
    assert config.budget_terms(cfg) == terms


def test_a_fixed_budget_and_the_arbiter_s_terms_in_one_file(tmp_path):
    path, errors = job_errors(tmp_path, '[memory]\nbudget = "8G"\npriority = 3\n')
    assert errors == [f"{path}: [memory] budget: a fixed budget is not divided by the arbiter, so share, "
                      "min_budget, max_budget, priority do not apply with it; allowed: budget alone, or "
                      "those without budget"]


def test_min_budget_over_max_budget(tmp_path):
    path, errors = job_errors(tmp_path, '[memory]\nmin_budget = "8G"\nmax_budget = 4294967296\n')
    assert errors == [f"{path}: [memory] min_budget: 8G is more than max_budget 4294967296; "
                      "allowed: min_budget <= max_budget"]
    # Equal is allowed.
    config.load_job_file(write(tmp_path, '[memory]\nmin_budget = "4G"\nmax_budget = 4294967296\n'))


def test_min_budget_over_max_budget_across_files(tmp_path, jobs_dir):
    system = write(jobs_dir, '[memory]\nmax_budget = "4G"\n', "train.toml")
    cfg_file = write(tmp_path, '[job]\nname = "train"\n[memory]\nmin_budget = "8G"\n')
    with pytest.raises(ConfigError) as exc:
        config.resolve_job({}, cfg_file, None, jobs_dir=str(jobs_dir))
    assert exc.value.errors == [f"min_budget 8G (from {cfg_file}) is more than max_budget 4G (from {system}); "
                                "allowed: min_budget <= max_budget"]


def test_a_budget_flag_beats_the_files_terms(tmp_path, jobs_dir):
    write(jobs_dir, '[memory]\nshare = 3\npriority = 7\n', "train.toml")
    cfg_file = write(tmp_path, '[job]\nname = "train"\n')
    cfg = config.resolve_job({"budget": "1G"}, cfg_file, None, jobs_dir=str(jobs_dir))
    assert (cfg.budget, cfg.share, cfg.priority) == ("1G", 3, 7)
    # Both reach pumpd, whose arbiter keeps a fixed budget and leaves the terms unused.
    assert config.budget_terms(cfg) == {"budget": 1 << 30, "share": 3, "priority": 7}


def test_partial_job_file_sets_only_its_keys(tmp_path):
    path = write(tmp_path, "[prefetch]\nepoch_launches = 1\n")
    cfg = config.load_job_file(path)
    assert (cfg.epoch_launches, cfg.policy, cfg.wait, cfg.name) == (1, None, None, None)
    assert cfg.source == {"epoch_launches": path}


def test_name_of_64_characters(tmp_path):
    cfg = config.load_job_file(write(tmp_path, f'[job]\nname = "{"a" * 64}"\n'))
    assert cfg.name == "a" * 64


def test_daemon_file_defaults(tmp_path):
    path = write(tmp_path, "", "pumpd.toml")
    cfg = config.load_daemon_file(path)
    assert cfg == config.DaemonConfig(source={f: "default" for f in config.DAEMON_FIELDS})
    assert (cfg.socket, cfg.jobs_dir, cfg.log_level, cfg.metrics_listen, cfg.nvml, cfg.interval_s,
            cfg.default_budget, cfg.gpu_pool) == (None, "/etc/pump/jobs.d", "info", None, True, 2.0, None, None)


def test_daemon_file_full(tmp_path):
    path = write(tmp_path, """
        [daemon]
        socket = "/run/pump/pumpd.sock"
        jobs_dir = "/srv/pump/jobs.d"
        log_level = "debug"
        [metrics]
        listen = "/run/pumpd/metrics.sock"
        per_job = true
        max_jobs = 50
        [telemetry]
        nvml = false
        interval_s = 3600
        [budgets]
        default_budget = "50%"
        gpu_pool = "90%"
        [limits]
        connections_per_user = 64
        sessions_per_user = 32
        jobs_per_user = 16
        kernel_names_per_user = 1000
        allocations_per_user = 2000
        planned_blocks_per_user = 3000
        pending_records_per_user = 4000
        plan_overruns = 5
        plan_deadline_s = 2
    """, "pumpd.toml")
    cfg = config.load_daemon_file(path)
    assert cfg == config.DaemonConfig(
        socket="/run/pump/pumpd.sock", jobs_dir="/srv/pump/jobs.d", log_level="debug",
        metrics_listen="/run/pumpd/metrics.sock", metrics_per_job=True, metrics_max_jobs=50, nvml=False, interval_s=3600.0, default_budget="50%", gpu_pool="90%",
        limit_connections_per_user=64, limit_sessions_per_user=32, limit_jobs_per_user=16,
        limit_kernel_names_per_user=1000, limit_allocations_per_user=2000, limit_planned_blocks_per_user=3000,
        limit_pending_records_per_user=4000, limit_plan_overruns=5, limit_plan_deadline_s=2.0,
        source={f: path for f in config.DAEMON_FIELDS},
    )
    assert isinstance(cfg.interval_s, float)
    assert cfg.limits()["sessions_per_user"] == 32 and len(cfg.limits()) == 9


def test_metrics_per_job_needs_a_unix_socket(tmp_path):
    for listen in ('"127.0.0.1:9400"', None):
        text = "[metrics]\nper_job = true\n" + (f"listen = {listen}\n" if listen else "")
        path, errors = daemon_errors(tmp_path, text)
        assert errors == [f"{path}: [metrics] per_job = true needs listen to be a Unix socket's path "
                          "(over TCP every local user could read every job's name, pid and owner)"]


@pytest.mark.parametrize("listen", ['"/' + "a" * 107 + '"', '"/run/pump\\u0000x"', '"relative/metrics.sock"'])
def test_metrics_bad_unix_socket(tmp_path, listen):
    path, errors = daemon_errors(tmp_path, f"[metrics]\nlisten = {listen}\n")
    assert len(errors) == 1 and errors[0].startswith(f"{path}: [metrics] listen: bad value")


def test_daemon_file_partial_sources(tmp_path):
    path = write(tmp_path, "[telemetry]\ninterval_s = 0.25\n", "pumpd.toml")
    cfg = config.load_daemon_file(path)
    assert cfg.interval_s == 0.25 and cfg.nvml is True
    assert cfg.source["interval_s"] == path and cfg.source["nvml"] == "default"


# --- precedence -----------------------------------------------------------------------------

SYSTEM_JOB = """
    [prefetch]
    policy = "off"
    wait = false
    epoch_launches = 5
    [memory]
    capacity = "1G"
    budget = "1G"
    managed_all = false
    torch_allocator = "caching"
    [trace]
    file = "/sys.trace"
    [daemon]
    mode = "system"
    socket = "/sys.sock"
"""


@pytest.fixture
def jobs_dir(tmp_path):
    d = tmp_path / "jobs.d"
    d.mkdir()
    return d


def test_defaults(jobs_dir):
    cfg = config.resolve_job({}, None, None, jobs_dir=str(jobs_dir))
    assert cfg == config.JobConfig(policy="launch", wait=True, daemon_mode="auto", managed_all=True,
                                   source={f: "default" for f in config.JOB_FIELDS})


def test_flag_beats_file_beats_jobs_d_beats_default(tmp_path, jobs_dir):
    system = write(jobs_dir, SYSTEM_JOB, "train.toml")
    cfg_file = write(tmp_path, """
        [job]
        name = "train"
        [prefetch]
        policy = "lookahead"
        [memory]
        capacity = "2G"
        [trace]
        file = "/cfg.trace"
    """)
    cfg = config.resolve_job({"capacity": "3G", "wait": True}, cfg_file, None, jobs_dir=str(jobs_dir))
    assert cfg == config.JobConfig(
        name="train", policy="lookahead", wait=True, epoch_launches=5, capacity="3G", budget="1G",
        managed_all=False, torch_allocator="caching", trace_file="/cfg.trace", daemon_mode="system",
        daemon_socket="/sys.sock",
        source={"name": cfg_file, "policy": cfg_file, "wait": "flag", "epoch_launches": system,
                "capacity": "flag", "budget": system, "managed_all": system, "torch_allocator": system,
                "trace_file": cfg_file, "evict_ahead": "default", "torch_discards": "default",
                "torch_names": "default", "held_discards": "default",
                "daemon_mode": system,
                "daemon_socket": system, **{f: "default" for f in ARBITER_FIELDS}},
    )


@pytest.mark.parametrize("flag,file_value,jobs_d_value,expected,source", [
    (None, None, None, True, "default"),       # on by default
    (None, None, "false", False, "jobs.d"),
    (None, "true", "false", True, "config"),   # --config beats jobs.d
    (None, "false", "true", False, "config"),
    (True, "false", "false", True, "flag"),    # --managed-all beats both
    (False, "true", "true", False, "flag"),    # --no-managed-all too
])
def test_managed_all_precedence(tmp_path, jobs_dir, flag, file_value, jobs_d_value, expected, source):
    sources = {"default": "default", "flag": "flag"}
    if jobs_d_value is not None:
        sources["jobs.d"] = write(jobs_dir, f"[memory]\nmanaged_all = {jobs_d_value}\n", "train.toml")
    cfg_file = write(tmp_path, '[job]\nname = "train"\n'
                     + (f"[memory]\nmanaged_all = {file_value}\n" if file_value else ""))
    sources["config"] = cfg_file
    cfg = config.resolve_job({"managed_all": flag}, cfg_file, None, jobs_dir=str(jobs_dir))
    assert (cfg.managed_all, cfg.source["managed_all"]) == (expected, sources[source])
    assert config.job_env(cfg)["PUMP_MANAGED_ALL"] == ("1" if expected else "0")


def test_false_flag_beats_true_file(tmp_path, jobs_dir):
    cfg_file = write(tmp_path, "[prefetch]\nwait = true\n")
    cfg = config.resolve_job({"wait": False}, cfg_file, None, jobs_dir=str(jobs_dir))
    assert cfg.wait is False and cfg.source["wait"] == "flag"


def test_none_flags_are_not_given(tmp_path, jobs_dir):
    cfg_file = write(tmp_path, '[prefetch]\npolicy = "off"\n')
    cfg = config.resolve_job({"policy": None, "capacity": None}, cfg_file, None, jobs_dir=str(jobs_dir))
    assert (cfg.policy, cfg.source["policy"]) == ("off", cfg_file)
    assert (cfg.capacity, cfg.source["capacity"]) == (None, "default")


def test_jobs_d_beats_default(jobs_dir):
    system = write(jobs_dir, SYSTEM_JOB, "train.toml")
    cfg = config.resolve_job({}, None, "train", jobs_dir=str(jobs_dir))
    assert (cfg.name, cfg.source["name"]) == ("train", "flag")
    assert (cfg.policy, cfg.source["policy"]) == ("off", system)
    assert (cfg.wait, cfg.source["wait"]) == (False, system)
    assert (cfg.daemon_mode, cfg.source["daemon_mode"]) == ("system", system)


def test_name_flag_picks_the_jobs_d_file_over_the_config_files_name(tmp_path, jobs_dir):
    write(jobs_dir, '[prefetch]\npolicy = "off"\n', "a.toml")
    b = write(jobs_dir, '[prefetch]\npolicy = "lookahead"\n', "b.toml")
    cfg_file = write(tmp_path, '[job]\nname = "a"\n')
    cfg = config.resolve_job({}, cfg_file, "b", jobs_dir=str(jobs_dir))
    assert (cfg.name, cfg.source["name"]) == ("b", "flag")
    assert (cfg.policy, cfg.source["policy"]) == ("lookahead", b)
    # the name may come in flags too
    assert config.resolve_job({"name": "b"}, cfg_file, None, jobs_dir=str(jobs_dir)).policy == "lookahead"


def test_no_name_no_system_file(tmp_path, jobs_dir):
    write(jobs_dir, '[prefetch]\npolicy = "off"\n', "None.toml")
    write(jobs_dir, '[prefetch]\npolicy = "off"\n', ".toml")
    cfg_file = write(tmp_path, "[prefetch]\nwait = false\n")
    cfg = config.resolve_job({}, cfg_file, None, jobs_dir=str(jobs_dir))
    assert (cfg.name, cfg.policy, cfg.source["policy"]) == (None, "launch", "default")


def test_missing_jobs_d_file_is_fine(tmp_path, jobs_dir):
    cfg = config.resolve_job({}, None, "nobody", jobs_dir=str(jobs_dir))
    assert (cfg.name, cfg.policy) == ("nobody", "launch")
    cfg = config.resolve_job({}, None, "nobody", jobs_dir=str(tmp_path / "no-such-dir"))
    assert cfg.name == "nobody"


def test_broken_jobs_d_file_is_an_error(tmp_path, jobs_dir):
    system = write(jobs_dir, '[prefetch]\npolicy = "fast"\n', "train.toml")
    cfg_file = write(tmp_path, '[job]\nname = "train"\n')
    with pytest.raises(ConfigError) as exc:
        config.resolve_job({}, cfg_file, None, jobs_dir=str(jobs_dir))
    assert exc.value.errors == [f'{system}: [prefetch] policy: bad value "fast"; '
                                'allowed: "off", "launch", "lookahead"']


def test_not_toml_jobs_d_file_is_an_error(jobs_dir):
    system = write(jobs_dir, "[prefetch\n", "train.toml")
    with pytest.raises(ConfigError) as exc:
        config.resolve_job({}, None, "train", jobs_dir=str(jobs_dir))
    assert len(exc.value.errors) == 1
    assert exc.value.errors[0].startswith(f"{system}: not valid TOML: ")


def test_jobs_d_entry_that_is_a_directory_is_an_error(jobs_dir):
    (jobs_dir / "train.toml").mkdir()
    with pytest.raises(ConfigError) as exc:
        config.resolve_job({}, None, "train", jobs_dir=str(jobs_dir))
    assert exc.value.errors == [f"{jobs_dir / 'train.toml'}: cannot read: Is a directory"]


def test_errors_of_config_file_and_jobs_d_file_together(tmp_path, jobs_dir):
    system = write(jobs_dir, "[memory]\nbudget = 0\n", "train.toml")
    cfg_file = write(tmp_path, "[prefetch]\nwait = 1\n")
    with pytest.raises(ConfigError) as exc:
        config.resolve_job({}, cfg_file, "train", jobs_dir=str(jobs_dir))
    assert exc.value.errors == [
        f"{cfg_file}: [prefetch] wait: expected {BOOL}, got integer 1",
        f"{system}: [memory] budget: bad value 0; allowed: {BUDGET}",
    ]


def test_missing_config_file_is_an_error(tmp_path, jobs_dir):
    path = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError) as exc:
        config.resolve_job({}, path, None, jobs_dir=str(jobs_dir))
    assert exc.value.errors == [f"{path}: cannot read: No such file or directory"]


@pytest.mark.parametrize("name", ["../evil", "a/b", "", ".x"])
def test_bad_name_flag_is_an_error_and_no_file_is_read(tmp_path, jobs_dir, name):
    write(tmp_path, '[prefetch]\npolicy = "fast"\n', "evil.toml")  # jobs.d/../evil.toml: never read
    with pytest.raises(ConfigError) as exc:
        config.resolve_job({}, None, name, jobs_dir=str(jobs_dir))
    assert exc.value.errors == [f"--name: bad value {name!r}; allowed: {NAME}"]


def test_bad_flag_values_are_errors(jobs_dir):
    with pytest.raises(ConfigError) as exc:
        config.resolve_job({"policy": "fast", "budget": "host", "epoch_launches": 0}, None, None,
                           jobs_dir=str(jobs_dir))
    assert exc.value.errors == [
        "--policy: bad value 'fast'; allowed: \"off\", \"launch\", \"lookahead\"",
        f"--budget: bad value 'host'; allowed: {BUDGET}",
        "--epoch-launches: bad value 0; allowed: an integer 1..4294967295",
    ]


def test_unknown_flag_field_is_a_programming_error(jobs_dir):
    with pytest.raises(TypeError, match="bogus"):
        config.resolve_job({"bogus": 1}, None, None, jobs_dir=str(jobs_dir))


# --- the shim's environment -----------------------------------------------------------------

def test_job_env_all(tmp_path, jobs_dir):
    cfg = config.resolve_job({}, write(tmp_path, FULL_JOB), None, jobs_dir=str(jobs_dir))
    assert config.job_env(cfg) == {
        "PUMP_POLICY": "lookahead", "PUMP_WAIT": "0", "PUMP_EPOCH_LAUNCHES": "4294967295",
        "PUMP_CAPACITY": "host", "PUMP_BUDGET": "75%", "PUMP_NAME": "train-1.b_c", "PUMP_MANAGED_ALL": "0",
        "PUMP_TORCH_ALLOCATOR": "pump", "PUMP_EVICT_AHEAD": "0", "PUMP_TORCH_DISCARDS": "1", "PUMP_TORCH_NAMES": "1",
        "PUMP_HELD_DISCARDS": "1",
    }


@pytest.mark.parametrize("toml,env", [("true", "1"), ("false", "0"), ('"poison"', "poison")])
def test_torch_discards_takes_a_boolean_or_poison(tmp_path, jobs_dir, toml, env):
    cfg = config.resolve_job({}, write(tmp_path, f"[memory]\ntorch_discards = {toml}\n"), None, jobs_dir=str(jobs_dir))
    assert config.job_env(cfg)["PUMP_TORCH_DISCARDS"] == env


@pytest.mark.parametrize("toml,message", [
    ('"yes"', 'bad value "yes"; allowed: true, false or "poison" (dead tensors written with NaN instead: a diagnostic)'),
    ("1", 'expected true, false or "poison" (dead tensors written with NaN instead: a diagnostic), got integer 1'),
])
def test_torch_discards_refuses_anything_else(tmp_path, toml, message):
    path, errors = job_errors(tmp_path, f"[memory]\ntorch_discards = {toml}\n")
    assert errors == [f"{path}: [memory] torch_discards: {message}"]


def test_job_env_only_what_is_set(jobs_dir):
    cfg = config.resolve_job({}, None, None, jobs_dir=str(jobs_dir))
    assert config.job_env(cfg) == {"PUMP_POLICY": "launch", "PUMP_WAIT": "1", "PUMP_MANAGED_ALL": "1"}
    assert config.job_env(config.JobConfig()) == {}
    assert config.job_env(config.JobConfig(capacity="8G")) == {"PUMP_CAPACITY": "8G"}


# --- pump config check ----------------------------------------------------------------------

def pump(*args, **kw):
    return subprocess.run([PUMP, *args], env=helpers.clean_env(), capture_output=True, text=True,
                          timeout=60, **kw)


def test_check_ok(tmp_path):
    path = write(tmp_path, FULL_JOB)
    r = pump("config", "check", path)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{path}: ok\n", "")


def test_check_errors(tmp_path):
    path = write(tmp_path, '[prefetch]\npolicy = "fast"\nwait = "yes"\n')
    r = pump("config", "check", path)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f'{path}: [prefetch] policy: bad value "fast"; allowed: "off", "launch", "lookahead"\n'
                        f'{path}: [prefetch] wait: expected {BOOL}, got string "yes"\n')


def test_check_missing_file():
    r = pump("config", "check", "/no/such/job.toml")
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "/no/such/job.toml: cannot read: No such file or directory\n")


def test_check_several_files(tmp_path):
    good = write(tmp_path, FULL_JOB, "good.toml")
    bad = write(tmp_path, "[x]\n", "bad.toml")
    r = pump("config", "check", good, bad, good)
    assert (r.returncode, r.stdout) == (1, f"{good}: ok\n{good}: ok\n")
    assert r.stderr == f"{bad}: unknown section [x]; allowed: {JOB_SECTIONS}\n"


def test_check_suggests_the_nearest_key_and_section(tmp_path):
    path = write(tmp_path, '[prefetch]\npolcy = "launch"\nbogus = 1\n[memroy]\n[Daemon]\n')
    r = pump("config", "check", path)
    assert r.returncode == 1 and r.stderr.splitlines() == [
        f"{path}: [prefetch] unknown key 'polcy' (did you mean 'policy'?); allowed: policy, wait, epoch_launches",
        f"{path}: [prefetch] unknown key 'bogus'; allowed: policy, wait, epoch_launches",
        f"{path}: unknown section [memroy] (did you mean [memory]?); allowed: {JOB_SECTIONS}",
        f"{path}: unknown section [Daemon] (did you mean [daemon]?); allowed: {JOB_SECTIONS}",
    ]


@pytest.mark.parametrize("memory,warnings", [
    ('capacity = 4096', ["capacity '4096' is under 1 MiB"]),
    ('capacity = "64MiB"\nbudget = "1MiB"', ["budget '1MiB' is under one 2 MiB block"]),
    ('capacity = "1GiB"\nbudget = "2GiB"', ["budget '2GiB' is above capacity '1GiB'"]),
    ('capacity = "1GiB"\nmax_budget = "4GiB"', ["max_budget '4GiB' is above capacity '1GiB'"]),
    ('capacity = "50%"\nbudget = "2GiB"', []),     # a percentage is the device's: not judged here
    ('capacity = "host"\nbudget = "8GiB"', []),
])
def test_check_warns_on_implausible_values_and_accepts_them(tmp_path, memory, warnings):
    path = write(tmp_path, f"[memory]\n{memory}\n")
    r = pump("config", "check", path)
    assert (r.returncode, r.stdout) == (0, f"{path}: ok\n"), r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == len(warnings), r.stderr
    for line, expected in zip(lines, warnings):
        assert line.startswith(f"{path}: warning: [memory] {expected}"), line


def test_check_warns_on_a_daemon_default_budget_above_the_pool(tmp_path):
    path = write(tmp_path, '[budgets]\ndefault_budget = "40GiB"\ngpu_pool = "20GiB"\n', "pumpd.toml")
    r = pump("config", "check", "--daemon", path)
    assert r.returncode == 0 and r.stderr == (f"{path}: warning: [budgets] default_budget '40GiB' is above "
                                              "gpu_pool '20GiB': no job could be given it\n")


def test_check_daemon_file(tmp_path):
    path = write(tmp_path, '[metrics]\nlisten = "127.0.0.1:9400"\n[budgets]\ndefault_budget = "8G"\n', "pumpd.toml")
    r = pump("config", "check", "--daemon", path)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{path}: ok\n", "")
    # the same file is not a job file
    r = pump("config", "check", path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [f"{path}: unknown section [metrics]; allowed: {JOB_SECTIONS}",
                                     f"{path}: unknown section [budgets]; allowed: {JOB_SECTIONS}"]


def test_check_daemon_file_errors(tmp_path):
    path = write(tmp_path, '[daemon]\nlog_level = "loud"\n', "pumpd.toml")
    r = pump("config", "check", path, "--daemon")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f'{path}: [daemon] log_level: bad value "loud"; '
                        'allowed: "error", "warning", "info", "debug"\n')


def test_example_job_file_is_accepted_and_complete():
    path = str(ROOT / "examples" / "job.toml")
    r = pump("config", "check", path)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{path}: ok\n", "")
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    assert list(doc) == list(config.JOB_SCHEMA)  # every section, in order
    assert "#" in open(path).read()
    cfg = config.load_job_file(path)
    assert cfg.name and cfg.policy and cfg.capacity and cfg.budget and cfg.trace_file and cfg.daemon_mode
    assert cfg.managed_all is True


@pytest.mark.parametrize("args,line", [
    ([], "pump: the following arguments are required: COMMAND (see pump --help)"),
    (["config"], "pump: the following arguments are required: SUBCOMMAND (see pump config --help)"),
    (["config", "check"], "pump: the following arguments are required: FILE (see pump config check --help)"),
    (["frob"], "pump: argument COMMAND: invalid choice: 'frob' (choose from 'config', 'status', 'trace', 'simulate') "
               "(see pump --help)"),
    (["config", "check", "--bogus", "x"], "pump: unrecognized arguments: --bogus (see pump --help)"),
])
def test_usage_errors_are_one_line_exit_2(args, line):
    r = pump(*args)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == [line]


def test_version():
    r = pump("--version")
    assert r.returncode == 0 and r.stdout.startswith("pump ")


# --- pump status (pump/status.py is its own module) -----------------------------------------

def test_status_calls_pump_status_main(monkeypatch):
    seen = []
    fake = types.ModuleType("pump.status")
    fake.main = lambda args: seen.append(args.json) or 7
    monkeypatch.setitem(sys.modules, "pump.status", fake)
    assert cli.main(["status", "--json"]) == 7
    assert cli.main(["status"]) == 7
    assert seen == [True, False]


def test_status_missing_dependency_is_not_hidden(monkeypatch):
    def import_module(name):
        raise ModuleNotFoundError("No module named 'somedep'", name="somedep")
    monkeypatch.setattr(cli.importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError, match="somedep"):
        cli.main(["status"])


# --- what a config file may be --------------------------------------------------------------

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_file_is_refused_after_1_mib(device):
    with pytest.raises(ConfigError) as exc:
        config.load_job_file(device)
    assert exc.value.errors == [f"{device}: more than 1 MiB: not a config file (pump's hold a few settings)"]


def test_a_file_past_1_mib_is_refused_and_one_within_is_read(tmp_path):
    big = write(tmp_path, "# pad\n" * ((1 << 20) // 6 + 1), "big.toml")
    with pytest.raises(ConfigError) as exc:
        config.load_job_file(big)
    assert exc.value.errors == [f"{big}: more than 1 MiB: not a config file (pump's hold a few settings)"]
    fits = write(tmp_path, "#" * ((1 << 20) - 40) + '\n[prefetch]\npolicy = "off"\n', "fits.toml")
    assert config.load_job_file(fits).policy == "off"


def test_a_pipe_standard_input_and_a_fifo_nobody_writes(tmp_path, monkeypatch):
    """--config <(...) and - are read; a FIFO with no writer reads as empty, not a hang."""
    read, write_end = os.pipe()
    os.write(write_end, b'[prefetch]\npolicy = "off"\n')
    os.close(write_end)
    assert config.load_job_file(f"/dev/fd/{read}").policy == "off"
    os.close(read)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'[prefetch]\npolicy = "launch"\n')))
    assert config.load_job_file("-").policy == "launch"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert config.load_job_file(str(fifo)).policy is None
