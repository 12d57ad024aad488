"""pumpd as a systemd service: sd_notify, socket activation and journald
prefixes (pumpd/systemd.py), the unit file and scripts/install-service, all
without systemd running (--root stages the files in a temporary directory)."""

import grp
import io
import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from pumpd.systemd import JournalFormatter, listen_fds, notify, stderr_is_journal  # noqa: E402

INSTALL = ROOT / "scripts" / "install-service"
TEMPLATE = ROOT / "scripts" / "pumpd.service"
SOCKET_TEMPLATE = ROOT / "scripts" / "pumpd.socket"
ADMIN_SOCKET_TEMPLATE = ROOT / "scripts" / "pumpd-admin.socket"

# -- sd_notify ----------------------------------------------------------------


def test_notify_path_socket(tmp_path, monkeypatch):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(tmp_path / "notify"))
        s.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
        assert notify("READY=1") is True
        assert s.recv(4096) == b"READY=1"
        assert notify("STATUS=serving 2 jobs\nWATCHDOG=1") is True
        assert s.recv(4096) == b"STATUS=serving 2 jobs\nWATCHDOG=1"
        assert notify("STATUS=\udcff") is False   # unencodable: no exception, nothing sent


def test_notify_abstract_socket(monkeypatch):
    name = f"pump-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1") is True
        assert s.recv(4096) == b"READY=1"


@pytest.mark.parametrize("value", [None, "", "/nonexistent/pump/notify", "@pump-nobody-listens-here",
                                   "vsock:2:1234", "relative/path"])
def test_notify_never_raises(value, monkeypatch):
    if value is None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    else:
        monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert notify("READY=1") is False


# -- socket activation ----------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from pumpd.systemd import listen_fds
    env = lambda: sorted(v for v in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES") if v in os.environ)
    try:
        socks = listen_fds()
    except ValueError as e:
        print(json.dumps({"error": str(e), "env": env()}))
        sys.exit(0)
    out = {"fds": [s.fileno() for s in socks], "env": env(),
           "inheritable": [s.get_inheritable() for s in socks]}
    for s in socks:
        conn, _ = s.accept()
        conn.sendall(b"hello from pumpd")
        conn.close()
    print(json.dumps(out))
""")


def activate(sock, pid="$$"):
    """Run CHILD the way systemd would: ``sock`` at fd 3, LISTEN_PID its pid."""
    fd = sock.fileno()
    shell = f'exec 3<&{fd} {fd}<&-; export LISTEN_PID={pid} LISTEN_FDS=1 LISTEN_FDNAMES=pumpd.socket; exec "$0" -c "$1" "$2"'
    return subprocess.Popen(["bash", "-c", shell, sys.executable, CHILD, str(ROOT / "daemon")],
                            pass_fds=[fd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc):
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return json.loads(out)


def test_listen_fds_unix_listener(tmp_path):
    path = str(tmp_path / "pumpd.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as lsock:
        lsock.bind(path)
        lsock.listen()
        proc = activate(lsock)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(10)
        c.connect(path)
        assert c.recv(100) == b"hello from pumpd"
    r = finish(proc)
    assert r == {"fds": [3], "env": [], "inheritable": [False]}


def test_listen_fds_rejects_socketpair():
    """A connected (not listening) stream socket is not what pumpd can serve on."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        r = finish(activate(a))
    assert "fd 3" in r["error"] and "not listening" in r["error"] and r["env"] == []


def test_listen_fds_rejects_tcp():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = finish(activate(s))
    assert "AF_INET" in r["error"] and "AF_UNIX" in r["error"]


def test_listen_fds_rejects_non_socket():
    rfd, wfd = os.pipe()
    try:
        proc = subprocess.Popen(
            ["bash", "-c", f'exec 3<&{rfd}; export LISTEN_PID=$$ LISTEN_FDS=1; exec "$0" -c "$1" "$2"',
             sys.executable, CHILD, str(ROOT / "daemon")],
            pass_fds=[rfd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        r = finish(proc)
    finally:
        os.close(rfd)
        os.close(wfd)
    assert "fd 3 is not a socket" in r["error"]


def test_listen_fds_other_pid(tmp_path):
    """Variables meant for our parent: no sockets, and the variables are gone."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as lsock:
        lsock.bind(str(tmp_path / "s"))
        lsock.listen()
        r = finish(activate(lsock, pid="1"))
    assert r == {"fds": [], "env": [], "inheritable": []}


def test_listen_fds_without_activation(monkeypatch):
    for v in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        monkeypatch.delenv(v, raising=False)
    assert listen_fds() == []
    monkeypatch.setenv("LISTEN_PID", "12x")
    monkeypatch.setenv("LISTEN_FDS", "1")
    with pytest.raises(ValueError, match="malformed"):
        listen_fds()
    assert "LISTEN_PID" not in os.environ and "LISTEN_FDS" not in os.environ


# -- journald ------------------------------------------------------------------


def test_journal_formatter():
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JournalFormatter())
    logger = logging.getLogger("pumpd.test_journal")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        logger.debug("d")
        logger.info("i")
        logger.warning("w")
        logger.error("e")
        logger.critical("c")
        try:
            raise KeyError("boom")
        except KeyError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    lines = buf.getvalue().splitlines()
    assert lines[:5] == ["<7>pumpd.test_journal: d", "<6>pumpd.test_journal: i", "<4>pumpd.test_journal: w",
                         "<3>pumpd.test_journal: e", "<2>pumpd.test_journal: c"]
    tb = lines[5:]
    assert tb[0] == "<3>pumpd.test_journal: failed" and len(tb) > 3
    assert all(line.startswith("<3>") for line in tb)
    assert tb[-1] == "<3>KeyError: 'boom'"
    f = JournalFormatter("%(levelname)s %(message)s")
    rec = logging.LogRecord("pumpd", logging.INFO, __file__, 1, "two\nlines", None, None)
    assert f.format(rec) == "<6>INFO two\n<6>lines"


def test_stderr_is_journal(monkeypatch):
    st = os.fstat(2)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert stderr_is_journal()
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")  # inherited, stderr redirected
    assert not stderr_is_journal()
    monkeypatch.setenv("JOURNAL_STREAM", "garbage")
    assert not stderr_is_journal()
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not stderr_is_journal()


# -- the unit and install-service -------------------------------------------------


def install(*args, env=None):
    return subprocess.run([str(INSTALL), *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=env if env is not None else os.environ)


def unit_directives(text):
    """{(section, key): [values]} of a unit file (comments skipped)."""
    out, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def load_toml(path):
    try:
        import tomllib
    except ImportError:
        tomllib = pytest.importorskip("tomli")
    with open(path, "rb") as f:
        return tomllib.load(f)


def test_unit_file_directives():
    d = unit_directives(TEMPLATE.read_text())
    want = {
        "Type": "notify", "NotifyAccess": "main", "WatchdogSec": "30",
        "ExecStart": "@PUMPD@ --foreground --config /etc/pump/pumpd.toml",
        "User": "pump", "Group": "pump", "RuntimeDirectory": "pumpd", "RuntimeDirectoryMode": "0710",
        "ConfigurationDirectory": "pump", "Restart": "on-failure", "NoNewPrivileges": "yes",
        "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "UMask": "0077",
        "CapabilityBoundingSet": "", "SystemCallArchitectures": "native", "IPAddressDeny": "any",
        "IPAddressAllow": "localhost", "LimitNOFILE": "65536", "RestrictNamespaces": "yes",
    }
    for key, value in want.items():
        assert d.get(("Service", key)) == [value], key
    assert d[("Service", "SystemCallFilter")] == ["@system-service", "~@privileged"]
    assert d[("Unit", "Requires")] == ["pumpd.socket pumpd-admin.socket"]
    assert d[("Service", "Sockets")] == ["pumpd.socket pumpd-admin.socket"]
    assert d[("Install", "WantedBy")] == ["multi-user.target"]
    # NVML must still see /dev/nvidia*; a group the system may lack would stop the unit
    assert ("Service", "PrivateDevices") not in d
    assert ("Service", "SupplementaryGroups") not in d
    assert "#SupplementaryGroups=video" in TEMPLATE.read_text()
    # The service never binds the socket itself (clients would refuse a non-root listener).
    assert ("Service", "ReadWritePaths") not in d


def test_socket_unit():
    d = unit_directives(SOCKET_TEMPLATE.read_text())
    assert d[("Socket", "ListenStream")] == ["/run/pump/pumpd.sock"]
    assert d[("Socket", "SocketMode")] == ["0666"] and d[("Socket", "SocketUser")] == ["root"]
    assert d[("Socket", "Accept")] == ["no"]
    assert d[("Install", "WantedBy")] == ["sockets.target"]


def test_admin_socket_unit():
    """The administrator's socket: root's alone, in a directory of root's (pump/admin.py)."""
    from pump import admin
    d = unit_directives(ADMIN_SOCKET_TEMPLATE.read_text())
    assert d[("Socket", "ListenStream")] == [admin.ADMIN_SOCKET]
    assert d[("Socket", "SocketMode")] == ["0600"] and d[("Socket", "DirectoryMode")] == ["0700"]
    assert d[("Socket", "SocketUser")] == ["root"] and d[("Socket", "SocketGroup")] == ["root"]
    assert d[("Socket", "FileDescriptorName")] == [admin.ADMIN_FD_NAME]
    assert d[("Socket", "Service")] == ["pumpd.service"]


# The unit scored 7.1 (MEDIUM) before it was hardened and 1.6 (OK) after; a change
# that weakens it past this fails.
EXPOSURE_MAX = 2.0


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze (Debian: apt-get install systemd)")
def test_security_exposure(tmp_path):
    r = install("--root", tmp_path, "--pumpd", shutil.which("true"))
    assert r.returncode == 0, r.stderr
    unit = tmp_path / "etc/systemd/system/pumpd.service"
    v = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
                       capture_output=True, text=True, timeout=60)
    import re
    m = re.search(r"Overall exposure level for pumpd.service: ([0-9.]+)", v.stdout)
    assert m, v.stdout + v.stderr
    assert float(m.group(1)) <= EXPOSURE_MAX, v.stdout


def test_install_root(tmp_path):
    r = install("--root", tmp_path, "--pumpd", "/opt/pump/bin/pumpd")
    assert r.returncode == 0, r.stderr
    assert "no user created" in r.stdout and "systemctl not run" in r.stdout
    unit = tmp_path / "etc/systemd/system/pumpd.service"
    text = unit.read_text()
    assert "@PUMPD@" not in text
    d = unit_directives(text)
    assert d[("Service", "ExecStart")] == ["/opt/pump/bin/pumpd --foreground --config /etc/pump/pumpd.toml"]
    assert d[("Service", "Type")] == ["notify"] and d[("Service", "User")] == ["pump"]
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    socket_unit = tmp_path / "etc/systemd/system/pumpd.socket"
    assert socket_unit.read_text() == SOCKET_TEMPLATE.read_text()
    admin_unit = tmp_path / "etc/systemd/system/pumpd-admin.socket"
    assert admin_unit.read_text() == ADMIN_SOCKET_TEMPLATE.read_text()
    conf = tmp_path / "etc/pump/pumpd.toml"
    assert load_toml(conf) == {}           # all comments: pumpd's defaults, metrics off
    assert '#listen = "127.0.0.1:' in conf.read_text()
    # Every commented-out setting, switched on, is a valid pumpd.toml.
    import re
    from pump import config
    enabled = tmp_path / "enabled.toml"
    enabled.write_text(re.sub(r"(?m)^#(\[|\w+ = )", r"\1", conf.read_text()))
    cfg = config.load_daemon_file(str(enabled))
    assert cfg.metrics_listen and cfg.socket == "/run/pump/pumpd.sock" and cfg.default_budget
    assert (tmp_path / "etc/pump/jobs.d").is_dir()

    # a second install keeps the administrator's configuration
    conf.write_text('# mine\n')
    r = install("--root", tmp_path, "--pumpd", "/usr/local/bin/pumpd")
    assert r.returncode == 0, r.stderr
    assert "kept the existing" in r.stdout and conf.read_text() == "# mine\n"
    assert "ExecStart=/usr/local/bin/pumpd --foreground" in unit.read_text()

    r = install("--root", tmp_path, "--uninstall")
    assert r.returncode == 0, r.stderr
    assert not unit.exists() and not socket_unit.exists() and not admin_unit.exists()
    assert conf.read_text() == "# mine\n"


@pytest.fixture
def root_dir():
    """A directory of root's that the service could see (not under /tmp: PrivateTmp=yes)."""
    if os.geteuid() != 0 or not os.access("/opt", os.W_OK):
        pytest.skip("needs root, to make a directory of root's in /opt")
    path = Path(tempfile.mkdtemp(prefix="pump-install-test-", dir="/opt"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_install_finds_pumpd_on_path(tmp_path, root_dir):
    bindir = root_dir / "bin"
    bindir.mkdir()
    fake = bindir / "pumpd"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")
    r = install("--root", tmp_path / "root", env=env)
    assert r.returncode == 0, r.stderr
    unit = (tmp_path / "root/etc/systemd/system/pumpd.service").read_text()
    assert f"ExecStart={fake} --foreground --config /etc/pump/pumpd.toml" in unit


def test_install_without_pumpd(tmp_path):
    if shutil.which("pumpd", path="/usr/bin:/bin"):
        pytest.skip("a pumpd is installed in /usr/bin")
    r = install("--root", tmp_path, env=dict(os.environ, PATH="/usr/bin:/bin"))
    assert r.returncode == 2 and "pumpd not found on PATH" in r.stderr and "--pumpd" in r.stderr
    assert not (tmp_path / "etc/systemd/system/pumpd.service").exists()


@pytest.mark.parametrize("path", ["pumpd", "/opt/my pump/pumpd", "/opt/100%/pumpd", "/opt/$HOME/pumpd"])
def test_install_rejects_bad_pumpd_paths(tmp_path, path):
    r = install("--root", tmp_path, "--pumpd", path)
    assert r.returncode == 2 and "--pumpd" in r.stderr
    assert not (tmp_path / "etc/systemd/system/pumpd.service").exists()


@pytest.mark.parametrize("path", ["/home/alice/venv/bin/pumpd", "/root/.local/bin/pumpd", "/tmp/venv/bin/pumpd",
                                  "/var/tmp/pump/bin/pumpd"])
def test_a_pumpd_the_service_cannot_see_is_staged_with_a_warning(tmp_path, path):
    """Staging (--root) takes a pumpd anywhere, saying once that the live service would not see
    it there; an install refuses it (the same check, before anything is written)."""
    r = install("--root", tmp_path, "--pumpd", path)
    assert r.returncode == 0, r.stderr
    (warning,) = r.stderr.splitlines()
    assert warning.startswith(f"install-service: warning: --pumpd: '{path}' is under") and "(staged anyway: --root)" in warning
    assert f"ExecStart={path}" in (tmp_path / "etc/systemd/system/pumpd.service").read_text()


def _non_root_group():
    for g in grp.getgrall():
        if g.gr_gid != 0:
            return g
    pytest.skip("no group other than root")


@pytest.mark.parametrize("mode", [0o660, 0o666])
def test_install_nvidia_device_group(tmp_path, mode):
    """/dev/nvidiactl closed to others: pumpd gets its group for NVML."""
    dev = tmp_path / "dev"
    dev.mkdir()
    ctl = dev / "nvidiactl"
    ctl.touch()
    g = _non_root_group() if os.geteuid() == 0 else grp.getgrgid(os.getgid())
    try:
        os.chown(ctl, -1, g.gr_gid)
    except PermissionError:
        pytest.skip("cannot change the group of a file here")
    ctl.chmod(mode)
    r = install("--root", tmp_path, "--pumpd", "/opt/pump/bin/pumpd")
    assert r.returncode == 0, r.stderr
    d = unit_directives((tmp_path / "etc/systemd/system/pumpd.service").read_text())
    if mode == 0o660:
        assert d[("Service", "SupplementaryGroups")] == [g.gr_name]
        assert f"SupplementaryGroups={g.gr_name}" in r.stdout
    else:
        assert ("Service", "SupplementaryGroups") not in d


def test_install_help_and_errors(tmp_path):
    r = install("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: install-service")
    for opt in ("--root", "--pumpd", "--no-start", "--uninstall"):
        assert opt in r.stdout
    r = install("--frobnicate")
    assert r.returncode == 2 and "unknown argument '--frobnicate'" in r.stderr


def test_install_needs_root(tmp_path):
    """Without --root it must refuse to run as an ordinary user (before touching anything)."""
    if os.geteuid() != 0:
        r = install("--pumpd", "/bin/true", "--no-start")
    elif shutil.which("runuser"):
        r = subprocess.run(["runuser", "-u", "nobody", "--", str(INSTALL), "--pumpd", "/bin/true", "--no-start"],
                           capture_output=True, text=True, timeout=60, cwd="/")
        if "Permission denied" in r.stderr:
            pytest.skip("nobody cannot read the source tree")
    else:
        pytest.skip("running as root without runuser")
    assert r.returncode == 2 and "must run as root" in r.stderr


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze")
def test_unit_verifies(tmp_path):
    """systemd's own check of the installed unit (ExecStart must name an executable)."""
    exe = shutil.which("true")
    r = install("--root", tmp_path, "--pumpd", exe)
    assert r.returncode == 0, r.stderr
    units = [str(tmp_path / "etc/systemd/system" / name) for name in ("pumpd.socket", "pumpd-admin.socket",
                                                                          "pumpd.service")]
    v = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (v.stdout + v.stderr).splitlines() if "pumpd." in line]
    assert v.returncode == 0 and not complaints, v.stdout + v.stderr


@pytest.fixture
def venv(root_dir):
    """A venv's shape, root's alone: bin/pumpd (run by bin/python), a package in its
    site-packages, a directory a .pth file adds."""
    site = root_dir / "lib/python3.11/site-packages"
    (site / "pump").mkdir(parents=True)
    (site / "pump/__init__.py").write_text("")
    added = root_dir / "added"
    added.mkdir()
    (site / "more.pth").write_text(f"# a comment\nimport os\n{added}\n")
    (root_dir / "bin").mkdir()
    python = root_dir / "bin/python"
    python.write_text("#!/bin/sh\n")  # never run: install-service reads its path only
    pumpd = root_dir / "bin/pumpd"
    pumpd.write_text(f"#!{python}\n")
    for f in (python, pumpd):
        f.chmod(0o755)
    return root_dir


@pytest.mark.parametrize("change", [None, "pumpd group-writable", "bin/ another user's", "python world-writable",
                                    "a module another user's", "a .pth directory group-writable"])
def test_install_refuses_what_another_user_could_change(tmp_path, venv, change):
    """What pumpd runs (pumpd, its Python, its site-packages and what .pth files add) runs
    as pump: another user's, or writable by one, is code execution as pump. Before: each
    was installed as ExecStart."""
    path, how = {None: (None, None),
                 "pumpd group-writable": (venv / "bin/pumpd", 0o775),
                 "bin/ another user's": (venv / "bin", 65534),
                 "python world-writable": (venv / "bin/python", 0o757),
                 "a module another user's": (venv / "lib/python3.11/site-packages/pump/__init__.py", 65534),
                 "a .pth directory group-writable": (venv / "added", 0o775)}[change]
    if how == 65534:
        os.chown(path, 65534, 65534)
    elif how is not None:
        path.chmod(how)
    r = install("--root", tmp_path, "--pumpd", str(venv / "bin/pumpd"))
    if change is None:
        assert r.returncode == 0, r.stderr
        return
    assert r.returncode == 2 and f"{path} (uid " in r.stderr and "whose code would then run as pump" in r.stderr, \
        r.stderr
    assert not (tmp_path / "etc/systemd/system/pumpd.service").exists()


def test_pumpd_tells_systemd_its_status_as_it_changes(tmp_path):
    """systemctl status pumpd shows the STATUS= line: jobs, users, sessions, told when it changes."""
    import socket as sockets
    from helpers import clean_env, start_pumpd, stop_pumpd
    from pump import protocol
    notify = sockets.socket(sockets.AF_UNIX, sockets.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(5)
    proc = start_pumpd(tmp_path / "pumpd.sock", env=dict(clean_env(), NOTIFY_SOCKET=str(tmp_path / "notify")))
    try:
        with protocol.Client(str(tmp_path / "pumpd.sock")) as c:
            c.request({"op": "register", "name": "told"})
        said = []
        while not any("STATUS=serving 1 job of 1 user, 0 sessions" in m for m in said):
            said.append(notify.recv(4096).decode())
        assert said[0].startswith("READY=1\nSTATUS=listening on "), said
        assert sum("STATUS=serving 0 jobs of 0 users, 0 sessions" == m for m in said) <= 1, said  # once, not each round
    finally:
        stop_pumpd(proc)
        notify.close()
