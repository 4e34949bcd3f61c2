#!/usr/bin/env python3
"""The live-Flux end-to-end test: a real flux-core instance → the forwarder
(contrib/flux-forwarder) → `fluxpipe run` over its `http` source, with
SIGKILLs on the way, and every answer compared with flux-core's own.

    tests/live-flux/live_flux.py [--fluxpipe target/release/fluxpipe]
        [--kafka BROKER --forwarder-python PYTHON]

With --kafka the same run goes through Kafka: the forwarder produces to a
topic (`--connect kafka://BROKER/TOPIC`; PYTHON must have confluent-kafka
and see flux-core's bindings) and `fluxpipe run` reads it with a `kafka`
source.

flux-core: the prefix in FLUX_PREFIX (a site's own install), else
../shared/flux-core/install is run (it installs to /opt/flux and prints the
prefix), else the test says it was skipped and exits 0.

What happens:
1. A 4-broker test instance (`--test-hosts=node[0-3]`) with a statedir, a
   `batch` queue, its virtual queue `fast`, a `debug` queue of the nodes
   with the instance-local property `+debug`, and a per-rank prolog and epilog that fail (and so drain
   the rank) for jobs that ask (`--setattr=user.fail=prolog|epilog`).
2. `fluxpipe run` with an http source (acknowledgements = checkpoint) and a
   file sink of transitions, jobs and ranks; the forwarder sends to it
   (`--reconnect`: it outlives the instance's restart). A second forwarder
   without `--reconnect` (to stdout) must exit 1 when the instance goes
   away.
3. The watchman, first: rank 0's broker is SIGKILLed (a crash) before any
   job: the forwarder without `--reconnect` exits 1, the one with it
   reconnects once the instance is started again from its statedir (a
   killed test instance cannot be rejoined), and `instance_down` fires
   while it is down and resolves at its `restart`.
4. A workload of every outcome (success, exit codes, a signal, a timeout,
   cancels pending and running, holds and urgency, dependencies incl. an
   unsatisfiable one, an unsatisfiable request, a failing prolog, a failing
   epilog that drains a node, drains and undrains, a node drained while a
   job runs on it), while `fluxpipe run` is SIGKILLed and restarted several
   times and the forwarder once, for longer than `feed_silent`'s `for`
   (it fires for the source, and resolves when the forwarder is back);
   midway the instance is shut down cleanly (`instance_down` fires, with a
   SIGKILL of `fluxpipe run` while it is down, and resolves when the
   instance is started again from its statedir).
5. At the end every job of `flux jobs -a --json` has a job record in the
   file sink equal on every summary field, every transition of a clean run
   of the same journal is there (exactly once when the file sink is), and
   every rank's state equals the broker's `resource.status`; the alerts
   file holds exactly one firing and one resolution of each watch episode
   and nothing else: no `node_offline` (its `for` is shorter than the
   instance stays down) for ranks of an instance that went down.
6. A `database` sink (SQLite) wrote the same run: `fluxpipe report jobs
   --by queue` and `--by user`, from its rows and from its daily rollups,
   equal what the fields of `flux jobs -a --json` imply, figure by figure.

Exit 0 when all agree; else every disagreement is printed and it exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORWARDER = REPO / "contrib/flux-forwarder/flux-forwarder"
INSTALLER = REPO.parent / "shared/flux-core/install"

# The fields of a job record compared with `flux jobs -a --json`.
FIELDS = ("state", "result", "success", "waitstatus", "returncode", "urgency", "priority",
          "userid", "t_submit", "t_depend", "t_run", "t_cleanup", "t_inactive",
          # From the jobspec (and its updates) and R.
          "name", "queue", "project", "bank", "duration", "ntasks", "ncores", "nnodes",
          "nodelist", "ranks")

# The watchman's rules in the test. Short for a test, long enough for a
# loaded 2-core machine. feed_silent's `for` is well above the longest
# silence of a live forwarder: over HTTP a heartbeat every HEARTBEAT
# seconds, or a batch sent again within ~2 s of a restarted `fluxpipe
# run`; over Kafka a restarted `fluxpipe run` hears nothing until its
# consumer group gives it partitions (the dead member's 6 s session
# timeout, then a rebalance: 11-12 s seen). node_offline's `for` is below
# instance_down's: the instance stays down at least that long, so ranks of
# a down instance taken for offline would page; the offline ranks of a
# clean shutdown (<1 s before the forwarder notices) and of a start (<1 s
# before they join) do not.
HEARTBEAT = 2
FEED_SILENT_FOR = {"http": 12, "kafka": 25}
INSTANCE_DOWN_FOR = 8
NODE_OFFLINE_FOR = 5
WATCH_ALERTS = ("feed_silent", "instance_down")

PERILOG = """#!/bin/sh
# Fails on every rank of a job that asked for it (--setattr=user.fail=$1).
want=$(flux job info "$FLUX_JOB_ID" jobspec 2>/dev/null | tr -d ' ' | grep -o '"fail":"[a-z]*"')
[ "$want" = "\\"fail\\":\\"$1\\"" ] && exit 1
exit 0
"""

# Queues as RFC 33 and RFC 20 have them in flux-core's next release: a
# virtual queue (`fast`, scheduled as part of `batch`) and a queue of the
# nodes with an instance-local property (`+debug`, which a job's R omits).
CONFIG = """[resource]
noverify = true

[[resource.config]]
hosts = "node[0-3]"
cores = "0-1"

[[resource.config]]
hosts = "node[2-3]"
properties = ["+debug"]

# Job shells that outlive a job-exec reload (flux-core's bgexec: RFC 50's
# `recoverable`, then `reattach`).
[exec]
method = "bgexec"

[queues.batch]

[queues.fast]
parent = "batch"

[queues.debug]
requires = ["+debug"]

[policy.jobspec.defaults.system]
queue = "batch"

[job-manager]
plugins = [ {{ load = "perilog.so" }} ]

[job-manager.prolog]
command = [ "{perilog}", "prolog" ]
per-rank = true

[job-manager.epilog]
command = [ "{perilog}", "epilog" ]
per-rank = true
"""


def log(msg: str) -> None:
    print(f"live-flux: {msg}", flush=True)


def flux_prefix() -> str | None:
    prefix = os.environ.get("FLUX_PREFIX")
    if prefix:
        return prefix
    if INSTALLER.exists():
        out = subprocess.run([str(INSTALLER)], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[-1]
        log(f"{INSTALLER} failed: {out.stderr.strip()[-500:]}")
    return None


def children(ppid: int) -> list[int]:
    """The processes whose parent is `ppid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == ppid:
            out.append(int(stat.parent.name))
    return out


def descendants(pid: int) -> list[int]:
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def wait_for(cond, timeout: float, interval: float = 0.2):
    """cond()'s first true value within `timeout` seconds, else None."""
    deadline = time.time() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.time() > deadline:
            return None
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Instance:
    """A test instance whose local URI stays the same across restarts."""

    def __init__(self, prefix: str, work: Path):
        self.flux = os.path.join(prefix, "bin", "flux")
        self.work = work
        self.rundir = work / "run"
        self.statedir = work / "state"
        self.conf = work / "conf"
        for d in (self.rundir, self.statedir, self.conf):
            d.mkdir(parents=True, exist_ok=True)
        perilog = work / "perilog"
        perilog.write_text(PERILOG)
        perilog.chmod(0o755)
        (self.conf / "system.toml").write_text(CONFIG.format(perilog=perilog))
        self.uri = f"local://{self.rundir}/local-0"
        self.env = dict(os.environ, FLUX_URI_RESOLVE_LOCAL="t",
                        PATH=f"{prefix}/bin:{os.environ['PATH']}")
        self.env.pop("FLUX_URI", None)
        self.proc: subprocess.Popen | None = None
        self.lives = 0
        self.size = 4
        self.orphans: list[int] = []

    def start(self) -> None:
        ready = self.work / f"ready.{self.lives}"
        self.lives += 1
        script = f"flux queue start --all >/dev/null && touch {ready} && exec sleep 100000"
        self.proc = subprocess.Popen(
            [self.flux, "start", f"--test-size={self.size}",
             f"--test-hosts=node[0-{self.size - 1}]",
             f"--test-rundir={self.rundir}", f"--config-path={self.conf}",
             f"-Sstatedir={self.statedir}", "sh", "-c", script],
            env=self.env, stdout=open(self.work / f"instance.{self.lives}.log", "w"),
            stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not ready.exists():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the instance did not start (see {self.work})")
            time.sleep(0.1)

    def bindings(self) -> str:
        """flux-core's Python bindings folder."""
        return self.run("python", "-c",
                        "import flux, os; print(os.path.dirname(os.path.dirname(flux.__file__)))")

    def shutdown(self) -> None:
        self.run("shutdown", "--quiet", check=False)
        if self.proc is not None:
            self.proc.wait(timeout=60)

    def crash(self) -> int:
        """SIGKILL rank 0's broker (a crash: no shutdown, nothing posted).
        Returns its pid."""
        pid = int(self.run("getattr", "broker.pid"))
        # Its children outlive it (the initial program's `sleep`).
        self.orphans = descendants(pid)
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_rest(self) -> None:
        """After a crash of rank 0: SIGKILL the brokers left (`flux start`
        would only after its 20 s exit timeout) and rank 0's orphans, and
        wait for `flux start`."""
        assert self.proc is not None
        for pid in children(self.proc.pid) + self.orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.orphans = []
        self.proc.wait(timeout=60)

    def run(self, *args: str, check: bool = True, input: str | None = None,
            strip: bool = True) -> str:
        out = subprocess.run([self.flux, *args], env=dict(self.env, FLUX_URI=self.uri),
                             capture_output=True, text=True, input=input, timeout=120)
        if check and out.returncode != 0:
            raise RuntimeError(f"flux {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout.strip() if strip else out.stdout

    def submit(self, *args: str) -> str:
        return self.run("submit", *args)

    def jobs(self) -> list[dict]:
        return json.loads(self.run("jobs", "-a", "--json"))["jobs"]

    def resource_status(self) -> dict:
        code = "import flux, json; print(json.dumps(flux.Flux().rpc('resource.status').get()))"
        return json.loads(self.run("python", "-c", code))

    def wait_state(self, jobid: str, states: set[str], timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.run("jobs", "-n", "-o", "{state}", jobid)
            if state in states:
                return
            time.sleep(0.2)
        raise RuntimeError(f"job {jobid} did not reach {states}")


class Fluxpipe:
    """`fluxpipe run` with an http source (or a kafka one), restarted on
    the same data_dir."""

    def __init__(self, binary: str, work: Path, port: int, kafka: tuple[str, str] | None):
        self.binary = binary
        self.work = work
        self.port = port
        self.kafka = kafka
        self.out = work / "out.jsonl"
        self.alerts_out = work / "alerts.jsonl"
        self.anomalies_out = work / "anomalies.jsonl"
        self.archive = f"sqlite://{work / 'archive.db'}"
        self.config = work / "fluxpipe.toml"
        if kafka is None:
            source = f"""[sources.flux]
type = "http"
address = "127.0.0.1:{port}"
cluster = "live"
"""
        else:
            source = f"""[sources.flux]
type = "kafka"
bootstrap_servers = "{kafka[0]}"
topics = ["{kafka[1]}"]
group_id = "{kafka[1]}-fluxpipe"
changelog = true
cluster = "live"
librdkafka_options = {{ "session.timeout.ms" = "6000" }}
"""
        self.feed_silent_for = FEED_SILENT_FOR["http" if kafka is None else "kafka"]
        self.api_port = free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        # Inactive jobs stay held for the whole run: `fluxpipe jobs -a`
        # lists them beside `flux jobs -a`.
        self.config.write_text(f"""data_dir = "{work / 'data'}"
[checkpoint]
interval_secs = 2
[operators]
inactive_grace_secs = 86400
[api]
address = "127.0.0.1:{self.api_port}"
{source}
[sinks.out]
type = "file"
path = "{self.out}"
inputs = ["transitions", "jobs", "resources"]
[sinks.alerts]
type = "file"
path = "{self.alerts_out}"
inputs = ["alerts"]
[sinks.anomalies]
type = "file"
path = "{self.anomalies_out}"
inputs = ["anomalies"]
[sinks.archive]
type = "database"
url = "{self.archive}"
inputs = ["jobs", "resources"]

# The watchman's rules stand in for the built-in ones (10m, 1m); any rule
# leaves out the built-in job and node rules (hours and minutes: none
# would fire here), and node_offline is given a short `for`.
[alerts.rules.feed_silent]
kind = "feed_silent"
for = "{self.feed_silent_for}s"
severity = "critical"
[alerts.rules.instance_down]
kind = "instance_down"
for = "{INSTANCE_DOWN_FOR}s"
severity = "critical"
[alerts.rules.node_offline]
kind = "node_offline"
for = "{NODE_OFFLINE_FOR}s"
severity = "critical"
""")
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.proc = subprocess.Popen(
            [self.binary, "run", "--config", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.work / f"fluxpipe.{self.starts}.log", "w"))
        if self.kafka is not None:
            time.sleep(0.5)
            return
        deadline = time.time() + 30
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("fluxpipe run did not start listening")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def records(self, path: Path | None = None) -> list[dict]:
        path = path or self.out
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"kind": "torn", "line": line})
        return out

    def alerts(self) -> list[dict]:
        """The records of the alerts file sink."""
        return self.records(self.alerts_out)

    def metric(self, name: str, **labels: str) -> float | None:
        """A sample of /metrics whose labels include `labels` (None when
        there is none, or fluxpipe does not answer)."""
        try:
            with urllib.request.urlopen(f"{self.api}/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            metric, _, rest = series.partition("{")
            if metric != name:
                continue
            have = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if "=" in kv)
            if all(have.get(k) == json.dumps(v) for k, v in labels.items()):
                return float(value)
        return None

    def wait_checkpoint(self, after: float, timeout: float = 60) -> bool:
        """Wait for a checkpoint begun after `after` (wall clock): one that
        ended later, then the next. Records written to the file sinks
        before `after` are then in it (a SIGKILL cuts the files back to the
        checkpoint: the watch's alerts are not replayed)."""
        def since(t: float):
            v = self.metric("fluxpipe_checkpoint_last_success_timestamp_seconds")
            return v if v is not None and v > t else None
        first = wait_for(lambda: since(after), timeout)
        return first is not None and wait_for(lambda: since(first), timeout) is not None


class Forwarder:
    def __init__(self, inst: Instance, work: Path, args: list[str], name: str,
                 python: str = sys.executable):
        self.inst, self.work, self.args, self.name = inst, work, args, name
        self.python = python
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, stdout=subprocess.DEVNULL) -> None:
        self.starts += 1
        # Through the wrapper, under the system Python: it must find
        # flux-core's bindings by itself (`flux python`).
        env = dict(self.inst.env)
        if self.python != sys.executable:
            # A Python of its own (with confluent-kafka): flux-core's
            # bindings by PYTHONPATH, as its README says.
            env["PYTHONPATH"] = self.inst.bindings()
        self.proc = subprocess.Popen(
            [self.python, str(FORWARDER), "--uri", self.inst.uri, *self.args],
            env=env, stdout=stdout,
            stderr=open(self.work / f"{self.name}.{self.starts}.log", "w"))

    def log_text(self) -> str:
        return "".join((self.work / f"{self.name}.{i}.log").read_text()
                       for i in range(1, self.starts + 1))

    def last_log(self) -> str:
        return (self.work / f"{self.name}.{self.starts}.log").read_text()


def watched(r: dict) -> bool:
    """An alert record of the watch rules."""
    return r.get("kind") == "alert" and r.get("alertname") in WATCH_ALERTS


def first_of_each(records: list[dict], problems: list[str], what: str) -> list[dict]:
    """Alert records, each once: watch alerts are at least once (one
    announced again after a restart repeats its record id), and a repeat
    must say it is one (`restored`)."""
    seen, out = set(), []
    for r in records:
        rid = r.get("record_id")
        if rid in seen:
            if r.get("restored") is not True:
                problems.append(f"{what}: {r.get('alertname')} {r.get('status')} repeated "
                                f"without `restored`: {r}")
            continue
        seen.add(rid)
        out.append(r)
    return out


def alert_time(text: str | None) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else math.nan


class Watchman:
    """The watch episodes: each must add to the alerts file exactly one
    firing and one resolution of its alert, and no other watch alert; at
    the end the file holds exactly those, in order, and no node_offline
    (but one a rank's own long offline interval earns)."""

    def __init__(self, pipe: Fluxpipe, problems: list[str]):
        self.pipe, self.problems = pipe, problems
        self.expected: list[str] = []
        # When a watch alert was last seen written (a SIGKILL of fluxpipe
        # waits for a checkpoint after it).
        self.seen_at = 0.0
        self.episodes = 0

    def begin(self) -> set[str]:
        return {r.get("record_id") for r in self.pipe.alerts() if watched(r)}

    def new(self, before: set[str], alertname: str, status: str | None = None) -> list[dict]:
        return [r for r in self.pipe.alerts() if watched(r)
                and r.get("record_id") not in before and r.get("alertname") == alertname
                and (status is None or r.get("status") == status)]

    def wait(self, what: str, before: set[str], alertname: str, status: str,
             timeout: float) -> dict | None:
        t0 = time.time()
        got = wait_for(lambda: self.new(before, alertname, status), timeout)
        if not got:
            self.problems.append(f"{what}: no {alertname} {status} within {timeout:.0f}s")
            return None
        self.seen_at = time.time()
        log(f"{what}: {alertname} {status} after {self.seen_at - t0:.1f}s")
        return got[0]

    def end(self, what: str, before: set[str], alertname: str, hold: float,
            source: str | None, down_at: float, up_at: float) -> None:
        """The episode's records: one firing, then one resolution, of
        `alertname` for cluster live (and `source`); the condition began
        after `down_at` (what caused it) and ended after `up_at` (what
        ended it)."""
        self.episodes += 1
        mine = first_of_each([r for r in self.pipe.alerts()
                              if watched(r) and r.get("record_id") not in before],
                             self.problems, what)
        got = [(r.get("alertname"), r.get("status")) for r in mine]
        if got != [(alertname, "firing"), (alertname, "resolved")]:
            self.problems.append(f"{what}: the alerts written were {got}, not one "
                                 f"{alertname} firing and its resolution")
        for r in mine:
            if r.get("alertname") != alertname:
                continue
            labels = r.get("labels") or {}
            want = {"alertname": alertname, "flux_cluster": "live", "severity": "critical"}
            if source is not None:
                want["source"] = source
            if r.get("cluster") != "live" or r.get("source") != source or labels != want:
                self.problems.append(f"{what}: {r.get('status')} record names "
                                     f"cluster {r.get('cluster')!r} source {r.get('source')!r} "
                                     f"labels {labels}, not {want}")
            since, starts = r.get("since", math.nan), alert_time(r.get("starts_at"))
            if not abs(starts - (since + hold)) < 0.01:
                self.problems.append(f"{what}: starts_at {r.get('starts_at')} is not since "
                                     f"{since} + {hold}s")
            if alertname == "instance_down" and not since >= down_at - 0.5:
                self.problems.append(f"{what}: instance_down since {since}, before the "
                                     f"instance went down ({down_at:.3f})")
            if r.get("status") == "resolved":
                ends = alert_time(r.get("ends_at"))
                if not ends >= up_at - 0.5:
                    self.problems.append(f"{what}: resolved at {r.get('ends_at')}, before "
                                         f"what ended it ({up_at:.3f})")
            elif r.get("ends_at") is not None:
                self.problems.append(f"{what}: a firing record with ends_at {r.get('ends_at')}")
        self.expected += [r.get("record_id") for r in mine]

    def check_file(self, records: list[dict]) -> None:
        """The whole alerts file at the end: the episodes' records, in
        order, each once (a SIGKILL cut none back; a repeat is a restored announcement), and
        no node_offline but one a rank's own offline interval earns
        (longer than its `for`: not a rank of an instance that was down)."""
        alerts = [r for r in self.pipe.alerts()]
        torn = [r for r in alerts if r.get("kind") != "alert"]
        if torn:
            self.problems.append(f"{len(torn)} lines of the alerts file are not alerts: "
                                 f"{torn[:3]}")
        ours = first_of_each([r for r in alerts if r.get("alertname") in WATCH_ALERTS],
                             self.problems, "the alerts file")
        got = [r.get("record_id") for r in ours]
        if got != self.expected:
            self.problems.append(f"the alerts file's watch alerts are not the "
                                 f"{self.episodes} episodes' firing and resolution: "
                                 f"{[(r.get('alertname'), r.get('status')) for r in ours]}")
        for a in alerts:
            if a.get("kind") != "alert" or a.get("alertname") in WATCH_ALERTS:
                continue
            if a.get("alertname") != "node_offline":
                self.problems.append(f"an alert of no rule of the test: {a}")
                continue
            held = offline_held(records, a.get("rank"), a.get("since"))
            if held is not None and held >= NODE_OFFLINE_FOR - 0.5:
                log(f"node_offline {a.get('status')} for rank {a.get('rank')}: its offline "
                    f"interval lasted {held:.1f}s, longer than the rule's for (a slow machine)")
            else:
                self.problems.append(f"node_offline {a.get('status')} for rank {a.get('rank')} "
                                     f"since {a.get('since')} (offline for "
                                     f"{'?' if held is None else f'{held:.1f}s'} before the "
                                     "instance went down or the rank came back)")
        log(f"alerts: {len(got)} watch alert records over {self.episodes} episodes, "
            f"{sum(1 for a in alerts if a.get('alertname') == 'node_offline')} node_offline")


def offline_held(records: list[dict], rank, since) -> float | None:
    """How long (event time) the rank's offline interval that began at
    `since` lasted, by its rank records: from an event that took it
    offline (not an instance-down: that makes it unknown) to the next
    that made it online or unknown. None when there is no such interval."""
    if not isinstance(since, (int, float)):
        return None
    mine = [r for r in records if r.get("kind") == "rank" and r.get("rank") == rank
            and isinstance(r.get("timestamp"), (int, float))]
    began = [r for r in mine if abs(r["timestamp"] - since) < 1e-6 and r.get("online") is False
             and r.get("event") != "instance-down"]
    if not began:
        return None
    after = [r["timestamp"] for r in mine if r["timestamp"] > since and r.get("online") is not False]
    return (min(after) if after else time.time()) - since


def workload_a(inst: Instance) -> dict[str, str]:
    """Jobs of every outcome; returns some of their ids by role."""
    ids: dict[str, str] = {}
    ids["ok"] = inst.submit("-N1", "true")
    ids["exit3"] = inst.submit("-N1", "sh", "-c", "exit 3")
    ids["signal"] = inst.submit("-N1", "sh", "-c", "kill -9 $$")
    ids["timeout"] = inst.submit("-N1", "-t", "1s", "sleep", "30")
    ids["prolog"] = inst.submit("-N1", "--setattr=user.fail=prolog", "true")
    ids["epilog"] = inst.submit("-N1", "--setattr=user.fail=epilog", "true")
    ids["unsat"] = inst.submit("-N", "8", "true")
    ids["held"] = inst.submit("-N1", "--urgency=0", "true")
    ids["held2"] = inst.submit("-N1", "--urgency=0", "true")
    ids["cancel_pending"] = inst.submit("-N1", "--urgency=0", "true")
    ids["running"] = inst.submit("-N1", "sleep", "300")
    ids["dep_ok"] = inst.submit("-N1", "sleep", "1")
    ids["after_ok"] = inst.submit("-N1", f"--dependency=afterok:{ids['dep_ok']}", "true")
    # Shapes: a name, tasks over nodes, a time limit; whole nodes; tasks
    # per node (the count waits for R).
    ids["shaped"] = inst.submit("-N2", "-n4", "--job-name=a-long-job-name", "-t", "90s", "true")
    ids["exclusive"] = inst.submit("-N2", "--exclusive", "true")
    ids["per_node"] = inst.submit("-N2", "--tasks-per-node=2", "/bin/hostname")
    ids["dep_bad"] = inst.submit("-N1", "--urgency=0", "true")
    ids["after_bad"] = inst.submit("-N1", f"--dependency=afterok:{ids['dep_bad']}", "true")
    for i in range(8):
        ids[f"batch{i}"] = inst.submit("-N1", "sh", "-c", f"sleep 0.{i}; exit {i % 3}")
    # A virtual queue's jobs and a queue's by property.
    ids["fast"] = inst.submit("-N1", "--queue=fast", "true")
    ids["fast_exit"] = inst.submit("-N1", "--queue=fast", "sh", "-c", "exit 2")
    ids["debug"] = inst.submit("-N1", "--queue=debug", "true")
    inst.wait_state(ids["running"], {"RUN"})
    inst.run("cancel", ids["cancel_pending"])
    # Its dependent can never run: a dependency exception.
    inst.run("cancel", ids["dep_bad"])
    inst.run("job", "urgency", ids["held"], "20")
    inst.run("cancel", ids["running"])
    return ids


def workload_b(inst: Instance, ids: dict[str, str]) -> set[int]:
    """After the instance's restart: more jobs, a drain while a job runs
    (draining), drains and undrains, the held job released. Returns the
    ranks flux showed draining after that drain."""
    ids["b_ok"] = inst.submit("-N1", "true")
    ids["b_long"] = inst.submit("-N1", "sleep", "4")
    inst.wait_state(ids["b_long"], {"RUN"})
    ranks = inst.run("jobs", "-n", "-o", "{ranks}", ids["b_long"])
    inst.run("resource", "drain", "--force", ranks, "drained while running")
    draining = idset(inst.run("resource", "status", "-s", "draining", "-n", "-o", "{ranks}"))
    inst.run("resource", "drain", "--force", "3", "maintenance")
    inst.run("resource", "undrain", "3")
    # A jobspec-update while it waits: its new time limit.
    inst.run("update", ids["held2"], "duration=5m")
    inst.run("job", "urgency", ids["held2"], "16")
    for i in range(5):
        ids[f"b_batch{i}"] = inst.submit("-N1", "sh", "-c", f"exit {i % 2}")
    ids["b_hold_cancel"] = inst.submit("-N1", "--urgency=0", "true")
    inst.run("cancel", ids["b_hold_cancel"])
    # A job that runs across a reload of job-exec: its shells are
    # reattached (bgexec), and it stays one job in RUN with its own times.
    ids["b_reattach"] = inst.submit("-N1", "sleep", "6")
    inst.run("job", "wait-event", "-t", "30", "-p", "exec", ids["b_reattach"], "shell.start")
    inst.run("module", "reload", "job-exec")
    inst.run("job", "wait-event", "-t", "30", "-p", "exec", ids["b_reattach"], "reattach")
    return draining


def wait_quiet(inst: Instance, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        active = inst.run("jobs", "-n", "-o", "{id}")
        if not active:
            return
        time.sleep(0.5)
    raise RuntimeError(f"jobs still active: {active}")


def same(exp, act, key: str) -> bool:
    if exp is None:
        return act in (None, 0, 0.0, "", [])
    if isinstance(exp, bool):
        return act is exp
    if isinstance(exp, (int, float)):
        return isinstance(act, (int, float)) and not isinstance(act, bool) \
            and math.isclose(exp, act, rel_tol=0, abs_tol=1e-5)
    return exp == act


def idset(text: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, (text or "").strip("[]").split(",")):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def transitions_of_clean_run(binary: str, journal: Path, work: Path) -> list[tuple]:
    """What one `fluxpipe run` with no kills makes of the whole journal."""
    out = work / "clean.jsonl"
    config = work / "clean.toml"
    config.write_text(f"""data_dir = "{work / 'clean-data'}"
[sources.journal]
type = "file"
include = ["{journal}"]
cluster = "live"
[sinks.out]
type = "file"
path = "{out}"
inputs = ["transitions"]
""")
    proc = subprocess.Popen([binary, "run", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    want = sum(1 for _ in journal.open())
    deadline = time.time() + 30
    last = -1
    while time.time() < deadline:
        time.sleep(1)
        n = sum(1 for _ in out.open()) if out.exists() else 0
        if n == last and n > 0:
            break
        last = n
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    log(f"clean run over {want} journal lines: {last} transitions")
    return [transition_key(json.loads(l)) for l in out.read_text().splitlines()]


def transition_key(t: dict) -> tuple:
    return (t["id"], t["from"], t["to"], t["event"], round(t["timestamp"], 6))


def dump_journal(fwd_args: list[str], inst: Instance, work: Path) -> Path:
    """The whole job and resource journals, read again by the forwarder to
    a file, up to both sentinels."""
    path = work / "journal.jsonl"
    with path.open("w") as f:
        dump = Forwarder(inst, work, ["--connect", "-", *fwd_args], "dump")
        dump.start(stdout=f)
        deadline = time.time() + 60
        while time.time() < deadline:
            text = path.read_text()
            if '{"id":-1,"events":[]}' in text and '{"events":[]}' in text:
                break
            time.sleep(0.2)
        time.sleep(0.5)
        assert dump.proc is not None
        dump.proc.send_signal(signal.SIGTERM)
        dump.proc.wait(timeout=30)
    return path


def create_topic(python: str, broker: str, topic: str) -> None:
    code = (
        "import sys, confluent_kafka.admin as a\n"
        "c = a.AdminClient({'bootstrap.servers': sys.argv[1]})\n"
        "for f in c.create_topics([a.NewTopic(sys.argv[2], 4, 1)]).values(): f.result(30)\n"
    )
    subprocess.run([python, "-c", code, broker, topic], check=True, timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fluxpipe", default=str(REPO / "target/release/fluxpipe"))
    ap.add_argument("--work", help="keep the work folder here (default: a temporary one)")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--kafka", metavar="BROKER", help="go through Kafka (a broker's address)")
    ap.add_argument("--forwarder-python", default=sys.executable,
                    help="the Python the forwarder runs with (for --kafka: one with confluent-kafka)")
    args = ap.parse_args()
    prefix = flux_prefix()
    if prefix is None:
        log("SKIPPED: no flux-core (set FLUX_PREFIX to its install prefix, or provide "
            "../shared/flux-core/install)")
        return 0
    rng = random.Random(args.seed)
    log(f"flux-core at {prefix}; seed {args.seed}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="live-flux."))
    work.mkdir(parents=True, exist_ok=True)
    inst = Instance(prefix, work)
    kafka = None
    connect = None
    if args.kafka:
        kafka = (args.kafka, f"live-flux-{os.getpid()}-{args.seed}")
        create_topic(args.forwarder_python, *kafka)
        connect = f"kafka://{kafka[0]}/{kafka[1]}"
    pipe = Fluxpipe(args.fluxpipe, work, free_port(), kafka)
    connect = connect or f"http://127.0.0.1:{pipe.port}/"
    log(f"route: forwarder → {connect} → fluxpipe run")
    fwd_args = ["--streams", "job,resource"]
    # Heartbeats every HEARTBEAT seconds: feed_silent stays quiet while it
    # lives (and waits for the instance).
    fwd = Forwarder(inst, work, ["--connect", connect,
                                 "--state", str(work / "forwarder.json"), "--reconnect",
                                 "--reconnect-delay", "0.5", "--ping-interval", "0.5",
                                 "--heartbeat", str(HEARTBEAT), "--exec-eventlogs",
                                 *fwd_args], "forwarder", python=args.forwarder_python)
    exiting = Forwarder(inst, work, ["--connect", "-", "--ping-interval", "0.5", *fwd_args],
                        "exiting")
    problems: list[str] = []
    watch = Watchman(pipe, problems)
    reconnected = "connected to the Flux instance again"
    # Everything written to the file sinks before this is in a checkpoint.
    saved_until = 0.0

    def checkpoint_now() -> bool:
        nonlocal saved_until
        t = time.time()
        if not pipe.wait_checkpoint(t):
            return False
        saved_until = t
        return True

    def start_exiting() -> None:
        with open(work / f"exiting.{exiting.starts + 1}.out", "w") as out:
            exiting.start(stdout=out)

    def exiting_connected() -> bool:
        out = work / f"exiting.{exiting.starts}.out"
        return out.exists() and '{"events":[]}' in out.read_text()

    def check_exiting(what: str) -> None:
        """The forwarder without --reconnect exits 1 when the instance goes."""
        assert exiting.proc is not None
        try:
            status = exiting.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            problems.append(f"{what}: the forwarder without --reconnect did not exit")
            exiting.proc.kill()
            return
        said = [l for l in exiting.last_log().splitlines()
                if any(w in l for w in ("went away", "ended", "broke"))]
        if status != 1:
            problems.append(f"{what}: the forwarder without --reconnect exited {status}, not 1")
        elif not said:
            problems.append(f"{what}: the forwarder without --reconnect said nothing of the "
                            "instance")
        else:
            log(f"{what}: the forwarder without --reconnect exited 1 ({said[0].strip()})")

    def instance_up(value: float) -> bool:
        return pipe.metric("flux_instance_up", flux_cluster="live") == value

    def instance_downs() -> int:
        return sum(1 for r in pipe.records()
                   if r.get("kind") == "rank" and r.get("event") == "instance-down")

    def kill_pipe(what: str = "") -> None:
        """SIGKILL fluxpipe run, once the watch alerts it wrote are in a
        checkpoint (the file sink is cut back to it, and they are not
        replayed), and start it again."""
        if watch.seen_at > saved_until and not checkpoint_now():
            problems.append("no checkpoint after a watch alert was written")
        pipe.kill()
        log(f"SIGKILL fluxpipe run ({pipe.starts}){what}")
        time.sleep(rng.uniform(0.0, 1.0))
        pipe.start()

    def kill_pipe_soon():
        time.sleep(rng.uniform(0.05, 1.5))
        kill_pipe()

    try:
        inst.start()
        pipe.start()
        fwd.start()
        start_exiting()

        # 1. A crash: SIGKILL of rank 0's broker, before any job (a crashed
        # instance's KVS goes back to its last checkpoint, taken at its
        # start: jobs submitted since would be gone from flux, not from
        # fluxpipe). fluxpipe first knows every rank online.
        def ranks_online() -> bool:
            last = {r.get("rank"): r.get("online") for r in pipe.records()
                    if r.get("kind") == "rank"}
            return sum(1 for v in last.values() if v is True) == inst.size
        if not wait_for(lambda: ranks_online() and exiting_connected(), 60):
            problems.append("crash: fluxpipe never had every rank online, or the forwarder "
                            "without --reconnect never read the backlog")
        before = watch.begin()
        reconnects = fwd.log_text().count(reconnected)
        down_at = time.time()
        log(f"SIGKILL rank 0's broker (pid {inst.crash()})")
        check_exiting("crash")
        if not wait_for(lambda: instance_up(0), 60):
            problems.append("crash: flux_instance_up{flux_cluster=live} never 0")
        watch.wait("crash", before, "instance_down", "firing", INSTANCE_DOWN_FOR + 60)
        inst.kill_rest()
        up_at = time.time()
        inst.start()
        log("instance started again (after the crash)")
        watch.wait("crash", before, "instance_down", "resolved", 60)
        if not wait_for(lambda: instance_up(1), 60):
            problems.append("crash: flux_instance_up{flux_cluster=live} never 1 again")
        watch.end("crash", before, "instance_down", INSTANCE_DOWN_FOR, None, down_at, up_at)
        assert fwd.proc is not None
        if not wait_for(lambda: fwd.log_text().count(reconnected) > reconnects
                        or fwd.proc.poll() is not None, 60) or fwd.proc.poll() is not None:
            problems.append(f"crash: the forwarder with --reconnect did not connect again "
                            f"(exit status {fwd.proc.poll()})")
        else:
            log("crash: the forwarder with --reconnect connected again")
        start_exiting()

        ids = workload_a(inst)
        kill_pipe_soon()
        inst.run("resource", "drain", "--force", "2", "disk check")
        kill_pipe_soon()

        # 2. The forwarder SIGKILLed for longer than feed_silent's `for`.
        before = watch.begin()
        assert fwd.proc is not None
        fwd.proc.send_signal(signal.SIGKILL)
        fwd.proc.wait()
        down_at = time.time()
        log(f"SIGKILL forwarder (for feed_silent's {pipe.feed_silent_for}s)")
        if watch.wait("forwarder killed", before, "feed_silent", "firing",
                      pipe.feed_silent_for + 60):
            seen = pipe.metric("fluxpipe_feed_last_seen_timestamp_seconds",
                               source="flux", flux_cluster="live")
            if seen is None or not seen <= time.time() - pipe.feed_silent_for + 1.0:
                problems.append(f"forwarder killed: fluxpipe_feed_last_seen_timestamp_seconds "
                                f"{seen}, {time.time() - (seen or 0):.1f}s ago, at the firing")
        up_at = time.time()
        fwd.start()
        watch.wait("forwarder killed", before, "feed_silent", "resolved", 60)
        watch.end("forwarder killed", before, "feed_silent", pipe.feed_silent_for, "flux",
                  down_at, up_at)
        inst.run("resource", "undrain", "2")
        time.sleep(rng.uniform(0.5, 2.0))

        # 3. A clean shutdown: fluxpipe SIGKILLed while the instance is down
        # (its down state comes back from the checkpoint or the forwarder),
        # before instance_down fires (a restart starts the watch's clocks
        # again: killed after its firing was checkpointed, it would fire
        # twice); then the instance started again.
        before = watch.begin()
        n_down = instance_downs()
        log("instance shutdown")
        down_at = time.time()
        inst.shutdown()
        check_exiting("shutdown")
        if not wait_for(lambda: instance_downs() > n_down and instance_up(0), 60):
            problems.append("shutdown: fluxpipe did not learn that the instance went down")
        if not checkpoint_now():
            problems.append("shutdown: no checkpoint after the instance-down")
        # Killed from here at once: a firing written after this look is in
        # no checkpoint yet, and is cut back and fires once again.
        if watch.new(before, "instance_down"):
            log("shutdown: instance_down fired before the SIGKILL could come; not killed")
        else:
            kill_pipe(" while the instance is down")
            if not wait_for(lambda: instance_up(0), 60):
                problems.append("shutdown: after the SIGKILL fluxpipe did not know the "
                                "instance down")
        watch.wait("shutdown", before, "instance_down", "firing", INSTANCE_DOWN_FOR + 60)
        up_at = time.time()
        inst.start()
        log("instance started again")
        watch.wait("shutdown", before, "instance_down", "resolved", 60)
        watch.end("shutdown", before, "instance_down", INSTANCE_DOWN_FOR, None, down_at, up_at)
        draining = workload_b(inst, ids)
        if not draining:
            problems.append("flux showed no rank draining under the running job")
        kill_pipe_soon()
        wait_quiet(inst)
        # Everything forwarded and acknowledged: the forwarder's state has
        # caught up with the newest events, and fluxpipe has every job.
        want = {j["id"] for j in inst.jobs()}
        deadline = time.time() + 60
        while time.time() < deadline:
            have = {r["id"] for r in pipe.records() if r.get("kind") == "job"}
            if want <= have:
                break
            time.sleep(0.5)
        time.sleep(3)
        # Asked while both run: `fluxpipe jobs` and `fluxpipe resource`
        # print what `flux jobs` and `flux resource` print.
        compare_cli(args.fluxpipe, pipe.api, inst, problems)
        check_reattached(pipe, inst, ids["b_reattach"], problems)
        # After the crash (its first run) and after the shutdown.
        if fwd.log_text().count(reconnected) < 2:
            problems.append("the forwarder did not say it reconnected after the crash and "
                            "after the shutdown")
        if pipe.stop() != 0:
            problems.append("fluxpipe run did not stop cleanly")
        assert fwd.proc is not None
        fwd.proc.send_signal(signal.SIGTERM)
        if fwd.proc.wait(timeout=30) != 0:
            problems.append("the forwarder did not exit 0 on SIGTERM")

        flux_jobs = inst.jobs()
        status = inst.resource_status()
        status["draining"] = inst.run("resource", "status", "-s", "draining", "-n", "-o", "{ranks}")
        journal = dump_journal(fwd_args, inst, work)
        records = pipe.records()
        compare(args.fluxpipe, work, flux_jobs, status, records, journal, problems,
                exactly_once_exempt=kafka is not None, draining_seen=draining)
        watch.check_file(records)
        compare_reports(args.fluxpipe, pipe.archive, flux_jobs, problems)
        log(f"{len(flux_jobs)} jobs, {pipe.starts - 1} SIGKILLs of fluxpipe run, "
            f"forwarder started {fwd.starts} times, instance started {inst.lives} times")
    finally:
        for p in (fwd.proc, exiting.proc, pipe.proc):
            if p is not None and p.poll() is None:
                p.kill()
        try:
            inst.shutdown()
        except Exception:
            if inst.proc is not None and inst.proc.poll() is None:
                inst.kill_rest()
        for pid in inst.orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in problems:
        print(f"DISAGREE: {p}")
    log(("OK" if not problems else f"{len(problems)} disagreements") + f" (work folder {work})")
    return 1 if problems else 0


# `flux jobs`'s default columns that fluxpipe's job records carry (NAME,
# NTASKS and QUEUE come from the jobspec, which the records do not keep).
def compare_cli(binary: str, api: str, inst: Instance, problems: list[str]) -> None:
    """`fluxpipe jobs -a`, `fluxpipe resource status` and `fluxpipe
    resource drain` against flux's own output, line by line."""
    def ours(*args: str) -> str:
        out = subprocess.run([binary, *args, "--url", api], capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            problems.append(f"fluxpipe {' '.join(args)} exited {out.returncode}: "
                            f"{out.stderr.strip()[-300:]}")
        return out.stdout

    def lines_equal(what: str, flux: str, mine: str) -> None:
        fl, ml = flux.splitlines(), mine.splitlines()
        if len(fl) != len(ml):
            problems.append(f"{what}: flux printed {len(fl)} lines, fluxpipe {len(ml)}")
        for f, m in zip(fl, ml):
            if f != m:
                problems.append(f"{what}: flux {f!r} fluxpipe {m!r}")

    # Its default format, as a plain `flux jobs` prints it.
    flux_jobs = inst.run("jobs", "-a", "-A", strip=False)
    lines_equal("jobs", flux_jobs, ours("jobs", "-a"))
    rows = []
    for args in (("resource", "status"), ("resource", "drain"),
                 ("resource", "status", "-s", "offline,drain")):
        flux = inst.run(*args, strip=False)
        lines_equal(" ".join(args), flux, ours(*args))
        rows.append(f"{' '.join(args)}: {len(flux.splitlines()) - 1} rows")
    # User names as Flux's side resolved them (the forwarder sends them
    # with submit): the API's own field, not a lookup on this host.
    flux_names = dict(line.split(None, 1) for line in
                      inst.run("jobs", "-a", "-A", "-n", "-o", "{id.dec} {username}").splitlines())
    api_jobs, after = [], ""
    while after is not None:
        url = f"{api}/api/v1/jobs?state=pending,running,inactive&limit=10000"
        with urllib.request.urlopen(url + (f"&after={urllib.parse.quote(after)}" if after else ""),
                                    timeout=30) as r:
            page = json.load(r)
        api_jobs += page["jobs"]
        after = page.get("next")
    got_names = {str(j["id"]): j.get("username") for j in api_jobs}
    wrong = [f"{i}: flux {n!r} fluxpipe {got_names.get(i)!r}"
             for i, n in flux_names.items() if got_names.get(i) != n]
    if wrong or not flux_names:
        problems.append(f"user names of {len(wrong)} of {len(flux_names)} jobs differ: "
                        + "; ".join(wrong[:5]))
    # `-u NAME` takes the name as Flux's side has it.
    name = next(iter(flux_names.values()), "")
    mine = [line for line in ours("jobs", "-a", "-n", "-u", name, "-o", "{id.dec}").splitlines()]
    if sorted(mine) != sorted(i for i, n in flux_names.items() if n == name):
        problems.append(f"fluxpipe jobs -u {name}: {len(mine)} jobs, flux has "
                        f"{sum(n == name for n in flux_names.values())}")
    if rows[1].endswith(" 0 rows"):
        problems.append("flux resource drain listed nothing: the comparison showed nothing")
    compare_queues(inst, ours, lines_equal, api, problems)
    log(f"fluxpipe jobs: {len(flux_jobs.splitlines()) - 1} jobs against flux jobs; "
        + "; ".join(rows))


def check_reattached(pipe: "Fluxpipe", inst: Instance, jobid: str,
                     problems: list[str]) -> None:
    """The job whose shells job-exec reattached after a reload: its exec
    progress says so (recoverable, reattached once), with no anomaly and
    no alert about it; its fields and transitions are compared with
    flux's with every other job's."""
    dec = str(int(inst.run("job", "id", "--to=dec", jobid)))
    with urllib.request.urlopen(f"{pipe.api}/api/v1/jobs/{dec}", timeout=30) as r:
        job = json.load(r)
    log_ = (job.get("exec") or {}).get("eventlog") or {}
    if not (log_.get("recoverable") is True and log_.get("reattaches") == 1
            and job.get("state") == "INACTIVE" and job.get("result") == "COMPLETED"):
        problems.append(f"reattached job {jobid}: exec {log_}, state {job.get('state')}, "
                        f"result {job.get('result')}")
    if job.get("alerts"):
        problems.append(f"reattached job {jobid}: alerts {job['alerts']}")
    said = [a for a in pipe.records(pipe.anomalies_out) if str(a.get("id")) == dec]
    if said:
        problems.append(f"reattached job {jobid}: anomalies {said[:3]}")
    log(f"reattach: job {jobid} ran across a job-exec reload (exec {log_.get('reattaches')} "
        "reattach, recoverable), no anomaly")


def nearest_rank(values: list[float], p: float) -> float | None:
    """The smallest value with at least `p` of them at or below it."""
    if not values:
        return None
    values = sorted(values)
    return values[min(max(math.ceil(p * len(values)), 1), len(values)) - 1]


def three_digits(seconds: float | None) -> float | None:
    """A wait as rollups keep it: milliseconds to 3 significant digits,
    rounded down."""
    if seconds is None:
        return None
    ms, unit = round(seconds * 1000), 1
    while ms // unit >= 1000:
        unit *= 10
    return (ms - ms % unit) / 1000


def compare_reports(binary: str, archive: str, flux_jobs: list[dict],
                    problems: list[str]) -> None:
    """`fluxpipe report jobs --by queue` and `--by user`, from the rows
    the database sink wrote and from its daily rollups, against what the
    fields of `flux jobs -a --json` imply, figure by figure."""
    done = [j for j in flux_jobs if j.get("state") == "INACTIVE"]

    def expected(key) -> dict:
        groups: dict = {}
        for j in done:
            groups.setdefault(key(j), []).append(j)
        out = {}
        for k, jobs in groups.items():
            ran = [j for j in jobs if j.get("t_run", 0) > 0 and j.get("t_cleanup", 0) >= j["t_run"]]
            run = {id(j): j["t_cleanup"] - j["t_run"] for j in ran}
            waits = [j["t_run"] - j["t_submit"] for j in jobs
                     if j.get("t_run", 0) > 0 and j["t_run"] >= j["t_submit"]]
            row = {"jobs": len(jobs)}
            for field in ("completed", "failed", "canceled", "timeout"):
                row[field] = sum(1 for j in jobs if j.get("result") == field.upper())
            row["core_hours"] = sum(j.get("ncores", 0) * run[id(j)] for j in ran) / 3600
            row["node_hours"] = sum(j.get("nnodes", 0) * run[id(j)] for j in ran) / 3600
            row["wait_mean_s"] = sum(waits) / len(waits) if waits else None
            row["wait_p50_s"] = nearest_rank(waits, 0.5)
            row["wait_p90_s"] = nearest_rank(waits, 0.9)
            row["wait_max_s"] = max(waits) if waits else None
            row["run_mean_s"] = sum(run.values()) / len(run) if run else None
            out[k] = row
        return out

    def close(a, b) -> bool:
        if a is None or b is None:
            return a is None and b is None
        return abs(a - b) <= 1e-6 * max(abs(a), 1.0)

    checked = 0
    for by, key in (("queue", lambda j: j.get("queue")),
                    ("user", lambda j: j.get("username"))):
        want = expected(key)
        for source in ("rows", "rollups"):
            out = subprocess.run(
                [binary, "report", "jobs", "--db", archive, "--by", by, "--from", source,
                 "--format", "json"], capture_output=True, text=True)
            if out.returncode != 0:
                problems.append(f"report jobs --by {by} --from {source}: {out.stderr.strip()}")
                continue
            got = {r[by]: r for r in json.loads(out.stdout)}
            if set(got) != set(want):
                problems.append(f"report --by {by} --from {source}: groups {sorted(map(str, got))}"
                                f", flux's jobs have {sorted(map(str, want))}")
                continue
            for k, row in want.items():
                for field, value in row.items():
                    mine = got[k].get(field)
                    if source == "rollups" and field in ("wait_p50_s", "wait_p90_s"):
                        value = three_digits(value)
                    if not close(value, mine):
                        problems.append(f"report --by {by} --from {source}, {by} {k}: {field} "
                                        f"is {mine}, flux's jobs imply {value}")
                    checked += 1
    log(f"fluxpipe report jobs: {checked} figures by queue and by user, from rows and "
        f"rollups, against flux jobs -a")


def compare_queues(inst: Instance, ours, lines_equal, api: str, problems: list[str]) -> None:
    """By queue: `flux jobs -q` (a parent takes its virtual queue's jobs),
    `flux resource status -q` (nodes by the instance's +NAME property),
    and the per-queue node series against flux's own counts."""
    fast = inst.run("jobs", "-a", "-A", "-n", "-q", "fast", "-o", "{id.dec}").split()
    in_batch = inst.run("jobs", "-a", "-A", "-n", "-q", "batch", "-o", "{id.dec}").split()
    if not fast or not set(fast) <= set(in_batch):
        problems.append(f"flux jobs -q batch does not list the fast jobs {fast}: "
                        "the virtual queue comparison shows nothing")
    for q in ("batch", "fast", "debug"):
        lines_equal(f"jobs -q {q}", inst.run("jobs", "-a", "-A", "-q", q, strip=False),
                    ours("jobs", "-a", "-q", q))
        lines_equal(f"resource status -q {q}",
                    inst.run("resource", "status", "-q", q, strip=False),
                    ours("resource", "status", "-q", q))
    with urllib.request.urlopen(f"{api}/metrics", timeout=30) as r:
        metrics = r.read().decode()
    for q in ("batch", "debug"):
        flux_ranks = idset(",".join(inst.run("resource", "status", "-q", q, "-s", "online,offline",
                                             "-n", "-o", "{ranks}").split()))
        series = re.search(rf'^flux_queue_nodes\{{[^}}]*queue="{q}",state="all"\}} (\d+)$',
                           metrics, re.M)
        got = int(series.group(1)) if series else None
        if got != len(flux_ranks):
            problems.append(f"flux_queue_nodes{{queue={q},state=all}}: fluxpipe {got}, "
                            f"flux {len(flux_ranks)} ({sorted(flux_ranks)})")
    log(f"queues: {len(in_batch)} jobs in batch (fast's {len(fast)} among them) as flux jobs -q; "
        "nodes by queue as flux resource status -q")


def all_ranks_of(status: dict) -> set[int]:
    return idset(",".join(x["rank"] for x in status["R"]["execution"]["R_lite"]))


def compare(binary: str, work: Path, flux_jobs: list[dict], status: dict, records: list[dict],
            journal: Path, problems: list[str], exactly_once_exempt: bool = False,
            draining_seen: set[int] = frozenset()) -> None:
    torn = [r for r in records if r.get("kind") == "torn"]
    if torn:
        problems.append(f"{len(torn)} torn lines in the file sink")
    jobs: dict[int, dict] = {}
    job_repeats = 0
    for r in records:
        if r.get("kind") == "job":
            job_repeats += r["id"] in jobs
            jobs[r["id"]] = r
    for fj in flux_jobs:
        got = jobs.get(fj["id"])
        if got is None:
            problems.append(f"job {fj['id']} ({fj.get('name')}): no job record")
            continue
        diff = [f"{k} flux {fj.get(k)!r} fluxpipe {got.get(k)!r}" for k in FIELDS
                if not same(fj.get(k), got.get(k), k)]
        ex = fj.get("exception") or {}
        if bool(ex.get("occurred")) != bool(got.get("exception_occurred")):
            diff.append(f"exception flux {ex} fluxpipe {got.get('exception_occurred')}")
        elif ex.get("occurred") and ex.get("type") != got.get("exception_type"):
            diff.append(f"exception type flux {ex.get('type')} fluxpipe "
                        f"{got.get('exception_type')}")
        if diff:
            problems.append(f"job {fj['id']} ({fj.get('name')}): " + "; ".join(diff))
    extra = set(jobs) - {j["id"] for j in flux_jobs}
    if extra:
        problems.append(f"job records flux does not have: {sorted(extra)}")

    expected = transitions_of_clean_run(binary, journal, work)
    got = [transition_key(r) for r in records if r.get("kind") == "transition"]
    missing = set(expected) - set(got)
    unexpected = set(got) - set(expected)
    repeats = len(got) - len(set(got))
    for t in sorted(missing)[:20]:
        problems.append(f"transition missing: {t}")
    for t in sorted(unexpected)[:20]:
        problems.append(f"transition not in a clean run: {t}")
    # The file sink is exactly once across SIGKILLs, but behind a source
    # that keeps a Kafka changelog (state may come from it): at least once.
    if (repeats or job_repeats) and not exactly_once_exempt:
        problems.append(f"{repeats} transitions and {job_repeats} job records written twice")
    log(f"{len(set(got))} transitions ({repeats} repeated across kills), "
        f"{len(jobs)} job records ({job_repeats} repeated)")

    # Ranks: the last record of each, against the broker's resource.status.
    ranks: dict[int, dict] = {}
    for r in records:
        if r.get("kind") == "rank" and not r.get("removed"):
            ranks[r["rank"]] = r
    online, torpid = idset(status.get("online", "")), idset(status.get("torpid", ""))
    draining_now = idset(status.get("draining", ""))
    # The shutdown: the forwarder said the instance went down, and every
    # rank's liveness became unknown then (not a page per node).
    down = {r["rank"] for r in records if r.get("kind") == "rank"
            and r.get("event") == "instance-down" and r.get("online") is None}
    if down != all_ranks_of(status):
        problems.append(f"ranks made unknown by the instance-down: {sorted(down)}")
    # What flux showed draining while the job ran, fluxpipe said too (the
    # job's rank is drained, and the job holds it until its free).
    for rank in sorted(draining_seen):
        if not any(r.get("kind") == "rank" and r.get("rank") == rank and r.get("draining")
                   for r in records):
            problems.append(f"rank {rank}: flux showed it draining, fluxpipe never did")
    drain = status.get("drain", {})
    all_ranks = all_ranks_of(status)
    for rank in sorted(all_ranks):
        got_r = ranks.get(rank)
        if got_r is None:
            problems.append(f"rank {rank}: no rank record")
            continue
        d = drain.get(str(rank))
        want = {"online": rank in online, "torpid": rank in torpid, "drained": d is not None,
                "draining": rank in draining_now}
        diff = [f"{k} flux {v} fluxpipe {got_r.get(k)}" for k, v in want.items()
                if got_r.get(k) != v]
        if d and got_r.get("drain_reason") != d.get("reason"):
            diff.append(f"drain reason flux {d.get('reason')!r} fluxpipe "
                        f"{got_r.get('drain_reason')!r}")
        if diff:
            problems.append(f"rank {rank}: " + "; ".join(diff))


if __name__ == "__main__":
    sys.exit(main())
