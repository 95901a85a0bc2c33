"""A real, throwaway Slurm cluster on this machine: munged, slurmctld and two slurmd, all in one folder.

Debian's slurm-wlm (22.05 on Debian 12) is built with multiple-slurmd support, so two slurmd
daemons (`slurmd -N n1`, `-N n2`, each on its own port) make two nodes of 2 CPUs each on one
host. Authentication is munge with its own key and socket in the folder (`AuthInfo=socket=`),
so nothing under /etc or /run is used or changed; the daemons run in the foreground as children
of the test and are stopped by it. `cred_expire=5` shortens the time a requeued job waits
before it may start again (Slurm holds it for the credential lifetime, 120 s by default,
slurm.conf(5) AuthInfo).

The nodes are named n1 and n2 and reached at 127.0.0.1 (NodeAddr): their names resolve
nowhere, as on clusters whose node names are not host names, so a job file must use the
address Slurm gives for a node.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "scancel", "sinfo", "squeue")
NODES = ("n1", "n2")


def missing_programs() -> list[str]:
    """The Slurm and munge programs this machine lacks (daemons live in /usr/sbin, often off PATH)."""
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    return [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=path) is None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalSlurm:
    """The cluster's folder, its environment for clients, and the daemons it started."""

    root: Path
    daemons: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict:
        """The environment for Slurm's clients and, through sbatch, the jobs: this Python's `flopwise` first."""
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
        return {**os.environ, "PATH": path, "SLURM_CONF": str(self.conf), "OMP_NUM_THREADS": "1"}

    def run(self, *args: str, cwd: Path | None = None, check: bool = True) -> str:
        """A client command (`scontrol ...`, `sbatch ...` from `cwd`), its standard output."""
        done = subprocess.run(args, cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as KEY -> VALUE (JobState, Restarts, ExitCode, ...)."""
        fields = {}
        for word in self.run("scontrol", "show", "job", "--oneliner", job_id).split():
            key, sep, value = word.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    def start(self) -> None:
        """Write the config, start munged, slurmctld and both slurmd, and wait until the nodes are idle."""
        for folder in ("munge", "state", "log", *(f"spool/{n}" for n in NODES)):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        socket_path = self.root / "munge" / "munge.socket"
        self.conf.write_text(slurm_conf(self.root, socket_path))
        env = self.env()
        munge = self.root / "munge"
        self._start(["munged", "--foreground", "--force", f"--socket={socket_path}", f"--key-file={key}",
                     f"--log-file={munge / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
                     f"--seed-file={munge / 'munged.seed'}"], env)
        self._wait(lambda: socket_path.exists(), "munged did not create its socket", self.root / "munge" / "munged.log")
        self._start(["slurmctld", "-D", "-i", "-f", str(self.conf)], env)
        self._wait(lambda: self.run("scontrol", "ping", check=False).count("UP") > 0,
                   "slurmctld did not answer", self.root / "log" / "slurmctld.log")
        for node in NODES:
            self._start(["slurmd", "-D", "-N", node, "-f", str(self.conf)], env)
        self._wait(lambda: self.run("sinfo", "-h", "-o", "%t", check=False).split() == ["idle"],
                   "the nodes did not become idle", self.root / "log" / "slurmd-n1.log")

    def stop(self) -> None:
        """Cancel what still runs, then stop the daemons this object started (slurmd first)."""
        if len(self.daemons) >= 2 and self.daemons[1].poll() is None:  # slurmctld is up
            self.run("scancel", "--full", "--user", "root", check=False)
            deadline = time.monotonic() + 60
            while self.run("squeue", "-h", check=False).strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                daemon.terminate()
                try:
                    daemon.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(timeout=20)
        self.daemons.clear()

    def _start(self, args: list[str], env: dict) -> None:
        log = open(self.root / "log" / f"{args[0]}-{len(self.daemons)}.out", "wb")
        self.daemons.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))

    def _wait(self, ready, what: str, log: Path, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [d.args[0] for d in self.daemons if d.poll() is not None]
            if dead or time.monotonic() > deadline:
                tail = log.read_text()[-3000:] if log.exists() else "(no log)"
                raise RuntimeError(f"{what} (exited: {dead or 'none'}); {log.name}:\n{tail}")
            time.sleep(0.2)


def slurm_conf(root: Path, munge_socket: Path) -> str:
    """Two 2-CPU nodes on this host, no accounting, no cgroups (plain process tracking).

    Partition `debug` (the default) and `urgent` share the nodes; a job in `urgent` (higher
    PriorityTier) preempts jobs in `debug`, which Slurm requeues (PreemptMode=REQUEUE), and a
    stopped job's processes get KillWait=60 s between SIGTERM and SIGKILL.
    """
    host = socket.gethostname().split(".")[0]
    ports = [free_port() for _ in range(1 + len(NODES))]
    nodes = "\n".join(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=2 RealMemory=1000"
                      for name, port in zip(NODES, ports[1:]))
    return f"""ClusterName=flopwise-test
SlurmctldHost={host}
SlurmctldPort={ports[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerParameters=sched_interval=1,bf_interval=1
MinJobAge=600
KillWait=60
MailProg=/bin/true
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes={",".join(NODES)} MaxTime=INFINITE State=UP PriorityTier=2
"""
