"""deploy/kubernetes/ checked offline: every manifest is made of the Kubernetes API's own types
(the `kubernetes` client's models) with no field they do not have, the pieces fit together
(socket, shim, config, the service's limits), the training pod's environment is the one
pump-run gives its command, and pumpd-entrypoint hands pumpd a root-bound socket as systemd
does. No cluster and no image are needed (docs/clusters.md, "Kubernetes")."""

import copy
import json
import os
import pathlib
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="the test extra's kubernetes client")
yaml = pytest.importorskip("yaml", reason="the test extra's pyyaml")
from kubernetes.client import models  # noqa: E402
from kubernetes.utils import parse_quantity  # noqa: E402

from pump import config, run, torch_env  # noqa: E402
from pump.daemon_link import DaemonLink  # noqa: E402
from fakeshim import FakeShim  # noqa: E402
from helpers import clean_env, stop_pumpd  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").rglob("*.yaml"))
ENTRYPOINT = ROOT / "deploy" / "pumpd-entrypoint"
PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
              "date": (str,), "datetime": (str,), "bytes": (str,)}


def documents():
    """(where, document) of every object in deploy/kubernetes/."""
    for path in MANIFESTS:
        with open(path) as f:
            for index, doc in enumerate(yaml.safe_load_all(f)):
                if doc is not None:
                    yield f"{path.relative_to(ROOT)}#{index}", doc


def find(kind, name=None):
    return next(doc for _, doc in documents() if doc["kind"] == kind and name in (None, doc["metadata"]["name"]))


def model_name(doc) -> str:
    """The client's class for apiVersion and kind ("apps/v1", "DaemonSet": V1DaemonSet)."""
    return doc["apiVersion"].split("/")[-1].capitalize() + doc["kind"]


def api_problems(doc) -> list:
    """Whether the client's API for the document's group and version serves its kind."""
    group, _, version = doc["apiVersion"].rpartition("/")
    api = getattr(kubernetes.client, (group.split(".")[0].capitalize() or "Core") + version.capitalize() + "Api", None)
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", doc["kind"]).lower()
    if api is None or not any(hasattr(api, f"create_{scope}{snake}") for scope in ("", "namespaced_")):
        return [f"apiVersion {doc['apiVersion']} has no kind {doc['kind']}"]
    return []


def strict_problems(value, kind: str, where: str) -> list:
    """Every key the API's type `kind` (an openapi_types string) does not have, and every
    value of the wrong type, below `where`. The client's deserializer drops unknown keys
    without a word; this walk does not."""
    listed = re.fullmatch(r"[Ll]ist\[(.+)\]", kind)  # "list[X]" in older clients, "List[X]" now
    if listed:
        if not isinstance(value, list):
            return [f"{where}: a list expected, got {value!r}"]
        return [p for i, item in enumerate(value) for p in strict_problems(item, listed.group(1), f"{where}[{i}]")]
    mapped = re.fullmatch(r"(?:dict\(|Dict\[)str, (.+)[)\]]", kind)
    if mapped:
        if not isinstance(value, dict):
            return [f"{where}: a mapping expected, got {value!r}"]
        return [p for key, item in value.items() for p in
                ([] if isinstance(key, str) else [f"{where}: key {key!r} is not a string"])
                + strict_problems(item, mapped.group(1), f"{where}.{key}")]
    if kind == "object":
        return []
    if kind in PRIMITIVES:
        ok = isinstance(value, PRIMITIVES[kind]) and (kind == "bool" or not isinstance(value, bool))
        return [] if ok else [f"{where}: {kind} expected, got {value!r}"]
    model = getattr(models, kind)
    if not isinstance(value, dict):
        return [f"{where}: {kind} (a mapping) expected, got {value!r}"]
    fields = {json_key: model.openapi_types[attr] for attr, json_key in model.attribute_map.items()}
    problems = []
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{where}.{key}: {kind} has no field {key!r}; it has: {', '.join(sorted(fields))}")
        else:
            problems += strict_problems(item, fields[key], f"{where}.{key}")
    return problems


def problems(doc) -> list:
    """What is wrong with a manifest's document, as the API's types see it ([]: nothing)."""
    name = model_name(doc)
    if not hasattr(models, name):
        return [f"no Kubernetes type {name} (apiVersion {doc.get('apiVersion')}, kind {doc.get('kind')})"]
    found = api_problems(doc) + strict_problems(doc, name, doc["kind"])
    try:  # the client's own construction: required fields and enumerations
        kubernetes.client.ApiClient()._ApiClient__deserialize(copy.deepcopy(doc), name)
    except (ValueError, TypeError) as exc:
        found.append(f"{name}: {exc}")
    return found


@pytest.mark.parametrize("where,doc", list(documents()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_manifest_is_made_of_the_apis_own_types(where, doc):
    assert problems(doc) == []


def test_the_check_finds_a_misspelt_field_that_the_client_drops_silently():
    daemonset = find("DaemonSet")
    broken = copy.deepcopy(daemonset)
    context = broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    context["readOnlyRootFileSystem"] = context.pop("readOnlyRootFilesystem")
    # The client alone takes it, and the setting is simply gone:
    made = kubernetes.client.ApiClient()._ApiClient__deserialize(broken, "V1DaemonSet")
    assert made.spec.template.spec.containers[0].security_context.read_only_root_filesystem is None
    found = problems(broken)
    assert len(found) == 1 and found[0].startswith(
        "DaemonSet.spec.template.spec.containers[0].securityContext.readOnlyRootFileSystem: "
        "V1SecurityContext has no field 'readOnlyRootFileSystem'; it has: allowPrivilegeEscalation,")
    wrong_type = copy.deepcopy(daemonset)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"] = "0"
    assert problems(wrong_type)[0] == ("DaemonSet.spec.template.spec.containers[0].securityContext.runAsUser: "
                                       "int expected, got '0'")
    wrong_group = dict(copy.deepcopy(find("Job")), apiVersion="apps/v1")
    assert problems(wrong_group) == ["apiVersion apps/v1 has no kind Job"]
    no_name = copy.deepcopy(daemonset)
    del no_name["spec"]["template"]["spec"]["containers"][0]["name"]
    found = problems(no_name)  # the client's own check; its wording varies with its version
    assert len(found) == 1 and found[0].startswith("V1DaemonSet: ") and "name" in found[0]


# ---- the pieces fit ---------------------------------------------------------------------------

def pumpd_container():
    return find("DaemonSet")["spec"]["template"]["spec"]["containers"][0]


def mount_of(container, spec, path: str):
    """The volume (from the pod spec) whose mount in container holds path, and the mount."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if (path + "/").startswith(prefix) or path == mount["mountPath"]:
            return volumes[mount["name"]], mount
    raise AssertionError(f"no volume of {container['name']} holds {path}")


def flag(command, name):
    return command[command.index(name) + 1]


def test_the_daemonset_carries_the_services_hardening():
    pod = find("DaemonSet")["spec"]["template"]["spec"]
    container = pumpd_container()
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
    assert not context["privileged"] and context["seccompProfile"]["type"] == "RuntimeDefault"
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SETUID", "SETGID"]}  # the entrypoint's drop
    assert pod["automountServiceAccountToken"] is False and not pod["hostNetwork"] and not pod["hostIPC"]
    unit = (ROOT / "scripts" / "pumpd.service").read_text()
    memory_max = re.search(r"^MemoryMax=(\d+)([KMGT]?)$", unit, re.M)
    systemd_bytes = int(memory_max.group(1)) * 1024 ** " KMGT".index(memory_max.group(2) or " ")
    assert parse_quantity(container["resources"]["limits"]["memory"]) == systemd_bytes
    socket_unit = (ROOT / "scripts" / "pumpd.socket").read_text()
    listen = re.search(r"^ListenStream=(\S+)$", socket_unit, re.M).group(1)
    command = container["command"]
    assert command[0] == "pumpd-entrypoint" and flag(command, "--socket") == listen
    assert flag(command, "--user") == "pump"
    volume, _ = mount_of(container, pod, listen)
    assert volume["hostPath"]["path"] == os.path.dirname(listen)
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["pump", "status", "--socket", listen]
    env = {e["name"]: e["value"] for e in container["env"]}
    volume, _ = mount_of(container, pod, env["RUNTIME_DIRECTORY"])
    assert "emptyDir" in volume  # outlives a container's restart, as RuntimeDirectoryPreserve=restart


def test_only_pumpd_mounts_the_administrators_socket():
    """uid 0 in a job's pod must not reach the administrator's socket (pump/admin.py)."""
    from pump import admin
    pod = find("DaemonSet")["spec"]["template"]["spec"]
    container = pumpd_container()
    assert flag(container["command"], "--admin-socket") == admin.ADMIN_SOCKET
    volume, _ = mount_of(container, pod, admin.ADMIN_SOCKET)
    assert volume["hostPath"]["path"] == os.path.dirname(admin.ADMIN_SOCKET)
    admin_dir = os.path.dirname(admin.ADMIN_SOCKET)
    for where, doc in documents():
        if doc["kind"] == "DaemonSet":
            continue
        spec = doc.get("spec", {}).get("template", {}).get("spec", doc.get("spec", {}))
        for volume in spec.get("volumes", []) if isinstance(spec, dict) else []:
            if "hostPath" in volume:
                host = volume["hostPath"]["path"].rstrip("/") + "/"
                assert not (admin_dir + "/").startswith(host), (where, volume)


def test_the_config_maps_are_pumps_config_files(tmp_path):
    pod = find("DaemonSet")["spec"]["template"]["spec"]
    config_file = flag(pumpd_container()["command"], "--config")
    volume, mount = mount_of(pumpd_container(), pod, config_file)
    config_map = find("ConfigMap", volume["configMap"]["name"])
    (tmp_path / "pumpd.toml").write_text(config_map["data"][mount["subPath"]])
    daemon = config.load_daemon_file(tmp_path / "pumpd.toml")
    volume, _ = mount_of(pumpd_container(), pod, daemon.jobs_dir + "/x.toml")
    jobs = find("ConfigMap", volume["configMap"]["name"])["data"]
    assert jobs
    for name, text in jobs.items():
        (tmp_path / name).write_text(text)
        assert config.load_job_file(tmp_path / name).name is None  # the file's name names the job


# ---- the training pod -------------------------------------------------------------------------

def rendered_env(container) -> dict:
    """The container's environment as the kubelet gives it: $(VAR) of an earlier variable
    expanded, $$ an escaped $. (The image's own ENV lies under it: docs/clusters.md.)"""
    env = {}
    for item in container.get("env", []):
        assert set(item) == {"name", "value"}, f"cannot render {item} offline"
        env[item["name"]] = re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                                   lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                                   item["value"])
    return env


def training_pod():
    job = find("Job")
    return job["metadata"]["name"], job["spec"]["template"]["spec"]


def test_the_training_pods_environment_is_what_pump_run_gives(tmp_path, monkeypatch):
    job_name, pod = training_pod()
    train = pod["containers"][0]
    env = rendered_env(train)
    init = pod["initContainers"][0]
    copied_to = init["command"][-1].rstrip("/")
    pump_volume, _ = mount_of(init, pod, copied_to)
    # Where the init container's copy is seen in the training container.
    volume, mount = mount_of(train, pod, env["LD_PRELOAD"])
    assert volume is pump_volume and mount["readOnly"]
    in_pod = mount["mountPath"].rstrip("/")
    shim_file = f"{in_pod}/libpump.so"
    monkeypatch.setattr(torch_env, "BOOT_DIR", pathlib.Path(f"{in_pod}/boot"))
    # pump-run --name JOB, under the administrator's jobs.d (the ConfigMap) and the defaults.
    jobs = find("ConfigMap", "pump-jobs")["data"]
    for name, text in jobs.items():
        (tmp_path / name).write_text(text)
    cfg = config.resolve_job({}, None, job_name, jobs_dir=str(tmp_path))
    expected, notices = run.job_environment(cfg, shim_file, {})
    assert notices == []
    # What belongs to one pump-run alone has no pump-run here: no summary (PUMP_STATS_DIR),
    # no registered job (PUMP_JOB: the shim's attach makes one, jobs.d applied by name),
    # no watchdog (PUMP_RUN_TOKEN); the node's pumpd is named as pump-run names the system's.
    daemonset_socket = flag(pumpd_container()["command"], "--socket")
    expected["PUMP_SOCKET"] = daemonset_socket
    assert env == expected
    volume, _ = mount_of(train, pod, env["PUMP_SOCKET"])
    assert volume["hostPath"]["path"] == os.path.dirname(daemonset_socket)
    # The init container copies the image's /usr/lib/pump, which the Dockerfile fills with
    # the installed package's libpump.so, boot/ and header: the same names, one layout.
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert init["command"][:3] == ["cp", "-a", "/usr/lib/pump/."]
    assert '"$package/libpump.so" "$package/pump_torch_trace.h" "$package/boot" /usr/lib/pump/' in dockerfile
    assert f"--uid {init['securityContext']['runAsUser']} " in dockerfile


def test_the_docs_pod_spec_is_the_examples():
    text = (ROOT / "docs" / "clusters.md").read_text()
    section = text[text.index("### A training pod"):]
    spec = yaml.safe_load(section[section.index("```yaml\n") + 8:section.index("```\n", 8)])["spec"]
    assert strict_problems(spec, "V1PodSpec", "docs") == []
    _, pod = training_pod()
    assert spec["containers"][0]["env"] == pod["containers"][0]["env"]
    assert spec["initContainers"][0]["command"] == pod["initContainers"][0]["command"]
    for container in ("containers", "initContainers"):
        assert spec[container][0]["volumeMounts"] == [
            {k: m[k] for k in m if k in ("name", "mountPath", "readOnly")} for m in pod[container][0]["volumeMounts"]]


def test_child_env_is_the_job_environment_and_the_runs_own(monkeypatch):
    monkeypatch.setattr(os, "environ", {"PATH": "/bin", "PYTHONPATH": "/mine"})
    cfg = config.resolve_job({"policy": "lookahead"})
    link = DaemonLink()
    link.socket_path, link.job = "/run/pump/pumpd.sock", "j1"

    class Args:
        verbose = 1
    got = run.child_env(Args, cfg, "/lib/libpump.so", "/tmp/stats", link)
    base, _ = run.job_environment(cfg, "/lib/libpump.so", os.environ, 1)
    assert got == dict(base, PUMP_STATS_DIR="/tmp/stats", PUMP_SOCKET="/run/pump/pumpd.sock", PUMP_JOB="j1")
    assert base["PYTHONPATH"] == f"{torch_env.BOOT_DIR}:/mine" and base["PUMP_POLICY"] == "lookahead"


# ---- pumpd-entrypoint -------------------------------------------------------------------------

NOBODY = 65534
REPORT = """import json, os, socket
s = socket.socket(fileno=3)
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "cap_eff": status["CapEff"], "cap_prm": status["CapPrm"], "no_new_privs": status["NoNewPrivs"],
                  "listen_pid_is_mine": os.environ["LISTEN_PID"] == str(os.getpid()),
                  "listen_fds": os.environ["LISTEN_FDS"], "bound": s.getsockname(),
                  "listening": s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)}), flush=True)
conn, _ = s.accept()
conn.sendall(b"served")
"""


def python_nobody_can_run(candidates=(sys.executable, "/usr/bin/python3"), imports=""):
    """A Python that uid NOBODY can run (subprocess's user= drops every capability, as
    pumpd-entrypoint does) and that imports `imports` there."""
    for python in candidates:
        try:
            subprocess.run([python, "-c", imports], user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                           capture_output=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            continue
        return python
    return None


@pytest.fixture
def python_for_nobody():
    if os.geteuid() != 0:
        pytest.skip("needs root: pumpd-entrypoint binds as root and drops to another user")
    python = python_nobody_can_run()
    if python is None:
        pytest.skip(f"no Python that uid {NOBODY} can run (a private directory above {sys.executable})")
    return python


def test_entrypoint_binds_as_root_and_runs_the_daemon_as_its_user(python_for_nobody, tmp_path):
    tmp_path.chmod(0o755)
    path = tmp_path / "pumpd.sock"
    path_stale = socket.socket(socket.AF_UNIX)
    path_stale.bind(str(path))  # a previous container's socket file, replaced
    path_stale.close()
    user = next(line.split(":")[0] for line in open("/etc/passwd") if line.split(":")[2] == str(NOBODY))
    proc = subprocess.Popen([python_for_nobody, ENTRYPOINT, "--user", user, "--socket", str(path), "--",
                             python_for_nobody, "-c", REPORT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd="/")
    try:
        report = json.loads(proc.stdout.readline() or "null")
        assert report is not None, proc.stderr.read()
        assert report == {"uid": NOBODY, "euid": NOBODY, "gid": NOBODY, "groups": [],
                          "cap_eff": "0000000000000000", "cap_prm": "0000000000000000",
                          "no_new_privs": report["no_new_privs"], "listen_pid_is_mine": True,
                          "listen_fds": "1", "bound": str(path), "listening": 1}
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
            _, uid, _ = struct.unpack("3i", client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            assert uid == 0  # whoever listen()ed: root, so every client trusts it
            assert client.recv(16) == b"served"
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


ADMIN_REPORT = """import json, os, socket
print(json.dumps({"names": os.environ["LISTEN_FDNAMES"], "count": os.environ["LISTEN_FDS"],
                  "bound": [socket.socket(fileno=fd).getsockname() for fd in (3, 4)]}), flush=True)
"""


def test_entrypoint_binds_the_administrators_socket_root_only(python_for_nobody, tmp_path):
    tmp_path.chmod(0o755)
    path, admin = tmp_path / "pumpd.sock", tmp_path / "admin" / "pumpd.sock"
    user = next(line.split(":")[0] for line in open("/etc/passwd") if line.split(":")[2] == str(NOBODY))
    r = subprocess.run([python_for_nobody, ENTRYPOINT, "--user", user, "--socket", str(path), "--admin-socket",
                        str(admin), "--", python_for_nobody, "-c", ADMIN_REPORT],
                       capture_output=True, text=True, cwd="/", timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"names": "pumpd.socket:admin", "count": "2", "bound": [str(path), str(admin)]}
    assert [(os.stat(p).st_uid, stat.S_IMODE(os.stat(p).st_mode)) for p in (admin.parent, admin)] == \
        [(0, 0o700), (0, 0o600)]


def test_entrypoint_refuses_what_it_cannot_do(python_for_nobody, tmp_path):
    def entrypoint(*args, **user):
        return subprocess.run([python_for_nobody, ENTRYPOINT, *args], capture_output=True, text=True, cwd="/", **user)
    sock = str(tmp_path / "s.sock")
    r = entrypoint("--user", "root", "--socket", sock, "--", "true")
    assert (r.returncode, r.stderr) == (2, "pumpd-entrypoint: --user root: is root; the daemon runs as a user of its own\n")
    r = entrypoint("--user", "no-such-user-here", "--socket", sock, "--", "true")
    assert (r.returncode, r.stderr) == (2, "pumpd-entrypoint: --user no-such-user-here: no such user\n")
    if subprocess.run(["test", "-r", str(ENTRYPOINT)], user=NOBODY, group=NOBODY, extra_groups=[]).returncode != 0:
        pytest.skip(f"uid {NOBODY} cannot read {ENTRYPOINT} (a checkout in a private directory)")
    r = entrypoint("--user", "nobody", "--socket", sock, "--", "true",
                   user=NOBODY, group=NOBODY, extra_groups=[])
    assert (r.returncode, r.stderr) == (2, f"pumpd-entrypoint: runs as root (uid 0) to bind {sock} as systemd "
                                           f"does; it runs as uid {NOBODY}\n")


@pytest.fixture
def node_dir():
    """A directory uid NOBODY can reach (pytest's tmp_path lies under a private one)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="pump-node-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_the_daemonsets_command_serves_pumps_clients(node_dir):
    """The DaemonSet's command, environment, probe and ConfigMaps, with the node's paths under
    node_dir: pumpd runs as the image's user would, with no capability, on a socket root
    listens on, and applies the pump-jobs ConfigMap to a shim's job by its name."""
    if os.geteuid() != 0:
        pytest.skip("needs root: pumpd-entrypoint binds as root and drops to another user")
    python = python_nobody_can_run((sys.executable,), "import pump, pumpd")
    if python is None:
        pytest.skip(f"uid {NOBODY} cannot run {sys.executable} with pump installed (a private directory above it)")
    node = {"/run/pump": node_dir / "run-pump", "/run/pumpd": node_dir / "run-pumpd", "/etc/pump": node_dir / "etc",
            "/run/pump-admin": node_dir / "run-pump-admin"}
    for path in node.values():
        path.mkdir(mode=0o755)
    node["/run/pumpd"].chmod(0o777)  # an emptyDir's mode
    (node["/etc/pump"] / "jobs.d").mkdir()

    def on_node(text: str) -> str:
        return re.sub("|".join(node) + r"(?![\w-])", lambda m: str(node[m.group(0)]), text)
    container = pumpd_container()
    (node["/etc/pump"] / "pumpd.toml").write_text(on_node(find("ConfigMap", "pumpd-config")["data"]["pumpd.toml"]))
    for name, text in find("ConfigMap", "pump-jobs")["data"].items():
        (node["/etc/pump"] / "jobs.d" / name).write_text(text)
    programs = {"pumpd-entrypoint": [python, str(ENTRYPOINT)], "pumpd": [python, "-m", "pumpd"],
                "pump": [python, "-m", "pump.cli"]}
    user = next(line.split(":")[0] for line in open("/etc/passwd") if line.split(":")[2] == str(NOBODY))

    def argv(command):  # the image's programs, the test's user, the node's paths
        out = []
        for before, arg in zip([None, *command], command):
            out += (programs[arg] if before in (None, "--") else [user] if before == "--user" else [on_node(arg)])
        return out
    env = dict(clean_env(), **{e["name"]: on_node(e["value"]) for e in container["env"]})
    proc = subprocess.Popen(argv(container["command"]), env=env, cwd="/", stderr=subprocess.PIPE, text=True)
    probe = argv(container["livenessProbe"]["exec"]["command"])
    try:
        deadline = time.monotonic() + 15
        while subprocess.run(probe, capture_output=True, cwd="/").returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "no answer"
            time.sleep(0.2)
        status = dict(line.split(":\t", 1) for line in open(f"/proc/{proc.pid}/status").read().splitlines()
                      if ":\t" in line)
        assert status["Uid"].split() == [str(NOBODY)] * 4 and status["CapEff"] == status["CapPrm"] == "0" * 16
        sock = os.stat(flag(probe, "--socket"))
        assert (sock.st_uid, stat.S_IMODE(sock.st_mode)) == (0, 0o666)
        admin = node["/run/pump-admin"] / "pumpd.sock"  # root's alone, in a directory of root's
        assert [(os.stat(p).st_uid, stat.S_IMODE(os.stat(p).st_mode)) for p in (admin.parent, admin)] == \
            [(0, 0o700), (0, 0o600)]
        assert os.stat(node["/run/pumpd"] / "jobs").st_uid == NOBODY  # the state, in the emptyDir
        shim = FakeShim(flag(probe, "--socket"), name=training_pod()[0])
        try:
            r = subprocess.run(probe + ["--json"], capture_output=True, text=True, cwd="/")
            (job,) = json.loads(r.stdout)["jobs"]
            allowed = config.resolve_job({}, None, job["name"], jobs_dir=str(node["/etc/pump"] / "jobs.d"))
            assert allowed.share is not None  # the pump-jobs ConfigMap names the Job's terms
            assert (job["name"], job["share"], job["priority"]) == (training_pod()[0], allowed.share, allowed.priority)
        finally:
            shim.close()
    finally:
        stop_pumpd(proc)
        proc.stderr.close()
