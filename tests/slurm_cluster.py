"""A one-node SLURM cluster for the tests: Debian's slurm-wlm and munge, started as root in a temp dir.

Everything lives under one directory (its own munge socket and key, slurm.conf, state, logs and ports),
so it neither reads nor disturbs a system-wide SLURM or munge. Clients find it through ``SLURM_CONF``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SLURM_CONF = """\
ClusterName=qkplast-test
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
SchedulerType=sched/backfill
NodeName={host} CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol")


class ClusterError(RuntimeError):
    """The daemons could not start; the message says which and why (with its log's tail)."""


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return max(256, int(line.split()[1]) // 1024 - 512)  # leave the OS some room
    return 1024


def _tail(path: Path, n: int = 8) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else "(no log)"


@dataclass
class Cluster:
    root: Path
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    procs: list = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _daemon(self, name: str, args: list[str], log: Path, ready, timeout: float = 30.0) -> None:
        exe = shutil.which(name) or f"/usr/sbin/{name}"
        proc = subprocess.Popen([exe, *args], env=self.env, stdout=subprocess.DEVNULL, stderr=open(log.with_suffix(".err"), "w"),
                                start_new_session=True)
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with code {proc.returncode}: {_tail(log)} {_tail(log.with_suffix('.err'))}")
            if ready():
                return
            time.sleep(0.3)
        raise ClusterError(f"{name} did not become ready within {timeout:.0f} s: {_tail(log)} {_tail(log.with_suffix('.err'))}")

    def start(self) -> "Cluster":
        r = self.root
        for d in ("state", "spool", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o600)
        sock = r / "munge" / "munge.socket"
        # --force: munged otherwise refuses to run as root and to use a key under a world-writable /tmp
        self._daemon("munged", ["--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                                f"--pid-file={r}/munge/munged.pid", f"--log-file={r}/munged.log",
                                f"--seed-file={r}/munge/munged.seed"], r / "munged.log", sock.exists)
        self.conf.write_text(SLURM_CONF.format(host=self.host, ctld_port=_free_port(), d_port=_free_port(),
                                               munge_socket=sock, root=r, cpus=os.cpu_count() or 1, memory=_memory_mb()))
        self._daemon("slurmctld", ["-D", "-f", str(self.conf)], r / "slurmctld.log", self._controller_up)
        self._daemon("slurmd", ["-D", "-f", str(self.conf), "-N", self.host], r / "slurmd.log", self._node_idle, 60)
        return self

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=20)

    def _controller_up(self) -> bool:
        return self._run("scontrol", "ping").stdout.count("UP") > 0

    def _node_idle(self) -> bool:
        state = self._run("sinfo", "-h", "-N", "-o", "%T").stdout.strip().lower()
        return state.startswith("idle")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
