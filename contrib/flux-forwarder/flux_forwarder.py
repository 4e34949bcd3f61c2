#!/usr/bin/env python3
"""flux-forwarder: stream a Flux instance's journals to fluxpipe.

Reads the job-manager journal (job-manager.events-journal, through
flux.job.JournalConsumer) and the resource journal (resource.journal,
through flux.resource.journal.ResourceJournalConsumer) and sends them as
JSON Lines, one event per line, in the journal forms that fluxpipe's
sources read:

    {"id": <job id>, "events": [<event>], "R"?: {...},   job-manager journal
     "jobspec"?: {...}, "username"?: "<name>"}
    {"id": -1, "events": []}                             its end-of-backlog sentinel
    {"events": [<event>], "R"?: {...}}                   resource journal
    {"events": []}                                       its sentinel

and, after the resource journal's backlog and whenever it changes, the
instance's queue configuration (the `[queues]` table of its config, which
no eventlog carries) in a resource line of fluxpipe's own:

    {"events": [{"timestamp": <now>, "name": "queue-config",
                 "context": {"queues": {<name>: {"requires"?: [...], "parent"?: "..."}}}}]}

and, with --exec-eventlogs, each started job's exec eventlog
(guest.exec.eventlog, through flux.job.event_watch_async) as envelopes:

    {"stream": "exec", "id": <job id>, "event": <event>}

to a fluxpipe `http` source in acknowledged batches (the default way), to
a TCP or Unix socket (fire and forget), or to standard output.

The resume point (the newest timestamp of each journal, and per watched
job the newest exec event) is kept in a state file and advances only when
fluxpipe has acknowledged the lines: a restart of either side loses
nothing, and what is sent twice fluxpipe skips as repeats.

Everything that touches Flux is in run_flux(), Liveness, ExecWatches and
QueueConfigWatch; the framing, the resume logic and the senders are plain
functions and classes, tested in test_forwarder.py.
"""

from __future__ import annotations

import argparse
import collections
import errno
import gzip
import http.client
import json
import math
import functools
import os
import pwd
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Any, Callable, Optional

JOB = "job"
RESOURCE = "resource"
STREAMS = (JOB, RESOURCE)
# The exec eventlogs (RFC 50) of the started jobs: not a journal, one
# eventlog per job, watched from the job's `start` event on.
EXEC = "exec"
EXEC_EVENTLOG = "guest.exec.eventlog"


# ---------------------------------------------------------------- framing


def clean_event(event: dict) -> dict:
    """An RFC 18 event as plain JSON data: a copy without an empty context
    (the Python bindings add `"context": {}` to events that had none)."""
    out = dict(event)
    if out.get("context") == {}:
        del out["context"]
    return out


@functools.lru_cache(maxsize=4096)
def user_name(uid: Any) -> Optional[str]:
    """The name of a uid in this host's accounts (where Flux runs, so the
    cluster's own): what `flux jobs` shows. None when it has none."""
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, ValueError, TypeError, OverflowError):
        return None


def job_message(jobid: int, event: dict, R: Optional[dict] = None,
                jobspec: Optional[dict] = None,
                names: Callable[[Any], Optional[str]] = user_name) -> dict:
    """One job-manager journal message carrying one event. R rides along
    with `alloc` only (it gives fluxpipe the job's expiration, nodes and
    cores); the jobspec with `submit` only, cut to what fluxpipe reads of
    it (see `jobspec_kept`); with `submit` too, the submitter's name as
    this host's accounts give it (fluxpipe's host may not share them)."""
    msg: dict[str, Any] = {"id": int(jobid), "events": [clean_event(event)]}
    if R is not None and event.get("name") == "alloc":
        msg["R"] = R
    if event.get("name") == "submit":
        if jobspec is not None:
            msg["jobspec"] = jobspec_kept(jobspec)
        uid = (event.get("context") or {}).get("userid")
        name = names(uid) if isinstance(uid, int) and not isinstance(uid, bool) else None
        if name:
            msg["username"] = name
    return msg


# What fluxpipe reads of attributes.system (as flux-core's job-list does):
# never the working directory or the environment.
SYSTEM_KEPT = ("job", "queue", "duration", "project", "bank")


def jobspec_kept(jobspec: Any) -> Any:
    """The parts of a jobspec fluxpipe reads (version, resources, the first
    task's command[0] and counts, a few system attributes, the shell's
    per-resource option); anything else is not sent. Not a dict: as is
    (fluxpipe says what is wrong with it)."""
    if not isinstance(jobspec, dict):
        return jobspec
    out: dict[str, Any] = {}
    for key in ("version", "resources"):
        if key in jobspec:
            out[key] = jobspec[key]
    tasks = jobspec.get("tasks")
    if isinstance(tasks, list) and tasks and isinstance(tasks[0], dict):
        task = {k: v for k, v in tasks[0].items() if k in ("slot", "count")}
        command = tasks[0].get("command")
        if isinstance(command, list) and command:
            task["command"] = command[:1]
        out["tasks"] = [task]
    system = (jobspec.get("attributes") or {}).get("system")
    if isinstance(system, dict):
        kept = {k: system[k] for k in SYSTEM_KEPT if k in system}
        per = ((system.get("shell") or {}).get("options") or {}).get("per-resource")
        if per is not None:
            kept["shell"] = {"options": {"per-resource": per}}
        out["attributes"] = {"system": kept}
    return out


def resource_message(event: dict, R: Optional[dict] = None) -> dict:
    """One resource journal message carrying one event; R rides along with
    `resource-define`, the event it belongs to."""
    msg: dict[str, Any] = {"events": [clean_event(event)]}
    if R is not None and event.get("name") == "resource-define":
        msg["R"] = R
    return msg


def event_dict(event: Any) -> dict:
    """An eventlog entry as a dict: the journal consumers hand out dicts,
    flux.job.event_watch_async() EventLogEvent objects (name, timestamp,
    context)."""
    if isinstance(event, dict):
        return dict(event)
    out = {"timestamp": event.timestamp, "name": event.name}
    if event.context:
        out["context"] = dict(event.context)
    return out


# What fluxpipe reads of a queue's entry in the `[queues]` table (RFC 33:
# the properties that select its nodes, the queue a virtual queue is part of).
QUEUE_KEPT = ("requires", "parent")


def queues_kept(config: Any) -> dict:
    """The `[queues]` table of a broker's config (what `config.get`
    answers), each queue cut to what fluxpipe reads of it: policies can be
    large, and fluxpipe does not read them. A queue's name stays even when
    nothing is left of its entry (it is still a queue). No table: `{}`, so
    that fluxpipe learns of its removal."""
    queues = config.get("queues") if isinstance(config, dict) else None
    if not isinstance(queues, dict):
        return {}
    return {str(name): {k: entry[k] for k in QUEUE_KEPT if k in entry}
            if isinstance(entry, dict) else {}
            for name, entry in queues.items()}


def exec_message(jobid: int, event: dict) -> dict:
    """One event of a job's exec eventlog, as the envelope fluxpipe's
    decoder reads (`"stream"` first: its fast path keys on it; the cluster
    is the fluxpipe source's, as for journal lines)."""
    return {"stream": EXEC, "id": int(jobid), "event": clean_event(event)}


def sentinel(stream: str) -> dict:
    """The end-of-backlog message of a journal."""
    return {"id": -1, "events": []} if stream == JOB else {"events": []}


def encode(msg: dict) -> bytes:
    """One JSON Lines line: compact, UTF-8, newline-terminated."""
    return (json.dumps(msg, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


# ----------------------------------------------------------------- resume


def empty_state() -> dict:
    return {JOB: 0.0, RESOURCE: 0.0, EXEC: {}, PENDING: []}


# Lines sent but never acknowledged when the forwarder last stopped: sent
# again first at the next start.
PENDING = "pending"


def _timestamp(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) \
        and math.isfinite(value) and value >= 0


def load_state(path: Optional[str]) -> dict:
    """The newest timestamp acknowledged of each journal, of the exec
    eventlog of each job still watched (`"exec": {"<job id>": timestamp}`;
    0: none yet), and the lines left unacknowledged at the last stop
    (`"pending"`). No path or no file: start from the beginning. A file
    that cannot be read as such state is an error (rather than silently
    resending or skipping everything). Older files lack `exec` or
    `pending`: none."""
    state = empty_state()
    if not path or not os.path.exists(path):
        return state
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"state file {path}: not JSON ({e}); fix it, or start with --reset "
                         "to send everything again") from None
    except UnicodeDecodeError:
        raise ValueError(f"state file {path}: not text; fix it, or start with --reset "
                         "to send everything again") from None
    if not isinstance(data, dict):
        raise ValueError(f"state file {path}: not a JSON object")
    for stream in STREAMS:
        value = data.get(stream, 0.0)
        if not _timestamp(value):
            raise ValueError(f"state file {path}: `{stream}` is not a timestamp")
        state[stream] = float(value)
    jobs = data.get(EXEC, {})
    if not isinstance(jobs, dict):
        raise ValueError(f"state file {path}: `{EXEC}` is not an object")
    for jobid, value in jobs.items():
        if not (jobid.isascii() and jobid.isdigit()) or not _timestamp(value):
            raise ValueError(f"state file {path}: `{EXEC}`: `{jobid}` is not a job id "
                             "with a timestamp")
        state[EXEC][int(jobid)] = float(value)
    pending = data.get(PENDING, [])
    if not isinstance(pending, list) or not all(isinstance(x, str) for x in pending):
        raise ValueError(f"state file {path}: `{PENDING}` is not a list of lines")
    state[PENDING] = pending
    return state


def save_state(path: str, state: dict) -> None:
    """Write the state atomically (temporary file, fsync, rename)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".flux-forwarder.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            data: dict[str, Any] = {s: state[s] for s in STREAMS}
            if state.get(EXEC):
                data[EXEC] = {str(j): t for j, t in sorted(state[EXEC].items())}
            if state.get(PENDING):
                data[PENDING] = list(state[PENDING])
            json.dump(data, f)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def since(state: dict, stream: str, overlap: float) -> float:
    """The `since` to ask a journal for: the newest timestamp acknowledged,
    less the overlap (never below 0, which means everything)."""
    return max(0.0, state[stream] - overlap)


# What the delivery of a line does to the resume state (applied in the
# order sent, once fluxpipe has acknowledged the line and all before it):
#   (JOB, ts) / (RESOURCE, ts)   the journal's position
#   (EXEC, jobid, ts)            the job's exec eventlog position
#   (EXEC_END, jobid)            the job's exec eventlog is complete
EXEC_END = "exec-end"


class Immediate:
    """An output without acknowledgements (a socket, stdout): a line counts
    as delivered once written."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self.write = write
        self.on_ack: Callable[[list], None] = lambda effects: None

    def send(self, line: Optional[bytes], effect: Optional[tuple]) -> None:
        if line is not None:
            self.write(line)
        if effect is not None:
            self.on_ack([effect])

    def unacknowledged(self) -> list[bytes]:
        return []


class Forwarder:
    """Frames journal and exec eventlog events, hands them to the output,
    and keeps the resume state of what the output has acknowledged.

    `output` is a callable taking one encoded line (delivered once
    written), or an object with `send(line, effect)` and an `on_ack`
    attribute it calls with the effects of the lines acknowledged, in order
    (HttpSender). `clock` gives seconds for the state interval. The state is
    written to `state_path` at most every `interval` seconds, and by
    `checkpoint()`. `on_start`, when given, is called with the job id when
    a job's `start` event is sent (to watch its exec eventlog);
    `on_backlog_end`, with the stream once a journal's sentinel is sent
    (the queue configuration goes after the resource backlog).
    """

    def __init__(self, output: Any, state: dict,
                 state_path: Optional[str] = None, interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_start: Optional[Callable[[int], None]] = None) -> None:
        self.output = output if hasattr(output, "send") else Immediate(output)
        self.lock = threading.Lock()
        self.state = {JOB: state.get(JOB, 0.0), RESOURCE: state.get(RESOURCE, 0.0),
                      EXEC: dict(state.get(EXEC, {})), PENDING: []}
        # The newest exec event sent per job, acknowledged or not: what a
        # watch skips.
        self.exec_sent = dict(self.state[EXEC])
        self.state_path = state_path
        self.interval = interval
        self.clock = clock
        self.last_save = clock()
        self.dirty = False
        self.sent = {JOB: 0, RESOURCE: 0, EXEC: 0}
        self.on_start = on_start
        self.on_backlog_end: Optional[Callable[[str], None]] = None
        self.output.on_ack = self.acknowledged
        # Left over from the last stop: first in line.
        for line in state.get(PENDING, []):
            self.output.send(line.encode() if line.endswith("\n") else (line + "\n").encode(),
                             None)

    def acknowledged(self, effects: list) -> None:
        """The output delivered lines with these effects (in order)."""
        with self.lock:
            for effect in effects:
                kind = effect[0]
                if kind in STREAMS:
                    if effect[1] > self.state[kind]:
                        self.state[kind] = float(effect[1])
                        self.dirty = True
                elif kind == EXEC:
                    jobid, ts = effect[1], effect[2]
                    if jobid in self.state[EXEC] and ts > self.state[EXEC][jobid]:
                        self.state[EXEC][jobid] = float(ts)
                        self.dirty = True
                elif kind == EXEC_END:
                    if self.state[EXEC].pop(effect[1], None) is not None:
                        self.dirty = True

    def job_event(self, jobid: int, event: dict, R: Optional[dict] = None,
                  jobspec: Optional[dict] = None) -> None:
        if int(jobid) == -1 or "name" not in event:
            self.end_of_backlog(JOB)
            return
        if event.get("name") == "start" and self.on_start is not None:
            # Before the `start` is sent: a saved state that has the
            # `start` acknowledged also has the job among those to watch.
            self.on_start(int(jobid))
        self._send(JOB, job_message(jobid, event, R, jobspec), event)

    def exec_watched(self, jobid: int) -> None:
        """A job's exec eventlog is watched from now on: remember it at
        once, so a restart watches it again."""
        jobid = int(jobid)
        with self.lock:
            if jobid not in self.state[EXEC]:
                self.state[EXEC][jobid] = 0.0
                self.dirty = True
        self.exec_sent.setdefault(jobid, 0.0)

    def exec_event(self, jobid: int, event: Any) -> None:
        """One event of a job's exec eventlog. A watch reads the eventlog
        from its start: events up to the newest one already sent for the
        job are skipped. Timestamps increase within one eventlog, so this
        skips exactly the repeats."""
        jobid = int(jobid)
        event = event_dict(event)
        ts = event.get("timestamp")
        if not isinstance(ts, (int, float)) or "name" not in event:
            return
        if ts <= self.exec_sent.get(jobid, 0.0):
            return
        self.exec_sent[jobid] = float(ts)
        self.output.send(encode(exec_message(jobid, event)), (EXEC, jobid, float(ts)))
        self.sent[EXEC] += 1
        self._maybe_checkpoint()

    def exec_ended(self, jobid: int) -> None:
        """The exec eventlog's watch ended (the job is inactive, or gone):
        forget the job once everything sent of it is acknowledged."""
        self.exec_sent.pop(int(jobid), None)
        self.output.send(None, (EXEC_END, int(jobid)))

    def resource_event(self, event: dict, R: Optional[dict] = None) -> None:
        if "name" not in event:
            self.end_of_backlog(RESOURCE)
            return
        self._send(RESOURCE, resource_message(event, R), event)

    def instance_gone(self, why: str, now: float) -> None:
        """Tell fluxpipe the whole instance went away: Flux posts nothing
        when it shuts down (some ranks go offline, rank 0 never does), so
        this one resource line of fluxpipe's own (`instance-down`) says
        that its ranks' state is unknown until the next `restart`. It
        moves no resume point."""
        msg = resource_message({"timestamp": now, "name": "instance-down",
                                "context": {"reason": why}})
        self.output.send(encode(msg), None)

    def queue_config(self, queues: dict, now: float) -> None:
        """Tell fluxpipe the instance's queue configuration (`queues_kept`):
        the eventlogs do not carry the `[queues]` table, and fluxpipe needs
        it to follow RFC 33 virtual queues and count each queue's nodes.
        One resource line of fluxpipe's own (`queue-config`, not a Flux
        event), stamped `now`; like `instance-down`, it moves no resume
        point (a restart asks the config again rather than the journal)."""
        msg = resource_message({"timestamp": now, "name": "queue-config",
                                "context": {"queues": queues}})
        self.output.send(encode(msg), None)

    def end_of_backlog(self, stream: str) -> None:
        # A sentinel's timestamp (if any) is no event's: the state keeps
        # the newest real event.
        self.output.send(encode(sentinel(stream)), None)
        if self.on_backlog_end is not None:
            self.on_backlog_end(stream)

    def _send(self, stream: str, msg: dict, event: dict) -> None:
        ts = event.get("timestamp")
        effect = (stream, float(ts)) if isinstance(ts, (int, float)) else None
        self.output.send(encode(msg), effect)
        self.sent[stream] += 1
        self._maybe_checkpoint()

    def _maybe_checkpoint(self) -> None:
        if self.clock() - self.last_save >= self.interval:
            self.checkpoint()

    def checkpoint(self, final: bool = False) -> None:
        """Write the acknowledged state; at the final one, with the lines
        still unacknowledged."""
        self.last_save = self.clock()
        if not self.state_path:
            return
        pending = [line.decode() for line in self.output.unacknowledged()] if final else []
        with self.lock:
            if not (self.dirty or pending):
                return
            state = {JOB: self.state[JOB], RESOURCE: self.state[RESOURCE],
                     EXEC: dict(self.state[EXEC]), PENDING: pending}
            self.dirty = False
        save_state(self.state_path, state)


# ----------------------------------------------------------------- output


def parse_address(text: str) -> tuple[str, Any]:
    """`-` → stdout; `http://HOST:PORT[/PATH]` (or https) → a fluxpipe
    `http` source; `unix:/path` → a Unix socket; `HOST:PORT` → TCP;
    `kafka://...` is refused with a word on what to use instead."""
    if text == "-":
        return ("stdout", None)
    if text.startswith("unix:"):
        return ("unix", text[5:])
    if text.startswith(("http://", "https://")):
        url = urllib.parse.urlsplit(text)
        try:
            url.port
        except ValueError:
            raise ValueError(f"address `{text}`: bad port; expected http://HOST:PORT[/PATH]") \
                from None
        if not url.hostname:
            raise ValueError(f"address `{text}`: expected http://HOST:PORT[/PATH]")
        return ("http", text)
    if text.startswith("kafka://"):
        servers, _, topic = text[len("kafka://"):].partition("/")
        if not servers or not topic or "/" in topic:
            raise ValueError(f"address `{text}`: expected kafka://HOST:PORT[,HOST:PORT]/TOPIC")
        return ("kafka", (servers, topic))
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address `{text}`: expected http://HOST:PORT, HOST:PORT, "
                         "unix:PATH or -")
    return ("tcp", (host.strip("[]"), int(port)))


def backoff_delays(first: float = 0.1, cap: float = 10.0):
    """0.1 s doubling to 10 s, for ever."""
    delay = first
    while True:
        yield delay
        delay = min(cap, delay * 2)


class SocketWriter:
    """Writes lines to a socket, reconnecting with backoff when it breaks.
    A line whose write failed is written again on the new connection
    (fluxpipe skips repeats). No acknowledgements: a line written into a
    connection whose reader has just died is lost (use http).

    With `heartbeat` > 0, a thread writes a blank line (fluxpipe counts it
    as a heartbeat and applies nothing) once nothing has been written for
    that long: an idle cluster is not taken for a dead feed, and a broken
    connection shows (and is made again) before the next real line would
    be lost in it."""

    def __init__(self, kind: str, address: Any, log: Callable[[str], None],
                 sleep: Callable[[float], None] = time.sleep,
                 heartbeat: float = 0.0) -> None:
        self.kind = kind
        self.address = address
        self.log = log
        self.sleep = sleep
        self.sock: Optional[socket.socket] = None
        # Writers: the reactor's thread (lines) and the heartbeat's.
        self.lock = threading.RLock()
        self.heartbeat = heartbeat
        self.last_write = time.monotonic()
        self.stopping = threading.Event()
        self.thread = start_thread(self._beat, "fluxpipe-heartbeat") if heartbeat > 0 else None

    def _connect(self) -> None:
        for delay in backoff_delays():
            try:
                if self.kind == "unix":
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(self.address)
                else:
                    s = socket.create_connection(self.address, timeout=10)
                    s.settimeout(None)
                self.sock = s
                self.log(f"connected to {self.address}")
                return
            except OSError as e:
                self.log(f"cannot connect to {self.address}: {e}; retrying in {delay:.1f}s")
                self.sleep(delay)

    def __call__(self, line: bytes) -> None:
        with self.lock:
            while True:
                if self.sock is None:
                    self._connect()
                try:
                    assert self.sock is not None
                    self.sock.sendall(line)
                    self.last_write = time.monotonic()
                    return
                except OSError as e:
                    self.log(f"connection to {self.address} lost: {e}")
                    self.close()

    def _beat(self) -> None:
        """The heartbeat thread: a blank line after `heartbeat` seconds
        without a write, written (and the connection made again) as a
        line would be."""
        while True:
            due = self.last_write + self.heartbeat - time.monotonic()
            if self.stopping.wait(max(due, 0.0)):
                return
            if time.monotonic() - self.last_write >= self.heartbeat:
                self(b"\n")

    def stop(self) -> None:
        """Stop the heartbeats (the connection stays, for a last line)."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=1)

    def close(self) -> None:
        with self.lock:
            if self.sock is not None:
                try:
                    self.sock.close()
                finally:
                    self.sock = None


def stdout_writer(line: bytes) -> None:
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread that never takes SIGTERM or SIGINT: it starts with
    them blocked (a thread inherits the mask), so the reactor's signal
    watchers (signalfd) see them; taken by another thread, their default
    action would end the process."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return thread


def http_post(url: str, body: bytes, token: Optional[str], timeout: float,
              conn_cache: dict, context: Optional[ssl.SSLContext] = None
              ) -> tuple[int, dict, bytes]:
    """POST one batch (gzip) on a kept-alive connection; returns (status,
    headers, body). An empty body (a heartbeat) goes as is, Content-Length
    0, without Content-Encoding. `context`: the TLS settings of https://
    (default: the system's trust store). Raises OSError (and http.client
    errors) when the connection fails."""
    parts = urllib.parse.urlsplit(url)
    conn = conn_cache.get("conn")
    if conn is None:
        if parts.scheme == "https":
            if context is None:
                context = ssl.create_default_context()
            conn = http.client.HTTPSConnection(parts.hostname, parts.port or 443,
                                               timeout=timeout, context=context)
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port or 80,
                                              timeout=timeout)
        conn_cache["conn"] = conn
    headers = {"Content-Type": "application/x-ndjson"}
    if body:
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(body, 1)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", parts.path or "/", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    except BaseException:
        conn.close()
        conn_cache.pop("conn", None)
        raise


class HttpSender:
    """Sends lines to a fluxpipe `http` source in batches, one batch in
    flight, and tells the forwarder what was acknowledged.

    `send` (from the reactor) queues a line with its effect; it waits while
    `max_pending` lines are unacknowledged, so Flux holds the rest in its
    journals. A thread takes the oldest lines (up to `batch_lines` /
    `batch_bytes`), posts them until fluxpipe answers 200 (the lines are
    safe there), then drops them and calls `on_ack` with their effects.
    Any failure (no connection, a reset mid-batch, 429/503, a timeout)
    sends the same batch again after a backoff (fluxpipe skips what it had
    already applied). 413: the batch is halved. Other 4xx answers are
    configuration errors: logged, and retried slowly, as the operator may
    fix fluxpipe while we wait.

    With `heartbeat` > 0, once nothing has been posted for that long and
    nothing is queued, the same thread posts an empty body (fluxpipe
    answers 200 and applies nothing): an idle cluster is not taken for a
    dead feed. Never while a batch is queued, in flight or waiting to be
    sent again (the batch says as much), never retried (the next one comes
    an interval later), its failures logged sparingly."""

    def __init__(self, url: str, log: Callable[[str], None], token: Optional[str] = None,
                 max_pending: int = 100_000, batch_lines: int = 20_000,
                 batch_bytes: int = 4 << 20, timeout: float = 120.0,
                 sleep: Optional[Callable[[float], None]] = None,
                 post: Callable[..., tuple[int, dict, bytes]] = http_post,
                 context: Optional[ssl.SSLContext] = None, heartbeat: float = 0.0) -> None:
        self.url = url
        self.context = context
        self.log = log
        self.token = token
        self.max_pending = max_pending
        self.batch_lines = batch_lines
        self.batch_bytes = batch_bytes
        self.timeout = timeout
        self.post = post
        self.queue: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self._sleep = sleep
        self.on_ack: Callable[[list], None] = lambda effects: None
        self.conn: dict = {}
        self.failures = 0
        self.last_error = ""
        self.heartbeat = heartbeat
        # When the last POST (batch or heartbeat) ended: the heartbeat's clock.
        self.last_post = time.monotonic()
        self.heartbeat_failures = 0
        self.thread = start_thread(self._run, "fluxpipe-sender")

    def send(self, line: Optional[bytes], effect: Optional[tuple]) -> None:
        with self.cond:
            while len(self.queue) >= self.max_pending and not self.stopping.is_set():
                self.cond.wait(0.5)
            self.queue.append((line, effect))
            self.cond.notify_all()

    def unacknowledged(self) -> list[bytes]:
        with self.cond:
            return [line for line, _ in self.queue if line is not None]

    def wait_empty(self, timeout: float) -> bool:
        """Wait until everything queued is acknowledged (True) or timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.5))
            return True

    def stop(self) -> None:
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()
        self.thread.join(timeout=self.timeout + 1)
        conn = self.conn.pop("conn", None)
        if conn is not None:
            conn.close()

    def _pause(self, seconds: float) -> None:
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            self.stopping.wait(seconds)

    def _take(self) -> Optional[list]:
        """The oldest queued items that make one batch (without removing);
        None when a heartbeat is due instead (nothing queued)."""
        with self.cond:
            while not self.queue and not self.stopping.is_set():
                wait = 0.5
                if self.heartbeat > 0:
                    wait = self.last_post + self.heartbeat - time.monotonic()
                    if wait <= 0:
                        return None
                self.cond.wait(min(wait, 0.5))
            batch, size = [], 0
            for line, effect in self.queue:
                n = len(line) if line is not None else 0
                if batch and (len(batch) >= self.batch_lines or size + n > self.batch_bytes):
                    break
                batch.append((line, effect))
                size += n
            return batch

    def _run(self) -> None:
        while not self.stopping.is_set():
            batch = self._take()
            if batch is None:
                self._beat()
                continue
            if not batch:
                continue
            body = b"".join(line for line, _ in batch if line is not None)
            if body and not self._deliver(body, len(batch)):
                continue
            with self.cond:
                for _ in batch:
                    self.queue.popleft()
                self.cond.notify_all()
            self.on_ack([effect for _, effect in batch if effect is not None])

    def _beat(self) -> None:
        """One heartbeat: an empty POST, not retried."""
        try:
            status, _, answer = self.post(self.url, b"", self.token, self.timeout,
                                          self.conn, context=self.context)
            what = "" if status == 200 else \
                f"{status} {answer.decode('utf-8', 'replace').strip()}"
        except (OSError, http.client.HTTPException) as e:
            what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        self.last_post = time.monotonic()
        if not what:
            if self.heartbeat_failures:
                self.log(f"fluxpipe at {self.url}: heartbeats answered again after "
                         f"{self.heartbeat_failures} failed")
            self.heartbeat_failures = 0
            return
        self.heartbeat_failures += 1
        # The first failure and then every 10th: a down fluxpipe is one
        # line every ten intervals.
        if self.heartbeat_failures == 1 or self.heartbeat_failures % 10 == 0:
            self.log(f"fluxpipe at {self.url}: heartbeat failed ({what}; "
                     f"{self.heartbeat_failures} in a row); next in {self.heartbeat:g}s")

    def _failed(self, what: str, delay: float) -> None:
        self.failures += 1
        # The first failure of a run and then every 10th: an unreachable
        # fluxpipe is one line every few seconds, not a flood.
        if self.failures == 1 or self.failures % 10 == 0 or what != self.last_error:
            self.log(f"fluxpipe at {self.url}: {what}; sending again in {delay:.1f}s "
                     f"({len(self.queue)} lines unacknowledged)")
        self.last_error = what
        self._pause(delay)

    def _deliver(self, body: bytes, items: int) -> bool:
        """Post until acknowledged; False if the batch must be taken again
        (halved, or stopping)."""
        for delay in backoff_delays():
            if self.stopping.is_set():
                return False
            try:
                status, headers, answer = self.post(self.url, body, self.token, self.timeout,
                                                    self.conn, context=self.context)
            except (OSError, http.client.HTTPException) as e:
                self.last_post = time.monotonic()
                self._failed(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, delay)
                continue
            self.last_post = time.monotonic()
            if status == 200:
                if self.failures:
                    self.log(f"fluxpipe at {self.url}: delivering again after "
                             f"{self.failures} failed attempts")
                self.failures, self.last_error = 0, ""
                self._note_invalid(answer)
                return True
            text = answer.decode("utf-8", "replace").strip()
            if status == 413 and items > 1:
                self.batch_lines = max(1, items // 2)
                self.log(f"fluxpipe at {self.url}: batch too large ({text}); "
                         f"sending at most {self.batch_lines} lines at once")
                return False
            if status in (429, 503):
                retry = headers.get("retry-after", "")
                wait = float(retry) if retry.replace(".", "", 1).isdigit() else delay
                self._failed(f"{status} {text}", min(max(wait, 0.1), 30.0))
                continue
            # 400, 401, 404, 413 of one line, 415: a configuration error on
            # either side; slow retries while someone fixes it.
            self._failed(f"{status} {text}", max(delay, 5.0))
        return False

    def _note_invalid(self, answer: bytes) -> None:
        try:
            counts = json.loads(answer)
        except ValueError:
            return
        if isinstance(counts, dict) and counts.get("invalid"):
            self.log(f"fluxpipe refused {counts['invalid']} lines as invalid: "
                     f"{counts.get('errors', [])[:3]}")


def kafka_key(line: bytes, effect: Optional[tuple]) -> bytes:
    """The message key: a job's id for its journal events and exec
    envelopes (a job stays in one partition, in order: fluxpipe's state of
    a job belongs to one partition), `resource` for the resource journal
    (one partition, in order)."""
    if effect is not None and effect[0] == RESOURCE:
        return b"resource"
    if effect is not None and effect[0] == EXEC:
        return str(effect[1]).encode()
    if line.startswith(b'{"id":'):
        end = line.find(b",", 6)
        if end > 6:
            return line[6:end]
    return b"resource" if line.startswith(b'{"events"') else b"sentinel"


class KafkaSender:
    """Produces lines to a Kafka topic that fluxpipe's `kafka` source reads
    (confluent-kafka, librdkafka underneath): idempotent, `acks=all`,
    retried for ever (`message.timeout.ms=0`), so each partition keeps its
    order and a message is acknowledged once every in-sync replica has it.
    Lines are acknowledged to the forwarder in the order sent: the resume
    point moves over a line only when it and every line before it are
    delivered. `send` waits while `max_pending` lines are undelivered.

    With `heartbeat` > 0, the polling thread produces a blank message
    (fluxpipe counts it as a heartbeat and applies nothing) to each
    partition of the topic that nothing was delivered to for that long:
    every member of fluxpipe's consumer group hears from the feed, whichever
    partitions it reads, when the cluster is idle or its lines all hash to
    other partitions. The partitions come from the producer's metadata,
    kept until an error. One round of heartbeats at a time: while one is
    undelivered (the broker is down), none is added behind it."""

    def __init__(self, servers: str, topic: str, log: Callable[[str], None],
                 options: Optional[dict] = None, max_pending: int = 100_000,
                 producer: Any = None, heartbeat: float = 0.0) -> None:
        config = {
            "bootstrap.servers": servers,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 0,
            "linger.ms": 20,
            "compression.type": "gzip",
        }
        config.update(options or {})
        if producer is None:
            try:
                import confluent_kafka
            except ImportError as e:
                raise SystemExit(
                    f"flux-forwarder: --connect kafka://... needs the confluent-kafka package "
                    f"({e}): `flux python -m pip install confluent-kafka`, or Debian's "
                    "python3-confluent-kafka") from None
            producer = confluent_kafka.Producer(config)
        self.producer = producer
        self.topic = topic
        self.log = log
        self.max_pending = max_pending
        self.on_ack: Callable[[list], None] = lambda effects: None
        self.cond = threading.Condition()
        # Sent, in order: [seq, line, effect, delivered]
        self.queue: collections.deque = collections.deque()
        self.seq = 0
        self.failures = 0
        self.heartbeat = heartbeat
        # Partition → when a message was last delivered to it (or a
        # heartbeat produced); the topic's partitions, None until known.
        self.heard: dict[int, float] = {}
        self.partitions: Optional[list[int]] = None
        self.beats_out = 0
        self.beat_failures = 0
        self.next_beat = time.monotonic() + heartbeat
        self.stopping = threading.Event()
        self.thread = start_thread(self._poll, "fluxpipe-kafka")

    def send(self, line: Optional[bytes], effect: Optional[tuple]) -> None:
        with self.cond:
            while len(self.queue) >= self.max_pending and not self.stopping.is_set():
                self.cond.wait(0.5)
            self.seq += 1
            item = [self.seq, line, effect, line is None]
            self.queue.append(item)
        if line is not None:
            self._produce(item)
        else:
            self._advance()

    def _produce(self, item: list) -> None:
        _, line, effect, _ = item
        while True:
            try:
                self.producer.produce(self.topic, value=line, key=kafka_key(line, effect),
                                      on_delivery=lambda err, msg, item=item: self._delivered(
                                          err, item, msg))
                return
            except BufferError:
                # librdkafka's own queue is full: let it deliver some.
                self.producer.poll(0.1)

    def _delivered(self, err: Any, item: list, msg: Any = None) -> None:
        if err is not None:
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                self.log(f"kafka topic {self.topic}: {err}; producing again "
                         f"({self.failures} failures)")
            if not self.stopping.is_set():
                self._produce(item)
            return
        with self.cond:
            item[3] = True
            if msg is not None:
                self.heard[msg.partition()] = time.monotonic()
        self._advance()

    def _advance(self) -> None:
        effects = []
        with self.cond:
            while self.queue and self.queue[0][3]:
                _, _, effect, _ = self.queue.popleft()
                if effect is not None:
                    effects.append(effect)
            self.cond.notify_all()
        if effects:
            self.on_ack(effects)

    def _poll(self) -> None:
        while not self.stopping.is_set():
            self.producer.poll(0.1)
            if self.heartbeat > 0 and time.monotonic() >= self.next_beat:
                self._beat()

    def _topic_partitions(self) -> list[int]:
        """The topic's partitions, from the producer's metadata (asked
        again after an error). Raises on failure (librdkafka's
        KafkaException, or an error in the topic's metadata)."""
        if self.partitions is None:
            meta = self.producer.list_topics(self.topic, timeout=10)
            topic = meta.topics.get(self.topic)
            if topic is None or topic.error is not None or not topic.partitions:
                raise RuntimeError(f"no partitions ({topic.error if topic else 'no topic'})")
            self.partitions = sorted(topic.partitions)
        return self.partitions

    def _beat(self) -> None:
        """A blank message to every partition nothing was delivered to for
        an interval; next look when the oldest of them is due again."""
        now = time.monotonic()
        self.next_beat = now + self.heartbeat
        with self.cond:
            if self.beats_out:
                return
        try:
            partitions = self._topic_partitions()
        except Exception as e:  # noqa: BLE001 (librdkafka's KafkaException)
            self.partitions = None
            self._beat_failed(f"cannot list the partitions: {e}")
            return
        with self.cond:
            idle = [p for p in partitions if now - self.heard.get(p, -math.inf) >= self.heartbeat]
            busy = [self.heard[p] for p in partitions if p not in idle]
            for p in idle:
                self.heard[p] = now
            self.beats_out += len(idle)
        if busy:
            self.next_beat = min(busy) + self.heartbeat
        for p in idle:
            try:
                self.producer.produce(self.topic, value=b"\n", partition=p,
                                      on_delivery=self._beat_delivered)
            except Exception as e:  # noqa: BLE001 (BufferError, KafkaException)
                with self.cond:
                    self.beats_out -= 1
                self.partitions = None
                self._beat_failed(f"partition {p}: {e}")

    def _beat_delivered(self, err: Any, _msg: Any) -> None:
        with self.cond:
            self.beats_out -= 1
        if err is not None:
            # Perhaps the partitions changed: asked again next time.
            self.partitions = None
            self._beat_failed(str(err))
        elif self.beat_failures:
            self.log(f"kafka topic {self.topic}: heartbeats delivered again after "
                     f"{self.beat_failures} failed")
            self.beat_failures = 0

    def _beat_failed(self, what: str) -> None:
        self.beat_failures += 1
        if self.beat_failures == 1 or self.beat_failures % 10 == 0:
            self.log(f"kafka topic {self.topic}: heartbeat failed ({what}; "
                     f"{self.beat_failures} failures)")

    def unacknowledged(self) -> list[bytes]:
        with self.cond:
            return [item[1] for item in self.queue if item[1] is not None and not item[3]]

    def wait_empty(self, timeout: float) -> bool:
        self.producer.flush(timeout)
        with self.cond:
            return not self.queue

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)


# ------------------------------------------------------------------- Flux


def attach(forwarder: Forwarder, job_consumer: Any, resource_consumer: Any,
           on_end: Callable[[str], None]) -> None:
    """Route the consumers' events to the forwarder. A consumer's callback
    gets None when its stream ends."""

    def job_cb(event: Any) -> None:
        if event is None:
            on_end(JOB)
        else:
            forwarder.job_event(int(event.jobid), dict(event), getattr(event, "R", None),
                                getattr(event, "jobspec", None))

    def resource_cb(event: Any) -> None:
        if event is None:
            on_end(RESOURCE)
        else:
            forwarder.resource_event(dict(event), getattr(event, "R", None))

    if job_consumer is not None:
        job_consumer.set_callback(job_cb)
    if resource_consumer is not None:
        resource_consumer.set_callback(resource_cb)


class Liveness:
    """Notices the Flux instance going away. flux-core (0.88) does not end
    a journal consumer when its broker shuts down, so the forwarder pings
    the broker (`broker.ping`) every `interval` seconds: an error answer
    (the connection is gone) or `misses` pings in a row unanswered at
    the next tick means the instance is gone. Ticks count only while the
    reactor runs, so a forwarder blocked on a slow fluxpipe is never taken
    for a dead instance."""

    def __init__(self, handle: Any, on_gone: Callable[[str], None],
                 interval: float = 2.0, misses: int = 3) -> None:
        self.handle = handle
        self.on_gone = on_gone
        self.interval = interval
        self.misses = misses
        self.outstanding = 0
        self.seq = 0
        self.gone = False
        self.timer = handle.timer_watcher_create(interval, self._tick, repeat=interval)

    def start(self) -> None:
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def _tick(self, *_args: Any) -> None:
        if self.gone:
            return
        if self.outstanding >= self.misses:
            self._lost(f"no answer to {self.outstanding} pings")
            return
        self.seq += 1
        self.outstanding += 1
        try:
            future = self.handle.rpc("broker.ping", {"seq": self.seq, "pad": ""})
            future.then(self._answered)
        except OSError as e:
            self._lost(str(e))

    def _answered(self, future: Any, *_args: Any) -> None:
        try:
            future.get()
        except OSError as e:
            self._lost(str(e))
            return
        self.outstanding = 0

    def _lost(self, why: str) -> None:
        if not self.gone:
            self.gone = True
            self.on_gone(why)


class ExecWatches:
    """Watches the exec eventlog of jobs (flux.job.event_watch_async with
    eventlog="guest.exec.eventlog") and hands their events to the
    forwarder. The job-info module behind it waits for the job to start,
    follows the guest namespace while the job runs and the main namespace
    after, and ends the stream (ENODATA) once the job is inactive and its
    exec eventlog complete, or when the job never ran."""

    def __init__(self, handle: Any, job_module: Any, forwarder: Forwarder,
                 log: Callable[[str], None]) -> None:
        self.handle = handle
        self.job_module = job_module
        self.forwarder = forwarder
        self.log = log
        self.futures: dict[int, Any] = {}

    def watch(self, jobid: int) -> None:
        jobid = int(jobid)
        if jobid in self.futures:
            return
        self.forwarder.exec_watched(jobid)
        try:
            future = self.job_module.event_watch_async(
                self.handle, jobid, eventlog=EXEC_EVENTLOG)
        except OSError as e:
            self.log(f"cannot watch the exec eventlog of job {jobid}: {e}")
            self.forwarder.exec_ended(jobid)
            return
        self.futures[jobid] = future
        # then(cb, arg) calls cb(future, arg) in every flux-core version
        # (newer ones take *args).
        future.then(self._on_event, jobid)

    def resume(self) -> None:
        """Watch again the jobs the state says are watched."""
        with self.forwarder.lock:
            jobs = sorted(self.forwarder.state[EXEC])
        for jobid in jobs:
            self.watch(jobid)

    def _on_event(self, future: Any, jobid: int) -> None:
        try:
            event = future.get_event()
        except OSError as e:
            # ENOENT: the job is gone (purged); EPERM: not ours to read.
            self.log(f"exec eventlog of job {jobid}: {e}")
            event = None
        if event is None:
            self.futures.pop(jobid, None)
            self.forwarder.exec_ended(jobid)
            return
        self.forwarder.exec_event(jobid, event)

    def cancel(self) -> None:
        for future in list(self.futures.values()):
            try:
                future.cancel()
            except OSError:
                pass
        self.futures.clear()


class QueueConfigWatch:
    """Sends the instance's queue configuration (the `[queues]` table of
    the broker's config, `config.get`) to the forwarder: once the resource
    journal's backlog has ended (the line is stamped now: sent earlier it
    would come before older backlog events), and then whenever it changes,
    as read every `interval` seconds by a reactor timer (a `flux config
    reload` posts no event). One per connection: after a reconnect the
    backlog ends again and the table is sent again.

    The RPC is asynchronous (a broker slow to answer never holds up the
    journals or the pings), one at a time. A failure is logged once per
    streak of failures and the table asked again at the next tick: it never
    stops the forwarder (a lost instance is Liveness's to notice)."""

    def __init__(self, handle: Any, forwarder: Forwarder, log: Callable[[str], None],
                 interval: float, clock: Callable[[], float] = time.time) -> None:
        self.handle = handle
        self.forwarder = forwarder
        self.log = log
        self.clock = clock
        self.sent: Optional[dict] = None
        self.asking = False
        self.failing = False
        self.timer = handle.timer_watcher_create(interval, self._tick, repeat=interval)

    def backlog_ended(self, stream: str) -> None:
        """A journal's sentinel was sent: after the resource one, the first
        table goes, and the ticks begin."""
        if stream == RESOURCE:
            self._ask()
            self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def _tick(self, *_args: Any) -> None:
        self._ask()

    def _ask(self) -> None:
        if self.asking:
            return
        try:
            future = self.handle.rpc("config.get")
            # Before then(): a future already answered calls back at once.
            self.asking = True
            future.then(self._answered)
        except OSError as e:
            self.asking = False
            self._failed(e)

    def _answered(self, future: Any, *_args: Any) -> None:
        self.asking = False
        try:
            config = future.get()
        except OSError as e:
            self._failed(e)
            return
        if self.failing:
            self.failing = False
            self.log("the queue configuration can be read again (config.get)")
        queues = queues_kept(config)
        if queues != self.sent:
            self.sent = queues
            self.forwarder.queue_config(queues, self.clock())

    def _failed(self, error: OSError) -> None:
        if not self.failing:
            self.failing = True
            self.log(f"cannot read the queue configuration (config.get): {error}; "
                     "trying again at each check")


def import_flux() -> Any:
    """flux-core's Python bindings, or a one-line error naming the way out."""
    try:
        import flux  # noqa: F401 (provided by flux-core)
        import flux.job
        import flux.resource.journal
    except ImportError as e:
        raise SystemExit(
            f"flux-forwarder: cannot import flux-core's Python bindings ({e}); run it with "
            "`flux python -m flux_forwarder ...` (or `flux env VENV/bin/flux-forwarder` when "
            "installed in a venv), install it into flux-core's Python "
            "(`flux python -m pip install ./contrib/flux-forwarder`), or set PYTHONPATH "
            "to flux-core's python3.X folder (PREFIX/lib/flux/python3.X)") from None
    return flux


# What run_once() says of the instance when the reactor returns.
STOPPED, ENDED, GONE = "stopped", "ended", "gone"


def run_once(args: argparse.Namespace, forwarder: Forwarder, log: Callable[[str], None],
             flux_module: Any, handle: Any) -> str:
    """Start the journals on an open handle and run the reactor until a
    signal (STOPPED), a journal's end (ENDED) or the instance going away
    (GONE)."""
    watches = None
    if getattr(args, "exec_eventlogs", False):
        watches = ExecWatches(handle, flux_module.job, forwarder, log)
        forwarder.on_start = watches.watch
        if forwarder.state[EXEC]:
            log(f"watching again the exec eventlogs of {len(forwarder.state[EXEC])} jobs")
        watches.resume()
    job_c = res_c = None
    with forwarder.lock:
        resume = {s: since(forwarder.state, s, args.overlap) for s in STREAMS}
    if JOB in args.streams:
        job_c = flux_module.job.JournalConsumer(
            handle, full=True, since=resume[JOB], include_sentinel=True)
    if RESOURCE in args.streams:
        res_c = flux_module.resource.journal.ResourceJournalConsumer(
            handle, since=resume[RESOURCE], include_sentinel=True)
    outcome: list[str] = []
    queues = None
    if res_c is not None and getattr(args, "queues_interval", 0.0) > 0:
        queues = QueueConfigWatch(handle, forwarder, log, args.queues_interval)
    forwarder.on_backlog_end = queues.backlog_ended if queues is not None else None

    def on_end(stream: str) -> None:
        outcome.append(ENDED)
        log(f"the {stream} journal ended")
        handle.reactor_stop()

    def on_gone(why: str) -> None:
        outcome.append(GONE)
        log(f"the Flux instance went away ({why})")
        handle.reactor_stop()

    attach(forwarder, job_c, res_c, on_end)
    for c in (job_c, res_c):
        if c is not None:
            c.start()

    def on_signal(signum: int) -> None:
        outcome.append(STOPPED)
        log(f"stopping ({signal.Signals(signum).name})")
        handle.reactor_stop()

    # Signal watchers of the reactor: Python's own handlers would only run
    # once the reactor hands control back.
    watchers = [
        handle.signal_watcher_create(signum, lambda *_a, s=signum: on_signal(s))
        for signum in (signal.SIGTERM, signal.SIGINT)
    ]
    for w in watchers:
        w.start()
    # Write the state even when no event comes for a while.
    timer = handle.timer_watcher_create(
        args.state_interval, lambda *_: forwarder.checkpoint(), repeat=args.state_interval)
    timer.start()
    liveness = Liveness(handle, on_gone, interval=args.ping_interval)
    liveness.start()
    broke = ""
    try:
        rc = handle.reactor_run()
        broke = f"the reactor returned {rc}"
    except OSError as e:
        broke = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    finally:
        liveness.stop()
        timer.stop()
        forwarder.on_backlog_end = None
        if queues is not None:
            queues.stop()
        for w in watchers:
            w.stop()
        if watches is not None:
            watches.cancel()
        for c in (job_c, res_c):
            stop = getattr(c, "stop", None)
            if stop is not None:
                try:
                    stop()
                except OSError:
                    pass
    if STOPPED in outcome:
        return STOPPED
    if outcome:
        return outcome[0]
    # The signal and ping watchers keep the reactor busy for ever: it
    # returns on its own (-1, or OSError) only when the connection to the
    # broker breaks (a broker killed, a lost socket), never at a clean stop.
    log(f"the connection to the Flux broker broke ({broke})")
    return GONE


def open_flux(args: argparse.Namespace, flux_module: Any) -> Any:
    """A handle on the instance once it is up. The broker's socket appears
    before rc1 has loaded the job manager, and a journal asked for then
    fails with ENOSYS, which flux-core's consumers swallow (nothing ever
    comes): wait for the broker's RUN state first."""
    handle = flux_module.Flux(args.uri) if args.uri else flux_module.Flux()
    handle.rpc("state-machine.wait").get()
    return handle


def run_flux(args: argparse.Namespace, forwarder: Forwarder, log: Callable[[str], None],
             flux_module: Any = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Forward until a signal (exit 0), or until the instance goes away (a
    failed ping, or the connection to the broker breaking: a broker killed)
    or a journal ends: exit 1 (for the service manager to restart us), or
    with --reconnect wait for the instance to come back and go on from the
    acknowledged position. What is unacknowledged is given --drain-timeout
    to be delivered before exit; the rest goes in the state file. The
    heartbeats are the senders' own (their threads), so they go on while
    the reactor is idle and while we wait for the instance: fluxpipe
    learns that the instance is down from the `instance-down` line, not
    from silence."""
    if flux_module is None:
        flux_module = import_flux()
    status = 0
    first = True
    while True:
        try:
            handle = open_flux(args, flux_module)
        except OSError as e:
            where = args.uri or os.environ.get("FLUX_URI") or "the enclosing instance"
            if first and not args.reconnect:
                log(f"cannot connect to Flux at {where}: {e}")
                status = 1
                break
            log(f"cannot connect to Flux at {where}: {e}; trying again in {args.reconnect_delay}s")
            sleep(args.reconnect_delay)
            continue
        if not first:
            log("connected to the Flux instance again")
        first = False
        outcome = run_once(args, forwarder, log, flux_module, handle)
        if outcome == GONE and RESOURCE in args.streams:
            forwarder.instance_gone("the forwarder lost the instance", time.time())
        forwarder.checkpoint()
        if outcome == STOPPED:
            break
        if not args.reconnect:
            status = 1
            break
        log(f"waiting for the instance to come back (every {args.reconnect_delay}s)")
        sleep(args.reconnect_delay)
    output = forwarder.output
    writer = getattr(output, "write", None)
    if isinstance(writer, SocketWriter):
        writer.stop()
    if isinstance(output, (HttpSender, KafkaSender)):
        if not output.wait_empty(args.drain_timeout):
            left = len(output.unacknowledged())
            log(f"{left} lines not acknowledged after {args.drain_timeout}s: kept in the "
                "state file, sent first at the next start")
        output.stop()
    forwarder.checkpoint(final=True)
    return status


def check(args: argparse.Namespace, log: Callable[[str], None], flux_module: Any = None) -> int:
    """--check: connect to both ends, say what was found, exit."""
    ok = True
    kind, address = args.output
    if kind != "stdout":
        if flux_module is None:
            flux_module = import_flux()
        try:
            handle = open_flux(args, flux_module)
            size = handle.attr_get("size")
            handle.rpc("broker.ping", {"seq": 0, "pad": ""}).get()
            log(f"ok: Flux instance at {args.uri or os.environ.get('FLUX_URI', 'default')} "
                f"(size {size})")
        except OSError as e:
            log(f"cannot reach Flux at {args.uri or os.environ.get('FLUX_URI', 'default')}: {e}")
            ok = False
    if kind == "kafka":
        try:
            import confluent_kafka.admin
            servers, topic = address
            meta = confluent_kafka.admin.AdminClient(
                {"bootstrap.servers": servers, **args.kafka_options}).list_topics(timeout=10)
            if topic in meta.topics:
                parts = len(meta.topics[topic].partitions)
                log(f"ok: Kafka at {servers}, topic {topic} ({parts} partitions)")
            else:
                log(f"Kafka at {servers} has no topic {topic} (create it, or let the "
                    "broker create it on first use)")
                ok = False
        except ImportError as e:
            log(f"--connect kafka://... needs the confluent-kafka package ({e})")
            ok = False
        except Exception as e:  # noqa: BLE001 (librdkafka's KafkaException)
            log(f"cannot reach Kafka at {address[0]}: {e}")
            ok = False
    if kind == "http":
        try:
            status, _, body = http_post(address, b"", args.token, 30.0, {}, context=args.tls)
            if status == 200:
                log(f"ok: fluxpipe at {address} ({body.decode().strip()})")
            else:
                log(f"fluxpipe at {address} answered {status}: {body.decode().strip()}")
                ok = False
        except (OSError, http.client.HTTPException) as e:
            log(f"cannot reach fluxpipe at {address}: {e}")
            ok = False
    elif kind in ("tcp", "unix"):
        try:
            s = socket.socket(socket.AF_UNIX if kind == "unix" else socket.AF_INET)
            s.settimeout(10)
            s.connect(address)
            s.close()
            log(f"ok: fluxpipe socket at {address}")
        except OSError as e:
            log(f"cannot reach fluxpipe at {address}: {e}")
            ok = False
    return 0 if ok else 1


# -------------------------------------------------------------------- CLI


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="flux-forwarder",
        description="Stream a Flux instance's job-manager and resource journals "
                    "(and, with --exec-eventlogs, the jobs' exec eventlogs) "
                    "to fluxpipe as JSON Lines.")
    p.add_argument("--connect", default="-", metavar="ADDRESS",
                   help="http://HOST:PORT[/PATH] or https://... (a fluxpipe http source: "
                        "acknowledged, nothing lost), kafka://HOST:PORT[,...]/TOPIC (a topic "
                        "fluxpipe's kafka source reads: acknowledged), HOST:PORT (tcp), "
                        "unix:PATH, or - for stdout (default)")
    p.add_argument("--token-file", metavar="FILE",
                   help="bearer token for the fluxpipe http source (its auth.token_file)")
    p.add_argument("--cacert", metavar="FILE",
                   help="for https://: trust the CA certificates (PEM) in FILE instead of "
                        "the system's")
    p.add_argument("--client-cert", metavar="FILE",
                   help="for https://: a client certificate (PEM, with its key unless "
                        "--client-key), for a source whose tls.ca_file asks for one")
    p.add_argument("--client-key", metavar="FILE",
                   help="the private key (PEM) of --client-cert")
    p.add_argument("--state", metavar="FILE",
                   help="state file: the newest timestamp acknowledged of each journal; "
                        "without it every start sends the whole backlog")
    p.add_argument("--overlap", type=float, default=1.0, metavar="SECONDS",
                   help="resume this long before the newest timestamp sent (default 1)")
    p.add_argument("--state-interval", type=float, default=5.0, metavar="SECONDS",
                   help="write the state at most this often (default 5)")
    p.add_argument("--streams", default="job,resource",
                   help="journals to forward: job, resource or both (default job,resource)")
    p.add_argument("--exec-eventlogs", action="store_true",
                   help="also forward the exec eventlog (guest.exec.eventlog) of each job "
                        "that starts, as {\"stream\":\"exec\",\"id\":ID,\"event\":...} "
                        "envelopes (needs the job stream)")
    p.add_argument("--uri", help="Flux URI (default: FLUX_URI or the enclosing instance)")
    p.add_argument("--reset", action="store_true",
                   help="ignore the state file and send everything again")
    p.add_argument("--reconnect", action="store_true",
                   help="when the instance goes away, wait for it and go on "
                        "(default: exit 1, for the service manager to restart us)")
    p.add_argument("--reconnect-delay", type=float, default=5.0, metavar="SECONDS",
                   help="between attempts to reach the instance again (default 5)")
    p.add_argument("--ping-interval", type=float, default=2.0, metavar="SECONDS",
                   help="how often the broker is pinged to notice it going away (default 2; "
                        "3 unanswered pings in a row: gone)")
    p.add_argument("--heartbeat", type=float, default=30.0, metavar="SECONDS",
                   help="after this long with nothing sent, tell fluxpipe the feed is alive "
                        "(http: an empty POST; socket: a blank line; kafka: a blank message "
                        "to each partition); also while waiting for the instance with "
                        "--reconnect; none to stdout; 0: never (default 30)")
    p.add_argument("--queues-interval", type=float, default=30.0, metavar="SECONDS",
                   help="send the instance's queue configuration (its [queues] table, "
                        "which no eventlog carries) after the resource journal's backlog, "
                        "then again when a check this often finds it changed; 0: never "
                        "(default 30)")
    p.add_argument("--drain-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="at exit, how long unacknowledged lines may take to be delivered "
                        "(the rest stays in the state file) (default 10)")
    p.add_argument("--max-pending", type=int, default=100_000, metavar="LINES",
                   help="unacknowledged lines held before the journals wait (default 100000)")
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a librdkafka setting for kafka:// (SASL, TLS, ...); repeat for more")
    p.add_argument("--check", action="store_true",
                   help="connect to Flux and to fluxpipe, say what was found, and exit")
    args = p.parse_args(argv)
    args.streams = {s.strip() for s in args.streams.split(",") if s.strip()}
    bad = args.streams - set(STREAMS)
    if bad or not args.streams:
        p.error(f"--streams: unknown {sorted(bad)}; use job, resource")
    if args.exec_eventlogs and JOB not in args.streams:
        p.error("--exec-eventlogs needs the job stream (a job's `start` starts its watch)")
    if args.overlap < 0 or args.state_interval <= 0:
        p.error("--overlap must be >= 0 and --state-interval > 0")
    if args.ping_interval <= 0 or args.reconnect_delay < 0 or args.drain_timeout < 0 \
            or args.max_pending < 1:
        p.error("--ping-interval must be > 0, --reconnect-delay and --drain-timeout >= 0, "
                "--max-pending >= 1")
    if not (args.heartbeat >= 0 and math.isfinite(args.heartbeat)):
        p.error("--heartbeat must be >= 0 (0: no heartbeats)")
    if not (args.queues_interval >= 0 and math.isfinite(args.queues_interval)):
        p.error("--queues-interval must be >= 0 (0: no queue configuration)")
    try:
        args.output = parse_address(args.connect)
    except ValueError as e:
        p.error(str(e))
    args.tls = tls_context(p, args)
    args.kafka_options = {}
    for opt in args.kafka_option:
        key, sep, value = opt.partition("=")
        if not sep or not key:
            p.error(f"--kafka-option `{opt}`: expected KEY=VALUE")
        args.kafka_options[key] = value
    args.token = None
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                args.token = f.read().strip()
        except OSError as e:
            p.error(f"--token-file: {e}")
        if not args.token:
            p.error(f"--token-file {args.token_file} is empty")
    return args


def tls_context(p: argparse.ArgumentParser,
                args: argparse.Namespace) -> Optional[ssl.SSLContext]:
    """The TLS settings of an https:// address (None for other addresses),
    made once: a bad file is an error at start, not at every retry."""
    if urllib.parse.urlsplit(args.connect).scheme != "https":
        for option, value in (("--cacert", args.cacert), ("--client-cert", args.client_cert),
                              ("--client-key", args.client_key)):
            if value:
                p.error(f"{option} is for https:// addresses")
        return None
    if args.client_key and not args.client_cert:
        p.error("--client-key needs --client-cert")
    try:
        # With a cafile, only its CAs are trusted (as curl's --cacert).
        context = ssl.create_default_context(cafile=args.cacert)
    except OSError as e:  # ssl.SSLError is one
        p.error(f"--cacert {args.cacert}: {e}")
    if args.client_cert:
        try:
            context.load_cert_chain(args.client_cert, args.client_key)
        except OSError as e:
            p.error(f"--client-cert {args.client_cert}: {e}")
    return context


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def log(msg: str) -> None:
        print(f"flux-forwarder: {msg}", file=sys.stderr, flush=True)

    if args.check:
        return check(args, log)
    try:
        state = empty_state() if args.reset else load_state(args.state)
    except (OSError, ValueError) as e:
        log(str(e))
        return 2
    kind, address = args.output
    if kind == "http":
        output: Any = HttpSender(address, log, token=args.token, max_pending=args.max_pending,
                                 context=args.tls, heartbeat=args.heartbeat)
    elif kind == "kafka":
        output = KafkaSender(address[0], address[1], log, args.kafka_options,
                             max_pending=args.max_pending, heartbeat=args.heartbeat)
    elif kind == "stdout":
        # No heartbeat: a file or pipe reader has no feed to watch.
        output = stdout_writer
    else:
        output = SocketWriter(kind, address, log, heartbeat=args.heartbeat)
    forwarder = Forwarder(output, state, args.state, args.state_interval)
    log(f"resuming after job={state[JOB]:.6f} resource={state[RESOURCE]:.6f} "
        f"(overlap {args.overlap}s)"
        + (f", {len(state[EXEC])} exec eventlogs" if args.exec_eventlogs else "")
        + (f", {len(state[PENDING])} lines left unacknowledged" if state[PENDING] else "")
        + f"; sending to {args.connect}")
    return run_flux(args, forwarder, log)


if __name__ == "__main__":
    sys.exit(main())
