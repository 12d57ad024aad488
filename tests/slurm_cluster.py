"""A single-node Slurm for the tests, from Debian's packages (slurmctld, slurmd, munge):
its own munged (key and socket), config, state, spool, logs and ports under one temporary
directory, started in about a second and stopped with nothing left running.

No cgroups are needed (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none), so it
runs in a container; two GPUs are declared as GRES on device files made here, so
`--gpus-per-task=1` binds each task to its own (CUDA_VISIBLE_DEVICES), which fakecuda
honours as the driver does. slurmd starts jobs as their user: it needs root."""

import contextlib
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import time

NODE = "pumpnode"
DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "sinfo")
START_TIMEOUT = 30.0


def missing_reason() -> str:
    """Why no test cluster can run here ("" when one can)."""
    absent = [name for name in DAEMONS if shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin")
              is None]
    if absent:
        return (f"no {', '.join(absent)} here (Debian: apt-get install slurmctld slurmd slurm-client munge "
                "libslurm-dev)")
    if os.geteuid() != 0:
        return "slurmd starts jobs as their user: it needs root"
    return ""


def build_spank_plugin(output: pathlib.Path) -> str:
    """Builds deploy/slurm's SPANK plugin into output; why it cannot be ("" when built)."""
    script = pathlib.Path(__file__).resolve().parent.parent / "deploy" / "slurm" / "build-spank-pump"
    build = subprocess.run([str(script), str(output)], capture_output=True, text=True, timeout=120)
    if build.returncode == 2 and "no <slurm/spank.h>" in build.stderr:
        return build.stderr.strip()
    if build.returncode != 0:
        raise RuntimeError(f"building the SPANK plugin failed:\n{build.stderr}")
    return ""


def _free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _sbin(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin")


class SlurmCluster:
    """start() brings it up (munged, slurmctld, slurmd; the node idle), stop() takes it down;
    env() is the environment its clients (srun, sbatch, squeue) need."""

    def __init__(self, directory: pathlib.Path, plugstack: str = ""):
        self.dir = directory
        self.conf = directory / "slurm.conf"
        self.munge_socket = directory / "munge" / "sock"
        self.plugstack = plugstack
        self.procs = {}

    def env(self, base=None) -> dict:
        return dict(base if base is not None else os.environ, SLURM_CONF=str(self.conf))

    def _write_config(self):
        d = self.dir
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir()
        for i in (0, 1):  # GRES device files: any character device will do (null's numbers)
            os.mknod(d / f"gpu{i}", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        ctld_port, slurmd_port = _free_ports(2)
        (d / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={d}/gpu[0-1]\n")
        (d / "plugstack.conf").write_text(self.plugstack)
        self.conf.write_text("\n".join([
            "ClusterName=pumptest",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log", f"SlurmdLogFile={d}/log/slurmd.log",
            # no cgroups: what a container allows
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SwitchType=switch/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "ReturnToService=2",
            # four CPUs whatever the machine has, so `-n 2` fits on a two-core CI machine
            "SlurmdParameters=config_overrides", "GresTypes=gpu",
            f"PlugStackConfig={d}/plugstack.conf",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs=4 Gres=gpu:2 State=UNKNOWN",
            f"PartitionName=pump Nodes={NODE} Default=YES MaxTime=10 State=UP", ""]))

    def _start_munge(self):
        munge = self.dir / "munge"
        munge.mkdir(mode=0o711)  # munged wants its socket's directory searchable by all
        key = munge / "key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn("munged", [_sbin("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--log-file={munge}/log", f"--pid-file={munge}/pid",
                               f"--seed-file={munge}/seed"])
        self._wait("munged's socket", lambda: self.munge_socket.exists())

    def _spawn(self, name, argv):
        log = open(self.dir / "log" / f"{name}.out", "w")
        with log:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                env=self.env(), cwd=self.dir, start_new_session=True)

    def _wait(self, what, ready, timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not ready within {timeout:g} s"
                                   + (f" ({', '.join(dead)} exited)" if dead else "") + "\n" + self.logs())
            time.sleep(0.1)

    def start(self):
        self._write_config()
        self._start_munge()
        self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", NODE])
        self._wait("the node", lambda: self.run(["sinfo", "-h", "-o", "%T"], check=False).stdout.strip() == "idle")

    @contextlib.contextmanager
    def running(self):
        """Started for the with block; stopped after it, once its jobs are done."""
        try:
            self.start()
            yield self
            self.wait_idle()
        finally:
            self.stop()

    def run(self, argv, check=True, timeout=60, **kw):
        proc = subprocess.run(argv, env=kw.pop("env", self.env()), capture_output=True, text=True,
                              timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr}\n{self.logs()}")
        return proc

    def wait_idle(self, timeout=30.0):
        """Until no job is queued or running (each job's slurmstepd gone with it)."""
        self._wait("the queue to empty",
                   lambda: self.run(["squeue", "-h"], check=False).stdout.strip() == "", timeout)

    def logs(self) -> str:
        out = []
        for path in sorted((self.dir / "log").glob("*")) + [self.dir / "munge" / "log"]:
            if path.exists():
                out.append(f"== {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)

    def stop(self):
        for name in ("slurmd", "slurmctld", "munged"):  # the clients first, their servers last
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
