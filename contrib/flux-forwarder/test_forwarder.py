"""Tests of flux-forwarder without Flux: a fake journal built from the
sample corpus (tests/corpus/instances/B/journals) stands in for
flux.job.JournalConsumer and flux.resource.journal.ResourceJournalConsumer,
and the corpus' exec eventlogs (tests/corpus/jobs/<id>/exec.eventlog) for
flux.job.event_watch_async(..., eventlog="guest.exec.eventlog").

    cd contrib/flux-forwarder && python3 -m unittest -v
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
JOURNALS = REPO / "tests/corpus/instances/B/journals"
JOBS = REPO / "tests/corpus/jobs"
JOB_JOURNAL1 = "incarnation1.job-manager.events-journal.jsonl"
RESOURCE_JOURNAL1 = "incarnation1.resource.journal.jsonl"

sys.path.insert(0, str(HERE))
import flux_forwarder as ff  # noqa: E402

# A `[queues]` table as config.get gives it (RFC 33: `debug` is a virtual
# queue of `batch`), and what the queue-config line keeps of it.
QUEUES = {
    "batch": {"requires": ["batch"], "policy": {"limits": {"duration": "8h"}}},
    "debug": {"parent": "batch", "policy": {"jobspec": {"defaults": {"system": {
        "duration": "10m"}}}}},
    "all": {"policy": {"access": {"allow-user": ["alice"]}}},
}
QUEUES_KEPT = {"batch": {"requires": ["batch"]}, "debug": {"parent": "batch"}, "all": {}}


def read_journal(name: str) -> list[dict]:
    with open(JOURNALS / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class FakeEvent(dict):
    """What the bindings hand to a callback: the event as a dict (with an
    empty context added when it had none), plus jobid, R and jobspec."""

    def __init__(self, event: dict, jobid: int = -1, R=None, jobspec=None):
        super().__init__(event)
        self.setdefault("context", {})
        self.jobid = jobid
        self.R = R
        self.jobspec = jobspec


class FakeConsumer:
    """A journal consumer over recorded journal messages: the backlog (the
    messages before the sentinel) split into events newer than `since`,
    sorted by time, then the sentinel, then the live messages, then None."""

    def __init__(self, messages: list[dict], stream: str, since: float = 0.0,
                 ends: bool = True):
        self.stream = stream
        self.since = since
        self.cb = None
        self.started = False
        self.ends = ends
        backlog, live, seen_sentinel = [], [], False
        for m in messages:
            if not m["events"] and (stream == ff.RESOURCE or m.get("id") == -1):
                seen_sentinel = True
                continue
            for e in m["events"]:
                ev = FakeEvent(e, m.get("id", -1), m.get("R"), m.get("jobspec"))
                if ev["timestamp"] > since:
                    (live if seen_sentinel else backlog).append(ev)
        backlog.sort(key=lambda e: e["timestamp"])
        end = FakeEvent({}, -1) if stream == ff.JOB else FakeEvent({"timestamp": 1e10})
        end.pop("context", None) if stream == ff.RESOURCE else None
        self.events = backlog + [end] + live

    def set_callback(self, cb):
        self.cb = cb
        return self

    def start(self):
        self.started = True
        return self

    def step(self) -> bool:
        """One turn of the fake reactor: the next event, or the end (None)
        once if the journal ends; False when there is nothing to do."""
        if self.events:
            self.cb(self.events.pop(0))
            return True
        if self.ends:
            self.ends = False
            self.cb(None)
            return True
        return False

    def deliver(self, limit: int | None = None) -> int:
        """Deliver up to `limit` events, then None when all are out."""
        n = 0
        while self.events and (limit is None or n < limit):
            self.cb(self.events.pop(0))
            n += 1
        if not self.events and limit is None:
            self.cb(None)
        return n


class Lines:
    """A writer that keeps what was written."""

    def __init__(self):
        self.lines: list[bytes] = []

    def __call__(self, line: bytes) -> None:
        self.lines.append(line)

    def decoded(self) -> list[dict]:
        return [json.loads(l) for l in self.lines]


def corpus_events(messages: list[dict]) -> list[tuple]:
    """(job id or None, timestamp, name) of every event of a journal."""
    return sorted((m.get("id"), e["timestamp"], e["name"])
                  for m in messages for e in m["events"])


class FakeEventLogEvent:
    """What JobEventWatchFuture.get_event() returns (flux.job.event.
    EventLogEvent): name, timestamp, and context ({} when absent)."""

    def __init__(self, event: dict):
        self.name = event["name"]
        self.timestamp = event["timestamp"]
        self.context = event.get("context", {})


def read_exec_eventlog(jobid: int) -> list[dict] | None:
    path = JOBS / str(jobid) / "exec.eventlog"
    if not path.exists():
        return None
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def started_jobs(messages: list[dict]) -> list[int]:
    """Jobs with a `start` event in a job-manager journal, in journal order."""
    out = []
    for m in messages:
        if any(e["name"] == "start" for e in m["events"]) and m["id"] not in out:
            out.append(m["id"])
    return out


def exec_events(lines: list[dict]) -> list[tuple]:
    """(job id, timestamp, name) of the exec envelopes among written lines."""
    return [(m["id"], m["event"]["timestamp"], m["event"]["name"])
            for m in lines if m.get("stream") == "exec"]


def corpus_exec_events(jobs) -> set[tuple]:
    return {(j, e["timestamp"], e["name"]) for j in jobs for e in read_exec_eventlog(j)}


class FakeWatch:
    """What flux.job.event_watch_async() returns, over a recorded exec
    eventlog: each turn of the fake reactor fulfils it once and runs its
    `then` callback, which reads the next event with get_event() (None at
    the end: ENODATA). With no eventlog, get_event() raises ENOENT, as for
    a purged job."""

    def __init__(self, jobid: int, events: list[dict] | None):
        self.jobid = jobid
        self.events = None if events is None else [FakeEventLogEvent(e) for e in events]
        self.cb = None
        self.args: tuple = ()
        self.done = False
        self.canceled = False

    def then(self, cb, *args):
        self.cb, self.args = cb, args
        return self

    def step(self) -> bool:
        if self.done or self.cb is None:
            return False
        self.cb(self, *self.args)
        return True

    def get_event(self):
        if self.events is None:
            self.done = True
            raise OSError(errno.ENOENT, "No such file or directory")
        if not self.events:
            self.done = True
            return None
        return self.events.pop(0)

    def cancel(self, stop=False):
        self.canceled = True
        self.done = True


def canonical(records: list) -> list:
    """Records in an order and form that compare whatever their order."""
    return sorted(json.dumps(r, sort_keys=True) for r in records)


def named_and_stripped(test: unittest.TestCase, records: list) -> list:
    """The forwarded lines' records, each job's `username` (sent with its
    submit) checked against this host's accounts and taken out, so the
    rest compares with a replay of the journal itself."""
    named = 0
    for r in records:
        if r.get("kind") == "job":
            test.assertEqual(r.pop("username", None), ff.user_name(r.get("userid")), r)
            named += 1
    test.assertGreater(named, 0)
    return canonical(records)


class FramingTest(unittest.TestCase):
    def test_job_message_keeps_what_fluxpipe_reads_of_the_jobspec_with_submit(self):
        spec = {"version": 1,
                "resources": [{"type": "slot", "count": 1, "with": [{"type": "core", "count": 2}]}],
                "tasks": [{"command": ["/bin/app", "--secret"], "slot": "task",
                           "count": {"per_slot": 1}}],
                "attributes": {"system": {"duration": 60, "cwd": "/home/u", "queue": "batch",
                                          "environment": {"HOME": "/home/u"},
                                          "job": {"name": "x"},
                                          "shell": {"options": {"rlimit": {},
                                                                "per-resource": {"type": "node"}}}}}}
        submit = {"timestamp": 1.0, "name": "submit", "context": {"userid": 1}}
        msg = ff.job_message(7, submit, None, spec)
        self.assertEqual(msg["jobspec"], {
            "version": 1, "resources": spec["resources"],
            "tasks": [{"command": ["/bin/app"], "slot": "task", "count": {"per_slot": 1}}],
            "attributes": {"system": {"duration": 60, "queue": "batch", "job": {"name": "x"},
                                      "shell": {"options": {"per-resource": {"type": "node"}}}}}})
        self.assertNotIn("/home/u", json.dumps(msg))
        # with any other event: not sent
        validate = {"timestamp": 2.0, "name": "validate"}
        self.assertNotIn("jobspec", ff.job_message(7, validate, None, spec))
        self.assertEqual(ff.jobspec_kept([1]), [1])

    def test_job_message_names_the_submitter_with_submit_only(self):
        submit = {"timestamp": 1.0, "name": "submit",
                  "context": {"userid": 0, "urgency": 16, "flags": 0, "version": 1}}
        # The name this host's accounts give (uid 0 is root everywhere).
        self.assertEqual(ff.job_message(7, submit)["username"], "root")
        names = {4242: "alice"}.get
        self.assertEqual(ff.job_message(7, dict(submit, context={"userid": 4242}),
                                        names=names)["username"], "alice")
        # A uid with no account, no uid, a uid of the wrong type: no name.
        for context in ({"userid": 4243}, {}, {"userid": "0"}, {"userid": True}):
            msg = ff.job_message(7, dict(submit, context=context), names=names)
            self.assertNotIn("username", msg, context)
        self.assertIsNone(ff.user_name(2**40))
        # Only with submit.
        depend = {"timestamp": 2.0, "name": "depend", "context": {"userid": 0}}
        self.assertNotIn("username", ff.job_message(7, depend))

    def test_job_message_keeps_R_with_alloc_only(self):
        alloc = {"timestamp": 2.5, "name": "alloc", "context": {}}
        self.assertEqual(ff.job_message(42, alloc, {"execution": {}}),
                         {"id": 42, "events": [{"timestamp": 2.5, "name": "alloc"}],
                          "R": {"execution": {}}})
        start = {"timestamp": 3.0, "name": "start", "context": {"x": 1}}
        self.assertEqual(ff.job_message(42, start, {"execution": {}}),
                         {"id": 42, "events": [start]})

    def test_resource_message_keeps_R_with_resource_define(self):
        define = {"timestamp": 1.0, "name": "resource-define", "context": {"method": "m"}}
        self.assertEqual(ff.resource_message(define, {"version": 1}),
                         {"events": [define], "R": {"version": 1}})
        online = {"timestamp": 2.0, "name": "online", "context": {"idset": "0"}}
        self.assertEqual(ff.resource_message(online, {"version": 1}), {"events": [online]})

    def test_sentinels_and_encoding(self):
        self.assertEqual(ff.encode(ff.sentinel(ff.JOB)), b'{"id":-1,"events":[]}\n')
        self.assertEqual(ff.encode(ff.sentinel(ff.RESOURCE)), b'{"events":[]}\n')
        line = ff.encode({"events": [{"timestamp": 1, "name": "drain",
                                      "context": {"reason": "café"}}]})
        self.assertTrue(line.endswith(b"\n") and line.count(b"\n") == 1)
        self.assertIn("café".encode(), line)

    def test_exec_envelope_is_what_the_decoder_reads(self):
        ev = FakeEventLogEvent({"timestamp": 5.5, "name": "done"})
        line = ff.encode(ff.exec_message(42, ff.event_dict(ev)))
        # "stream" first: fluxpipe's fast path for envelopes keys on it.
        self.assertEqual(line, b'{"stream":"exec","id":42,"event":{"timestamp":5.5,"name":"done"}}\n')
        ev = FakeEventLogEvent({"timestamp": 6.0, "name": "complete", "context": {"status": 0}})
        self.assertEqual(ff.exec_message(42, ff.event_dict(ev)),
                         {"stream": "exec", "id": 42,
                          "event": {"timestamp": 6.0, "name": "complete",
                                    "context": {"status": 0}}})
        self.assertEqual(ff.event_dict({"timestamp": 1.0, "name": "init", "context": {}}),
                         {"timestamp": 1.0, "name": "init", "context": {}})

    def test_queue_config_line_keeps_requires_and_parent_of_each_queue(self):
        config = {"queues": QUEUES, "policy": {"limits": {"duration": "8h"}},
                  "resource": {"noverify": True}}
        self.assertEqual(ff.queues_kept(config), QUEUES_KEPT)
        # No [queues] table (or not a table): {}, so fluxpipe hears a removal.
        self.assertEqual(ff.queues_kept({"policy": {}}), {})
        self.assertEqual(ff.queues_kept({}), {})
        self.assertEqual(ff.queues_kept({"queues": ["batch"]}), {})
        self.assertEqual(ff.queues_kept({"queues": {"odd": "x"}}), {"odd": {}})
        out = Lines()
        fw = ff.Forwarder(out, ff.empty_state())
        fw.queue_config(ff.queues_kept(config), 1795321900.25)
        fw.queue_config(ff.queues_kept({}), 1795321901.5)
        self.assertEqual(out.decoded(), [
            {"events": [{"timestamp": 1795321900.25, "name": "queue-config",
                         "context": {"queues": QUEUES_KEPT}}]},
            {"events": [{"timestamp": 1795321901.5, "name": "queue-config",
                         "context": {"queues": {}}}]},
        ])
        self.assertEqual(out.lines[1],
                         b'{"events":[{"timestamp":1795321901.5,"name":"queue-config",'
                         b'"context":{"queues":{}}}]}\n')
        # Not a Flux event: it moves no resume point.
        self.assertEqual(fw.state[ff.RESOURCE], 0.0)
        self.assertEqual(fw.sent[ff.RESOURCE], 0)

    def test_clean_event_does_not_change_its_input(self):
        e = {"timestamp": 1.0, "name": "clean", "context": {}}
        self.assertEqual(ff.clean_event(e), {"timestamp": 1.0, "name": "clean"})
        self.assertEqual(e["context"], {})


class CorpusTest(unittest.TestCase):
    def forward(self, name: str, stream: str, since: float = 0.0):
        out = Lines()
        fw = ff.Forwarder(out, ff.empty_state())
        c = FakeConsumer(read_journal(name), stream, since)
        ended = []
        if stream == ff.JOB:
            ff.attach(fw, c, None, ended.append)
        else:
            ff.attach(fw, None, c, ended.append)
        c.deliver()
        self.assertEqual(ended, [stream])
        return out.decoded(), fw

    def test_every_job_event_once_and_one_sentinel(self):
        for name in ("incarnation1.job-manager.events-journal.jsonl",
                     "incarnation2.job-manager.events-journal.jsonl"):
            messages = read_journal(name)
            lines, fw = self.forward(name, ff.JOB)
            self.assertEqual(lines.count({"id": -1, "events": []}), 1)
            got = corpus_events([m for m in lines if m["id"] != -1])
            want = corpus_events([m for m in messages if m.get("id") != -1])
            self.assertEqual(got, want)
            for m in lines:
                self.assertLessEqual(len(m["events"]), 1)
                if "R" in m:
                    self.assertEqual(m["events"][0]["name"], "alloc")
                if "jobspec" in m:
                    self.assertEqual(m["events"][0]["name"], "submit")
                    self.assertNotIn("cwd", json.dumps(m["jobspec"]))
            allocs_with_R = {m["id"] for m in messages if "R" in m}
            self.assertEqual({m["id"] for m in lines if "R" in m}, allocs_with_R)
            submits_with_spec = {m["id"] for m in messages if "jobspec" in m}
            self.assertTrue(submits_with_spec)
            self.assertEqual({m["id"] for m in lines if "jobspec" in m}, submits_with_spec)
            self.assertEqual(fw.state[ff.JOB], max(t for _, t, _ in want))

    def test_every_resource_event_once(self):
        for name in ("incarnation1.resource.journal.jsonl",
                     "incarnation2.resource.journal.jsonl"):
            messages = read_journal(name)
            lines, fw = self.forward(name, ff.RESOURCE)
            self.assertEqual(lines.count({"events": []}), 1)
            self.assertEqual(corpus_events([m for m in lines if m["events"]]),
                             corpus_events(messages))
            for m in lines:
                if "R" in m:
                    self.assertEqual(m["events"][0]["name"], "resource-define")
            # The sentinel's own timestamp never becomes the state.
            self.assertLess(fw.state[ff.RESOURCE], 1e10)

    def test_fluxpipe_replays_the_forwarded_lines_like_the_journal(self):
        binary = os.environ.get("FLUXPIPE_BIN") or str(REPO / "target/release/fluxpipe")
        if not os.access(binary, os.X_OK):
            self.skipTest(f"no fluxpipe binary at {binary}")
        with tempfile.TemporaryDirectory() as tmp:
            fwd = Path(tmp, "forwarded")
            fwd.mkdir()
            for name, stream in (("incarnation1.resource.journal.jsonl", ff.RESOURCE),
                                 ("incarnation1.job-manager.events-journal.jsonl", ff.JOB)):
                lines, _ = self.forward(name, stream)
                (fwd / name).write_text("".join(ff.encode(m).decode() for m in lines))
            orig = Path(tmp, "original")
            orig.mkdir()
            for name in ("incarnation1.resource.journal.jsonl",
                         "incarnation1.job-manager.events-journal.jsonl"):
                shutil.copy(JOURNALS / name, orig / name)

            def replay(folder):
                run = subprocess.run([binary, "replay", "--format", "json", "--cluster", "B",
                                      str(folder)], capture_output=True, text=True, check=True)
                return [json.loads(line) for line in run.stdout.splitlines()]
            self.assertEqual(named_and_stripped(self, replay(fwd)), canonical(replay(orig)))


class ResumeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.state_path = os.path.join(self.tmp.name, "sub", "state.json")

    def tearDown(self):
        self.tmp.cleanup()

    def test_state_round_trip_and_missing_file(self):
        self.assertEqual(ff.load_state(self.state_path), ff.empty_state())
        self.assertEqual(ff.load_state(None), ff.empty_state())
        ff.save_state(self.state_path, {"job": 12.5, "resource": 3.0})
        self.assertEqual(ff.load_state(self.state_path),
                         {"job": 12.5, "resource": 3.0, "exec": {}, "pending": []})
        self.assertEqual(os.listdir(os.path.dirname(self.state_path)), ["state.json"])
        # The exec eventlogs being watched, with the newest event sent.
        ff.save_state(self.state_path, {"job": 12.5, "resource": 3.0,
                                        "exec": {7: 11.25, 1234567: 0.0}})
        with open(self.state_path) as f:
            self.assertEqual(json.load(f)["exec"], {"7": 11.25, "1234567": 0.0})
        self.assertEqual(ff.load_state(self.state_path),
                         {"job": 12.5, "resource": 3.0, "exec": {7: 11.25, 1234567: 0.0},
                          "pending": []})

    def test_bad_state_files_are_errors(self):
        os.makedirs(os.path.dirname(self.state_path))
        for text in ("{not json", "[1]", '{"job": "x"}', '{"job": -1}',
                     '{"resource": true}', '{"job": NaN}', '{"exec": [1]}',
                     '{"exec": {"x": 1.0}}', '{"exec": {"12": "1"}}',
                     '{"exec": {"12": -1}}'):
            with open(self.state_path, "w") as f:
                f.write(text)
            with self.assertRaises(ValueError, msg=text):
                ff.load_state(self.state_path)

    def test_since_subtracts_the_overlap(self):
        self.assertEqual(ff.since({"job": 100.0, "resource": 0.0}, ff.JOB, 1.0), 99.0)
        self.assertEqual(ff.since({"job": 0.5, "resource": 0.0}, ff.JOB, 1.0), 0.0)

    def test_checkpoints_follow_the_interval(self):
        now = [0.0]
        out = Lines()
        fw = ff.Forwarder(out, ff.empty_state(), self.state_path, interval=5.0,
                          clock=lambda: now[0])
        fw.job_event(1, {"timestamp": 10.0, "name": "submit", "context": {}})
        self.assertFalse(os.path.exists(self.state_path))
        now[0] = 6.0
        fw.job_event(1, {"timestamp": 11.0, "name": "validate", "context": {}})
        self.assertEqual(ff.load_state(self.state_path)["job"], 11.0)
        fw.resource_event({"timestamp": 7.0, "name": "online", "context": {"idset": "0"}})
        self.assertEqual(ff.load_state(self.state_path)["resource"], 0.0)
        fw.checkpoint()
        self.assertEqual(ff.load_state(self.state_path),
                         {"job": 11.0, "resource": 7.0, "exec": {}, "pending": []})

    def test_a_restart_resumes_without_losing_events(self):
        name = "incarnation1.job-manager.events-journal.jsonl"
        messages = read_journal(name)
        total = sum(len(m["events"]) for m in messages if m.get("id") != -1)
        # First run: stops after 40 events, checkpointing at the end.
        first = Lines()
        fw = ff.Forwarder(first, ff.empty_state(), self.state_path)
        c = FakeConsumer(messages, ff.JOB)
        ff.attach(fw, c, None, lambda s: None)
        c.deliver(40)
        fw.checkpoint()
        # Second run: from the state file, with the default overlap.
        state = ff.load_state(self.state_path)
        second = Lines()
        fw2 = ff.Forwarder(second, state, self.state_path)
        c2 = FakeConsumer(messages, ff.JOB, ff.since(state, ff.JOB, 1.0))
        ff.attach(fw2, c2, None, lambda s: None)
        c2.deliver()
        sent = [m for m in first.decoded() + second.decoded() if m["id"] != -1]
        self.assertEqual(set(corpus_events(sent)),
                         set(corpus_events([m for m in messages if m.get("id") != -1])))
        repeats = len(sent) - total
        self.assertGreaterEqual(repeats, 0)
        # Only events within the overlap were sent twice.
        firsts = {(m["id"], m["events"][0]["timestamp"]) for m in first.decoded()
                  if m["id"] != -1}
        for m in second.decoded():
            if m["id"] != -1 and (m["id"], m["events"][0]["timestamp"]) in firsts:
                self.assertGreater(m["events"][0]["timestamp"], state["job"] - 1.0)


class SocketWriterTest(unittest.TestCase):
    def test_reconnects_and_resends_the_failed_line(self):
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(10)
        port = server.getsockname()[1]
        received: list[bytes] = []

        def serve():
            # First connection: read one line, then close it.
            conn, _ = server.accept()
            received.append(conn.makefile("rb").readline())
            conn.close()
            # Second connection: read everything.
            conn, _ = server.accept()
            conn.settimeout(10)
            with conn, conn.makefile("rb") as f:
                for line in f:
                    received.append(line)

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        logs: list[str] = []
        w = ff.SocketWriter("tcp", ("127.0.0.1", port), logs.append, sleep=lambda s: None)
        w(b'{"n":1}\n')
        t_wait = threading.Event()
        # Write until the closed connection shows (a send to a closed peer
        # fails on the first or second try).
        for i in range(2, 50):
            t_wait.wait(0.02)
            w(b'{"n":%d}\n' % i)
            if any("lost" in m for m in logs):
                last = i
                break
        else:
            self.fail("the writer never saw the connection close")
        w(b'{"n":999}\n')
        w.close()
        t.join(10)
        server.close()
        numbers = [json.loads(l)["n"] for l in received]
        self.assertEqual(numbers[0], 1)
        self.assertIn(last, numbers)  # the failed line was written again
        self.assertEqual(numbers[-1], 999)
        self.assertTrue(any("connected" in m for m in logs))

    def test_backoff_doubles_to_a_cap(self):
        g = ff.backoff_delays(0.1, 1.0)
        self.assertEqual([round(next(g), 3) for _ in range(6)], [0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


class CliTest(unittest.TestCase):
    def test_addresses(self):
        self.assertEqual(ff.parse_address("-"), ("stdout", None))
        self.assertEqual(ff.parse_address("unix:/run/fp.sock"), ("unix", "/run/fp.sock"))
        self.assertEqual(ff.parse_address("fluxpipe.flux.svc:7070"),
                         ("tcp", ("fluxpipe.flux.svc", 7070)))
        self.assertEqual(ff.parse_address("[::1]:7070"), ("tcp", ("::1", 7070)))
        for bad in ("host", "host:0", "host:x", ":7070"):
            with self.assertRaises(ValueError):
                ff.parse_address(bad)

    def test_arguments(self):
        a = ff.parse_args(["--connect", "h:1", "--streams", "job"])
        self.assertEqual(a.streams, {"job"})
        self.assertEqual(a.output, ("tcp", ("h", 1)))
        with self.assertRaises(SystemExit), open(os.devnull, "w") as null:
            with contextlib.redirect_stderr(null):
                ff.parse_args(["--streams", "jobs"])
        self.assertFalse(ff.parse_args([]).exec_eventlogs)
        self.assertTrue(ff.parse_args(["--exec-eventlogs"]).exec_eventlogs)
        with self.assertRaises(SystemExit), open(os.devnull, "w") as null:
            with contextlib.redirect_stderr(null):
                ff.parse_args(["--exec-eventlogs", "--streams", "resource"])


class FakeFlux:
    """Just enough of the flux module for run_flux(). The reactor runs the
    journal consumers and the exec eventlog watches in turns, one event
    each, until reactor_stop() is called, or until nothing is left or
    `budget` events have been delivered: then the handle's `idle()`, by
    default a SIGTERM through the reactor's signal watcher (a real reactor
    never runs out of work while its signal and ping watchers are on)."""

    def __init__(self, messages_job, messages_res, journals_end: bool = True,
                 exec_logs=read_exec_eventlog, budget: int | None = None):
        fake = self
        self.consumers = []
        self.watches: list[FakeWatch] = []
        self.budget = budget

        class Handle:
            def __init__(self, *a):
                self.stopped = False
                self.signals: dict = {}

            def reactor_run(self):
                self.stopped = False
                while not self.stopped:
                    busy = False
                    for src in fake.consumers + fake.watches:
                        if self.stopped:
                            return 0
                        if fake.budget == 0:
                            return self.idle()
                        if src.step():
                            busy = True
                            if fake.budget is not None:
                                fake.budget -= 1
                    if not busy:
                        return self.idle()
                return 0

            def idle(self):
                """Nothing left to deliver: the test's end, a SIGTERM."""
                self.signal(signal.SIGTERM)
                return 0

            def signal(self, signum):
                watcher = self.signals[signum]
                assert watcher.started
                watcher.cb(watcher, signum)

            def reactor_stop(self):
                self.stopped = True

            def rpc(self, topic, payload=None):
                return FakeFuture()

            def timer_watcher_create(self, after, cb, repeat=0.0):
                return Watcher()

            def signal_watcher_create(self, signum, cb):
                self.signals[signum] = Watcher(cb)
                return self.signals[signum]

        class Watcher:
            def __init__(self, cb=None):
                self.cb = cb
                self.started = False

            def start(self):
                self.started = True

            def stop(self):
                self.started = False

        def job_consumer(handle, full, since, include_sentinel):
            assert full and include_sentinel
            c = FakeConsumer(messages_job, ff.JOB, since, ends=journals_end)
            c.asked_since = since
            fake.consumers.append(c)
            return c

        def resource_consumer(handle, since, include_sentinel):
            c = FakeConsumer(messages_res, ff.RESOURCE, since, ends=journals_end)
            c.asked_since = since
            fake.consumers.append(c)
            return c

        def event_watch_async(handle, jobid, eventlog="eventlog"):
            assert eventlog == "guest.exec.eventlog", eventlog
            w = FakeWatch(jobid, exec_logs(jobid))
            fake.watches.append(w)
            return w

        self.Flux = Handle
        self.job = argparse.Namespace(JournalConsumer=job_consumer,
                                      event_watch_async=event_watch_async)
        self.resource = argparse.Namespace(
            journal=argparse.Namespace(ResourceJournalConsumer=resource_consumer))


class RunFluxTest(unittest.TestCase):
    def test_wiring_resume_and_exit_status(self):
        job = read_journal("incarnation1.job-manager.events-journal.jsonl")
        res = read_journal("incarnation1.resource.journal.jsonl")
        fake = FakeFlux(job, res)
        out = Lines()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "state.json")
            ff.save_state(path, {"job": 100.0, "resource": 50.5})
            args = ff.parse_args(["--state", path, "--overlap", "0.5"])
            fw = ff.Forwarder(out, ff.load_state(path), path)
            logs: list[str] = []
            status = ff.run_flux(args, fw, logs.append, flux_module=fake)
            # The job journal ended: an error, so systemd restarts us.
            self.assertEqual(status, 1)
            self.assertEqual([c.asked_since for c in fake.consumers], [99.5, 50.0])
            self.assertTrue(all(c.started for c in fake.consumers))
            # State written at the end.
            self.assertGreater(ff.load_state(path)["job"], 100.0)
        lines = out.decoded()
        self.assertIn({"id": -1, "events": []}, lines)
        self.assertTrue(any("ended" in m for m in logs))
        # Without --exec-eventlogs no exec eventlog is watched.
        self.assertEqual(fake.watches, [])
        self.assertEqual(exec_events(lines), [])


def fluxpipe_binary() -> str | None:
    binary = os.environ.get("FLUXPIPE_BIN") or str(REPO / "target/release/fluxpipe")
    return binary if os.access(binary, os.X_OK) else None


class ExecEventlogTest(unittest.TestCase):
    """--exec-eventlogs: the exec eventlog of every job whose `start` the
    job journal brings, as envelopes, resumed over restarts."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.state_path = os.path.join(self.tmp.name, "state.json")
        self.job = read_journal(JOB_JOURNAL1)
        self.res = read_journal(RESOURCE_JOURNAL1)
        self.started = started_jobs(self.job)
        self.assertGreater(len(self.started), 5)

    def tearDown(self):
        self.tmp.cleanup()

    def run_forwarder(self, fake: FakeFlux, *extra: str):
        args = ff.parse_args(["--state", self.state_path, "--exec-eventlogs", *extra])
        out = Lines()
        logs: list[str] = []
        fw = ff.Forwarder(out, ff.load_state(self.state_path), self.state_path)
        status = ff.run_flux(args, fw, logs.append, flux_module=fake)
        return status, out.decoded(), logs

    def test_every_started_job_once_in_envelopes(self):
        fake = FakeFlux(self.job, self.res, journals_end=False)
        status, lines, logs = self.run_forwarder(fake)
        self.assertEqual(status, 0)
        self.assertEqual(sorted(w.jobid for w in fake.watches), sorted(self.started))
        sent = exec_events(lines)
        self.assertEqual(len(sent), len(set(sent)), "an exec event was sent twice")
        self.assertEqual(set(sent), corpus_exec_events(self.started))
        for m in lines:
            if m.get("stream") == "exec":
                self.assertEqual(list(m), ["stream", "id", "event"])
                self.assertIsInstance(m["id"], int)
        # A job's exec events come after its `start` line (its watch begins there).
        first_exec = {}
        start_at = {}
        for i, m in enumerate(lines):
            if m.get("stream") == "exec":
                first_exec.setdefault(m["id"], i)
            elif m.get("events") and m["events"][0]["name"] == "start":
                start_at[m["id"]] = i
        for j, i in first_exec.items():
            self.assertLess(start_at[j], i)
        # The journals are forwarded as without the option.
        journal = [m for m in lines if "stream" not in m]
        self.assertEqual(corpus_events([m for m in journal if "id" in m and m["id"] != -1]),
                         corpus_events([m for m in self.job if m.get("id") != -1]))
        # Every watch ended (the jobs are inactive): no job left in the state.
        self.assertEqual(ff.load_state(self.state_path)["exec"], {})

    def restart(self, overlap: float):
        """A first run stopped (as by SIGTERM) in the middle of the exec
        eventlogs, then a second one from the state file."""
        fake1 = FakeFlux(self.job, self.res, journals_end=False, budget=120)
        status, first, _ = self.run_forwarder(fake1, "--overlap", str(overlap))
        self.assertEqual(status, 0)
        saved = ff.load_state(self.state_path)
        in_flight = saved["exec"]
        self.assertTrue(in_flight, "the first run should stop with watches open")
        self.assertTrue(any(t > 0 for t in in_flight.values()),
                        "the first run should stop in the middle of an exec eventlog")
        self.assertTrue(all(w.canceled for w in fake1.watches if w.jobid in in_flight))
        fake2 = FakeFlux(self.job, self.res, journals_end=False)
        status, second, logs = self.run_forwarder(fake2, "--overlap", str(overlap))
        self.assertEqual(status, 0)
        self.assertTrue(any("watching again the exec eventlogs" in m for m in logs))
        # The jobs in flight are watched again, before the journal says anything.
        self.assertEqual([w.jobid for w in fake2.watches][:len(in_flight)], sorted(in_flight))
        self.assertEqual(ff.load_state(self.state_path)["exec"], {})
        sent1, sent2 = exec_events(first), exec_events(second)
        # Nothing lost.
        self.assertEqual(set(sent1) | set(sent2), corpus_exec_events(self.started))
        return saved, sent1, sent2

    def test_a_restart_resumes_the_exec_eventlogs_without_repeats(self):
        # Without overlap the journal brings no `start` again: each job's
        # exec eventlog resumes after its newest event sent.
        saved, sent1, sent2 = self.restart(overlap=0.0)
        both = sent1 + sent2
        self.assertEqual(len(both), len(set(both)), "an exec event was sent twice")
        for j, t in saved["exec"].items():
            self.assertTrue(all(ts > t for (jj, ts, _) in sent2 if jj == j))

    def test_a_restart_with_overlap_repeats_only_jobs_started_in_the_overlap(self):
        # A `start` the journal brings again (it is within --overlap of
        # the newest job event sent) watches the job again if its watch
        # had ended: its exec eventlog is sent again, and fluxpipe skips
        # the repeats. Nothing else is repeated.
        overlap = 1.0
        saved, sent1, sent2 = self.restart(overlap)
        start_ts = {m["id"]: e["timestamp"] for m in self.job for e in m["events"]
                    if e["name"] == "start"}
        repeated = {j for (j, _, _) in set(sent1) & set(sent2)}
        for j in repeated:
            self.assertGreater(start_ts[j], saved["job"] - overlap)

    def test_an_exec_eventlog_that_cannot_be_read_is_logged_and_forgotten(self):
        missing = self.started[0]
        fake = FakeFlux(self.job, self.res, journals_end=False,
                        exec_logs=lambda j: None if j == missing else read_exec_eventlog(j))
        status, lines, logs = self.run_forwarder(fake)
        self.assertEqual(status, 0)
        self.assertTrue(any(f"exec eventlog of job {missing}" in m for m in logs))
        self.assertEqual(set(exec_events(lines)),
                         corpus_exec_events(j for j in self.started if j != missing))
        self.assertEqual(ff.load_state(self.state_path)["exec"], {})

    def test_fluxpipe_reads_the_exec_envelopes(self):
        """The forwarded lines, journal and exec envelopes in one stream
        (as a socket source with the default `format = "auto"` gets them),
        replay like the journal plus the exec eventlog files, without an
        anomaly; and the exec events count as the job's exec eventlog: a
        `complete` without `done` raises fluxpipe's exec_incomplete alert."""
        binary = fluxpipe_binary()
        if binary is None:
            self.skipTest("no fluxpipe binary")
        fake = FakeFlux(self.job, self.res, journals_end=False)
        # Only what the journals and exec eventlogs hold, to compare with
        # them (the queue-config line has its own test).
        _, lines, _ = self.run_forwarder(fake, "--queues-interval", "0")
        tmp = Path(self.tmp.name)

        def replay(*paths, config=None):
            cmd = [binary, "replay", "--format", "json", "--cluster", "B",
                   "--input-format", "auto"]
            if config:
                cmd += ["--config", str(config)]
            run = subprocess.run(cmd + [str(p) for p in paths],
                                 capture_output=True, text=True, check=True)
            return [json.loads(l) for l in run.stdout.splitlines()]

        fwd = tmp / "forwarded.jsonl"
        fwd.write_text("".join(ff.encode(m).decode() for m in lines))
        orig = tmp / "original"
        orig.mkdir()
        for name in (JOB_JOURNAL1, RESOURCE_JOURNAL1):
            shutil.copy(JOURNALS / name, orig / name)
        for j in self.started:
            (orig / str(j)).mkdir()
            shutil.copy(JOBS / str(j) / "exec.eventlog", orig / str(j) / "exec.eventlog")
        got = replay(fwd)
        self.assertEqual([r for r in got if r["kind"] == "anomaly"], [])
        self.assertEqual(named_and_stripped(self, got), canonical(replay(orig)))

        # One job cut after its `start`, its exec eventlog after `complete`.
        victim = self.started[-1]
        cut, seen_start = [], False
        for m in lines:
            if m.get("id") == victim and "events" in m:
                if seen_start:
                    continue
                seen_start = m["events"][0]["name"] == "start"
            if m.get("stream") == "exec" and m["id"] == victim and m["event"]["name"] == "done":
                continue
            cut.append(m)
        (tmp / "cut").mkdir()
        (tmp / "cut/forwarded.jsonl").write_text("".join(ff.encode(m).decode() for m in cut))
        config = tmp / "alerts.toml"
        config.write_text(
            '[alerts]\nclock = "event"\n'
            '[alerts.rules.exec_incomplete]\nkind = "exec_incomplete"\nfor = "0s"\n'
            '[sources.in]\ntype = "stdin"\n'
            '[sinks.out]\ntype = "blackhole"\ninputs = ["alerts"]\n')
        out = replay(tmp / "cut", config=config)
        alerts = [r for r in out if r["kind"] == "alert"]
        self.assertTrue(alerts)
        self.assertEqual({a["alertname"] for a in alerts}, {"exec_incomplete"})
        # With `for = "0s"` every job fires between `complete` and `done`
        # and resolves at `done`; only the one without `done` stays firing.
        firing = {a["id"] for a in alerts if a["status"] == "firing"}
        resolved = {a["id"] for a in alerts if a["status"] == "resolved"}
        self.assertEqual(firing - resolved, {victim})
        self.assertEqual([r for r in out if r["kind"] == "anomaly"], [])


class FakeFluxpipe:
    """A real HTTP server on 127.0.0.1 standing in for a fluxpipe `http`
    source, scripted per request: "ok" (200 with counts), "drop" (read the
    batch, close the connection unanswered: fluxpipe killed mid-batch),
    "503" / "429" (with Retry-After), "413", "hold" (answer 200 only once
    `release` is set: a late acknowledgement). Past the script, "ok".
    With `tls` (a server-side SSLContext), HTTPS."""

    def __init__(self, script: list[str], tls=None):
        import http.server
        import gzip as _gzip
        self.script = list(script)
        self.received: list[bytes] = []
        self.headers: list[dict] = []
        self.acknowledged: list[bytes] = []
        self.release = threading.Event()
        self.holding = threading.Event()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.headers.append(dict(self.headers))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = _gzip.decompress(body)
                fake.received.append(body)
                action = fake.script.pop(0) if fake.script else "ok"
                if action == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if action == "hold":
                    fake.holding.set()
                    fake.release.wait(10)
                    action = "ok"
                if action == "ok":
                    fake.acknowledged.append(body)
                    n = body.count(b"\n")
                    text = json.dumps({"lines": n, "applied": n, "repeats": 0,
                                       "invalid": 0, "errors": []}).encode()
                    code = 200
                else:
                    code, text = int(action), b"busy"
                self.send_response(code)
                if code in (429, 503):
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def acknowledged_lines(self) -> list[bytes]:
        return [l + b"\n" for body in self.acknowledged for l in body.splitlines()]


def journal_lines() -> list[tuple[int, dict]]:
    """(job id, event) of the corpus job journal, in order."""
    return [(m["id"], e) for m in read_journal(JOB_JOURNAL1) if m.get("id") != -1
            for e in m["events"]]


class HttpSenderTest(unittest.TestCase):
    """The acknowledgement bookkeeping against a fake fluxpipe that drops
    connections mid-batch, answers 503/429/413, or acknowledges late."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.state_path = os.path.join(self.tmp.name, "state.json")
        self.logs: list[str] = []

    def tearDown(self):
        self.tmp.cleanup()

    def forward(self, fake: FakeFluxpipe, events, **sender):
        out = ff.HttpSender(fake.url, self.logs.append, sleep=lambda s: None, **sender)
        fw = ff.Forwarder(out, ff.empty_state(), self.state_path)
        for jobid, ev in events:
            fw.job_event(jobid, dict(ev))
        return fw, out

    def test_failures_resend_until_acknowledged_in_order(self):
        fake = FakeFluxpipe(["drop", "503", "429", "ok", "drop", "ok"])
        try:
            events = journal_lines()
            fw, out = self.forward(fake, events, batch_lines=7)
            self.assertTrue(out.wait_empty(20))
            out.stop()
            sent = [ff.encode(ff.job_message(j, e)) for j, e in events]
            # Every line acknowledged exactly once, in order, after the
            # unanswered and refused attempts.
            self.assertEqual(fake.acknowledged_lines(), sent)
            self.assertGreater(len(fake.received), len(fake.acknowledged))
            self.assertEqual(fw.state[ff.JOB], max(e["timestamp"] for _, e in events))
            self.assertTrue(any("sending again" in m for m in self.logs), self.logs)
        finally:
            fake.close()

    def test_the_resume_point_moves_only_on_acknowledgement(self):
        fake = FakeFluxpipe(["hold"])
        try:
            events = journal_lines()[:5]
            fw, out = self.forward(fake, events)
            self.assertTrue(fake.holding.wait(5))
            fw.checkpoint()
            # Sent, not acknowledged: the state says nothing was delivered.
            self.assertEqual(fw.state[ff.JOB], 0.0)
            self.assertFalse(os.path.exists(self.state_path) and
                             ff.load_state(self.state_path)[ff.JOB] > 0)
            fake.release.set()
            self.assertTrue(out.wait_empty(10))
            fw.checkpoint()
            self.assertEqual(ff.load_state(self.state_path)[ff.JOB],
                             max(e["timestamp"] for _, e in events))
            out.stop()
        finally:
            fake.close()

    def test_a_stop_keeps_the_unacknowledged_lines_and_sends_them_first_next_time(self):
        fake = FakeFluxpipe(["503"] * 1000)
        try:
            events = journal_lines()[:6]
            fw, out = self.forward(fake, events)
            self.assertFalse(out.wait_empty(0.3))
            out.stop()
            fw.checkpoint(final=True)
        finally:
            fake.close()
        saved = ff.load_state(self.state_path)
        self.assertEqual(saved[ff.JOB], 0.0)
        sent = [ff.encode(ff.job_message(j, e)) for j, e in events]
        self.assertEqual([l.encode() for l in saved[ff.PENDING]], sent)
        fake2 = FakeFluxpipe([])
        try:
            out2 = ff.HttpSender(fake2.url, self.logs.append, sleep=lambda s: None)
            fw2 = ff.Forwarder(out2, saved, self.state_path)
            fw2.job_event(*journal_lines()[6])
            self.assertTrue(out2.wait_empty(10))
            out2.stop()
            self.assertEqual(fake2.acknowledged_lines()[:6], sent)
            fw2.checkpoint(final=True)
            self.assertEqual(ff.load_state(self.state_path)[ff.PENDING], [])
        finally:
            fake2.close()

    def test_too_large_batches_are_halved(self):
        fake = FakeFluxpipe(["413"])
        try:
            events = journal_lines()[:8]
            fw, out = self.forward(fake, events, batch_lines=8)
            self.assertTrue(out.wait_empty(10))
            out.stop()
            self.assertEqual(len(fake.acknowledged_lines()), 8)
            self.assertEqual(out.batch_lines, 4)
        finally:
            fake.close()

    def test_exec_state_is_forgotten_only_after_its_events_are_acknowledged(self):
        fake = FakeFluxpipe(["hold"])
        try:
            out = ff.HttpSender(fake.url, self.logs.append, sleep=lambda s: None)
            fw = ff.Forwarder(out, ff.empty_state(), self.state_path)
            fw.exec_watched(42)
            fw.exec_event(42, {"timestamp": 5.0, "name": "init"})
            fw.exec_ended(42)
            self.assertTrue(fake.holding.wait(5))
            # Not acknowledged: still watched, from the start.
            self.assertEqual(fw.state[ff.EXEC], {42: 0.0})
            fake.release.set()
            self.assertTrue(out.wait_empty(10))
            self.assertEqual(fw.state[ff.EXEC], {})
            out.stop()
        finally:
            fake.close()


class FakeFuture:
    def __init__(self, error=None, answer=True, value=None):
        self.error, self.answer, self.value = error, answer, value
        self.cb = None

    def then(self, cb, *args):
        self.cb = cb
        if self.answer:
            cb(self, *args)
        return self

    def get(self):
        if self.error:
            raise OSError(self.error, os.strerror(self.error))
        return {} if self.value is None else self.value


class LivenessTest(unittest.TestCase):
    class Handle:
        def __init__(self, futures):
            self.futures = futures

        def timer_watcher_create(self, after, cb, repeat=0.0):
            self.tick = cb
            return argparse.Namespace(start=lambda: None, stop=lambda: None)

        def rpc(self, topic, payload):
            assert topic == "broker.ping"
            return self.futures()

    def test_an_error_answer_means_gone(self):
        gone: list[str] = []
        h = self.Handle(lambda: FakeFuture(errno.ECONNRESET))
        ff.Liveness(h, gone.append)
        h.tick()
        self.assertEqual(len(gone), 1)
        self.assertIn("reset", gone[0].lower())
        h.tick()
        self.assertEqual(len(gone), 1)

    def test_unanswered_pings_mean_gone_and_answers_keep_it_alive(self):
        gone: list[str] = []
        h = self.Handle(lambda: FakeFuture())
        ff.Liveness(h, gone.append, misses=3)
        for _ in range(10):
            h.tick()
        self.assertEqual(gone, [])
        h.futures = lambda: FakeFuture(answer=False)
        for _ in range(3):
            h.tick()
        self.assertEqual(gone, [])
        h.tick()
        self.assertEqual(gone, ["no answer to 3 pings"])


class InstanceGoneTest(unittest.TestCase):
    """The instance going away: exit 1 with a word (for systemd), or with
    --reconnect wait and go on from the acknowledged position."""

    def fake(self, ping_error):
        job = read_journal(JOB_JOURNAL1)
        res = read_journal(RESOURCE_JOURNAL1)
        fake = FakeFlux(job, res, journals_end=False)
        # The journals never end (flux-core 0.88); a ping fails.
        handle_cls = fake.Flux

        class Handle(handle_cls):
            def timer_watcher_create(self, after, cb, repeat=0.0):
                self.tick = cb
                return argparse.Namespace(start=lambda: None, stop=lambda: None)

            def rpc(self, topic, payload=None):
                return FakeFuture(ping_error if topic == "broker.ping" else None)

            def idle(self):
                # The journals are drained; the next ping tells the rest.
                self.tick()
                return 0

        fake.Flux = Handle
        return fake

    def test_exit_1_when_the_broker_goes_away(self):
        fake = self.fake(errno.ECONNRESET)
        out = Lines()
        logs: list[str] = []
        args = ff.parse_args([])
        status = ff.run_flux(args, ff.Forwarder(out, ff.empty_state()), logs.append,
                             flux_module=fake)
        self.assertEqual(status, 1)
        self.assertTrue(any("went away" in m for m in logs), logs)
        # fluxpipe is told, last: the instance is down, its ranks unknown.
        last = out.decoded()[-1]
        self.assertEqual(last["events"][0]["name"], "instance-down", last)
        self.assertNotIn("id", last)

    def test_reconnect_goes_on_from_the_acknowledged_position(self):
        fake = self.fake(errno.ECONNRESET)
        opened = []
        handle_cls = fake.Flux

        def Flux(*a):
            opened.append(a)
            if len(opened) == 2:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory")
            if len(opened) == 4:
                raise KeyboardInterrupt  # end of the test
            return handle_cls()

        fake.Flux = Flux
        out = Lines()
        logs: list[str] = []
        args = ff.parse_args(["--reconnect", "--reconnect-delay", "0"])
        fw = ff.Forwarder(out, ff.empty_state())
        with self.assertRaises(KeyboardInterrupt):
            ff.run_flux(args, fw, logs.append, flux_module=fake, sleep=lambda s: None)
        self.assertTrue(any("cannot connect to Flux" in m for m in logs), logs)
        self.assertTrue(any("connected to the Flux instance again" in m for m in logs), logs)
        # The second run asked the journal from the acknowledged position.
        self.assertEqual(fake.consumers[2].asked_since,
                         max(0.0, fw.state[ff.JOB] - args.overlap))
        self.assertGreater(fake.consumers[2].asked_since, 0)


def crashing_flux(crash) -> FakeFlux:
    """A FakeFlux whose first handles end with `crash` (a return code of
    reactor_run, or an exception it raises; a list: one per handle) once
    the journals are drained, as when the broker is killed; the handles
    after those end with a SIGTERM."""
    fake = FakeFlux(read_journal(JOB_JOURNAL1), read_journal(RESOURCE_JOURNAL1),
                    journals_end=False)
    crashes = list(crash) if isinstance(crash, list) else [crash]
    fake.opened = 0
    handle_cls = fake.Flux

    class Handle(handle_cls):
        def __init__(self, *a):
            super().__init__(*a)
            fake.opened += 1
            self.crash = crashes.pop(0) if crashes else None

        def idle(self):
            if self.crash is None:
                return super().idle()
            if isinstance(self.crash, BaseException):
                raise self.crash
            return self.crash

    fake.Flux = Handle
    return fake


class BrokerCrashTest(unittest.TestCase):
    """A broker killed (kill -9): flux-core's reactor_run() returns -1 (or
    raises OSError) as the connection breaks, with no signal caught. That
    is the instance gone, not a stop: logged, `instance-down` sent, exit 1
    or, with --reconnect, a new connection. Only a signal is a stop."""

    def fake(self, crash):
        return crashing_flux(crash)

    def run_forwarder(self, fake, *argv):
        out, logs = Lines(), []
        args = ff.parse_args(list(argv))
        status = ff.run_flux(args, ff.Forwarder(out, ff.empty_state()), logs.append,
                             flux_module=fake, sleep=lambda s: None)
        return status, out.decoded(), logs

    def instance_down(self, lines):
        return [m for m in lines if "id" not in m and m["events"]
                and m["events"][0]["name"] == "instance-down"]

    def test_a_reactor_that_returns_without_a_signal_is_the_instance_gone(self):
        status, lines, logs = self.run_forwarder(self.fake(-1))
        self.assertEqual(status, 1)
        self.assertEqual(len([m for m in logs if "connection to the Flux broker broke" in m]),
                         1, logs)
        self.assertFalse(any("stopping" in m for m in logs), logs)
        self.assertEqual(len(self.instance_down(lines)), 1)
        self.assertEqual(lines[-1], self.instance_down(lines)[0])

    def test_any_return_code_without_a_signal_is_the_instance_gone(self):
        status, lines, _ = self.run_forwarder(self.fake(0))
        self.assertEqual(status, 1)
        self.assertEqual(len(self.instance_down(lines)), 1)

    def test_an_oserror_from_the_reactor_is_the_instance_gone(self):
        crash = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        status, lines, logs = self.run_forwarder(self.fake(crash))
        self.assertEqual(status, 1)
        self.assertTrue(any("connection to the Flux broker broke" in m
                            and "Connection reset" in m for m in logs), logs)
        self.assertEqual(len(self.instance_down(lines)), 1)

    def test_reconnect_after_a_crash(self):
        crash = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        for first in (-1, crash):
            fake = self.fake([first])
            status, lines, logs = self.run_forwarder(
                fake, "--reconnect", "--reconnect-delay", "0")
            # The second handle ends with a SIGTERM: a stop, exit 0.
            self.assertEqual(status, 0)
            self.assertEqual(fake.opened, 2)
            self.assertTrue(any("connected to the Flux instance again" in m for m in logs),
                            logs)
            self.assertEqual(len(self.instance_down(lines)), 1)
            # The second run asked for the journals again.
            self.assertEqual(len(fake.consumers), 4)

    def test_a_sigterm_is_still_a_stop(self):
        status, lines, logs = self.run_forwarder(self.fake([]))
        self.assertEqual(status, 0)
        self.assertTrue(any("stopping (SIGTERM)" in m for m in logs), logs)
        self.assertFalse(any("broke" in m for m in logs), logs)
        self.assertEqual(self.instance_down(lines), [])


QUEUES_INTERVAL = 7.0


def queue_flux(config, crashes=(), script=lambda handle: None, budget=None) -> FakeFlux:
    """A crashing_flux (see there: `crashes`, else a SIGTERM at the end)
    whose broker answers config.get with `fake.config`: a dict (the
    broker's config), an errno (the RPC fails with it) or an OSError (the
    rpc() call itself raises it). At idle, `script(handle)` runs first:
    it may change `fake.config` and fire the queue timer (`handle.tick()`,
    which only a started timer answers, as in a reactor)."""
    fake = crashing_flux(list(crashes))
    fake.budget = budget
    fake.config = config
    fake.asked = 0
    handle_cls = fake.Flux

    class Handle(handle_cls):
        def __init__(self, *a):
            super().__init__(*a)
            self.timers: list = []

        def rpc(self, topic, payload=None):
            if topic != "config.get":
                return super().rpc(topic, payload)
            fake.asked += 1
            if isinstance(fake.config, OSError):
                raise fake.config
            if isinstance(fake.config, int):
                return FakeFuture(fake.config)
            return FakeFuture(value=json.loads(json.dumps(fake.config)))

        def timer_watcher_create(self, after, cb, repeat=0.0):
            w = super().timer_watcher_create(after, cb, repeat)
            w.cb, w.after = cb, after
            self.timers.append(w)
            return w

        def tick(self):
            for w in self.timers:
                if w.after == QUEUES_INTERVAL and w.started:
                    w.cb(self, w, 0, None)

        def idle(self):
            script(self)
            return super().idle()

    fake.Flux = Handle
    return fake


def queue_configs(lines: list[dict]) -> list[tuple[int, dict]]:
    """(line number, queues) of the queue-config lines."""
    return [(i, m["events"][0]["context"]["queues"]) for i, m in enumerate(lines)
            if "id" not in m and m.get("events")
            and m["events"][0]["name"] == "queue-config"]


class QueueConfigTest(unittest.TestCase):
    """The instance's `[queues]` table (config.get), which no eventlog
    carries: a resource line of fluxpipe's own after the resource
    journal's backlog, again when a check finds it changed, again after a
    reconnect; none with --queues-interval 0 or without the resource
    stream; a failing RPC logged, never fatal."""

    def run_forwarder(self, fake, *argv):
        out, logs = Lines(), []
        args = ff.parse_args(["--queues-interval", str(QUEUES_INTERVAL), *argv])
        status = ff.run_flux(args, ff.Forwarder(out, ff.empty_state()), logs.append,
                             flux_module=fake, sleep=lambda s: None)
        return status, out.decoded(), logs

    def test_sent_once_right_after_the_resource_sentinel(self):
        before = time.time()
        fake = queue_flux({"queues": QUEUES, "policy": {"limits": {"duration": "1h"}}},
                          script=lambda h: [h.tick() for _ in range(3)])
        status, lines, logs = self.run_forwarder(fake)
        self.assertEqual(status, 0)
        sent = queue_configs(lines)
        # Asked at the end of the backlog and at each tick; sent once (no change).
        self.assertEqual(fake.asked, 4)
        self.assertEqual([q for _, q in sent], [QUEUES_KEPT])
        at = sent[0][0]
        self.assertEqual(lines[at - 1], {"events": []})
        self.assertEqual(lines.index({"events": []}), at - 1)
        event = lines[at]["events"][0]
        self.assertTrue(before <= event["timestamp"] <= time.time())
        self.assertEqual(list(lines[at]), ["events"])
        # Every resource event of the backlog went before it.
        res = [m for m in read_journal(RESOURCE_JOURNAL1) if m["events"]]
        self.assertEqual(corpus_events([m for m in lines[:at] if "id" not in m and m["events"]]),
                         corpus_events(res))
        self.assertFalse(any("queue" in m for m in logs), logs)

    def test_not_sent_before_the_resource_backlog_ends(self):
        # Stopped (SIGTERM) after a few events, the resource backlog unfinished:
        # the ticks that come then find the timer not started.
        fake = queue_flux({"queues": QUEUES}, script=lambda h: h.tick(), budget=6)
        status, lines, _ = self.run_forwarder(fake)
        self.assertEqual(status, 0)
        self.assertNotIn({"events": []}, lines)
        self.assertEqual(queue_configs(lines), [])
        self.assertEqual(fake.asked, 0)

    def test_sent_again_only_when_the_table_changes(self):
        changed = {"batch": {"requires": ["batch", "gpu"]}, "debug": {"parent": "batch"}}

        def script(h):
            h.tick()
            # A policy is not sent: no change in what the line keeps.
            fake.config = {"queues": {**QUEUES, "all": {"policy": {"limits": {}}}}}
            h.tick()
            fake.config = {"queues": changed}
            h.tick()
            h.tick()
            # The table removed: `{}`.
            fake.config = {"policy": {}}
            h.tick()
            h.tick()

        fake = queue_flux({"queues": QUEUES}, script=script)
        status, lines, _ = self.run_forwarder(fake)
        self.assertEqual(status, 0)
        self.assertEqual([q for _, q in queue_configs(lines)], [QUEUES_KEPT, changed, {}])
        self.assertEqual(fake.asked, 7)

    def test_an_instance_without_queues_sends_an_empty_table(self):
        fake = queue_flux({"resource": {"noverify": True}})
        _, lines, _ = self.run_forwarder(fake)
        self.assertEqual([q for _, q in queue_configs(lines)], [{}])

    def test_none_with_queues_interval_0_or_without_the_resource_stream(self):
        for argv in (["--queues-interval", "0"], ["--streams", "job"]):
            fake = queue_flux({"queues": QUEUES}, script=lambda h: h.tick())
            status, lines, _ = self.run_forwarder(fake, *argv)
            self.assertEqual(status, 0, argv)
            self.assertEqual(queue_configs(lines), [], argv)
            self.assertEqual(fake.asked, 0, argv)
        self.assertEqual(ff.parse_args([]).queues_interval, 30.0)

    def test_a_failing_rpc_is_logged_once_per_streak_and_not_fatal(self):
        def script(h):
            h.tick()
            h.tick()
            fake.config = {"queues": QUEUES}
            h.tick()
            fake.config = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
            h.tick()
            h.tick()
            fake.config = {"queues": {}}
            h.tick()

        fake = queue_flux(errno.EPERM, script=script)
        status, lines, logs = self.run_forwarder(fake)
        # The forwarder went on to its SIGTERM, the journals forwarded.
        self.assertEqual(status, 0)
        self.assertTrue(any("stopping (SIGTERM)" in m for m in logs), logs)
        self.assertIn({"id": -1, "events": []}, lines)
        failed = [m for m in logs if "cannot read the queue configuration" in m]
        self.assertEqual(len(failed), 2, logs)
        self.assertIn(os.strerror(errno.EPERM), failed[0])
        self.assertIn("Connection reset", failed[1])
        self.assertEqual(len([m for m in logs if "can be read again" in m]), 2, logs)
        # An empty table after a full one is a change.
        self.assertEqual([q for _, q in queue_configs(lines)], [QUEUES_KEPT, {}])

    def test_sent_again_after_a_reconnect(self):
        fake = queue_flux({"queues": QUEUES}, crashes=[-1],
                          script=lambda h: h.tick())
        status, lines, logs = self.run_forwarder(fake, "--reconnect", "--reconnect-delay", "0")
        self.assertEqual(status, 0)
        self.assertEqual(fake.opened, 2)
        sent = queue_configs(lines)
        # Unchanged, but each connection's backlog ends with it.
        self.assertEqual([q for _, q in sent], [QUEUES_KEPT, QUEUES_KEPT])
        sentinels = [i for i, m in enumerate(lines) if m == {"events": []}]
        self.assertEqual([i + 1 for i in sentinels], [i for i, _ in sent])
        down = [i for i, m in enumerate(lines) if "id" not in m and m["events"]
                and m["events"][0]["name"] == "instance-down"]
        self.assertEqual(len(down), 1)
        self.assertLess(sent[0][0], down[0])
        self.assertLess(down[0], sent[1][0])

    def test_the_option(self):
        self.assertEqual(ff.parse_args(["--queues-interval", "0"]).queues_interval, 0.0)
        for bad in ("-1", "nan", "inf"):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
                ff.parse_args(["--queues-interval", bad])
            self.assertIn("--queues-interval", err.getvalue())

    def test_fluxpipe_reads_the_queue_config_line(self):
        binary = fluxpipe_binary()
        if binary is None:
            self.skipTest("no fluxpipe binary")
        fake = queue_flux({"queues": QUEUES})
        _, lines, _ = self.run_forwarder(fake)
        self.assertEqual(len(queue_configs(lines)), 1)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "forwarded.jsonl")
            path.write_text("".join(ff.encode(m).decode() for m in lines))
            run = subprocess.run([binary, "replay", "--format", "json", "--cluster", "B",
                                  "--input-format", "auto", str(path)],
                                 capture_output=True, text=True, check=True)
        anomalies = [r for r in map(json.loads, run.stdout.splitlines())
                     if r["kind"] == "anomaly"]
        if any(a.get("anomaly") == "unknown-event" and a.get("event") == "queue-config"
               for a in anomalies):
            self.skipTest(f"{binary} predates the queue-config line (rebuild it)")
        self.assertEqual(anomalies, [])


class ArgumentErrorsTest(unittest.TestCase):
    def test_one_line_errors(self):
        for argv, words in [
            (["--connect", "kafka://b:9092"], "kafka://HOST:PORT"),
            (["--connect", "http://h:notaport/"], "bad port"),
            (["--token-file", "/nonexistent/token"], "--token-file"),
        ]:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
                ff.parse_args(argv)
            self.assertIn(words, err.getvalue())
        self.assertEqual(ff.parse_address("http://127.0.0.1:7070/"),
                         ("http", "http://127.0.0.1:7070/"))

    def test_a_bad_uri_is_one_line_and_exit_1(self):
        class Broken:
            @staticmethod
            def Flux(*a):
                raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        logs: list[str] = []
        args = ff.parse_args(["--uri", "local:///nonexistent/local-0"])
        status = ff.run_flux(args, ff.Forwarder(Lines(), ff.empty_state()), logs.append,
                             flux_module=Broken)
        self.assertEqual(status, 1)
        self.assertEqual(len([m for m in logs if "cannot connect to Flux" in m]), 1, logs)
        self.assertIn("local:///nonexistent/local-0", logs[0])


class FakeProducer:
    """confluent_kafka.Producer's surface: produce() keeps the message and
    its delivery callback; the test delivers them when and how it likes."""

    def __init__(self, partitions: int = 3):
        self.sent: list = []
        # Messages produced to a given partition (heartbeats): (partition,
        # key, value, on_delivery).
        self.beats: list = []
        self.lock = threading.Lock()
        self.partitions = partitions
        self.metadata_asked = 0
        self.metadata_error: Exception | None = None

    def produce(self, topic, value=None, key=None, on_delivery=None, partition=None):
        with self.lock:
            if partition is not None:
                self.beats.append((partition, key, value, on_delivery))
            else:
                self.sent.append((topic, key, value, on_delivery))

    def list_topics(self, topic=None, timeout=-1):
        self.metadata_asked += 1
        if self.metadata_error is not None:
            raise self.metadata_error
        partitions = {p: argparse.Namespace(id=p) for p in range(self.partitions)}
        return argparse.Namespace(topics={topic: argparse.Namespace(
            topic=topic, partitions=partitions, error=None)})

    def poll(self, timeout=0):
        time.sleep(min(timeout, 0.01))
        return 0

    def flush(self, timeout=None):
        return 0


class KafkaSenderTest(unittest.TestCase):
    def test_acknowledged_in_order_and_failures_produced_again(self):
        producer = FakeProducer()
        logs: list[str] = []
        out = ff.KafkaSender("b:9092", "flux", logs.append, producer=producer)
        fw = ff.Forwarder(out, ff.empty_state())
        events = journal_lines()[:4]
        for jobid, ev in events:
            fw.job_event(jobid, dict(ev))
        fw.resource_event({"timestamp": 99.0, "name": "online", "context": {"idset": "0"}})
        self.assertEqual([k for _, k, _, _ in producer.sent],
                         [str(events[0][0]).encode()] * 4 + [b"resource"])
        # Delivered out of order: nothing moves until the first one is in.
        producer.sent[2][3](None, None)
        producer.sent[1][3](None, None)
        self.assertEqual(fw.state[ff.JOB], 0.0)
        # The first one fails: produced again, still nothing acknowledged.
        producer.sent[0][3]("broker down", None)
        self.assertEqual(len(producer.sent), 6)
        self.assertEqual(fw.state[ff.JOB], 0.0)
        self.assertTrue(any("producing again" in m for m in logs))
        producer.sent[5][3](None, None)
        self.assertEqual(fw.state[ff.JOB], events[2][1]["timestamp"])
        self.assertEqual(len(out.unacknowledged()), 2)
        producer.sent[3][3](None, None)
        producer.sent[4][3](None, None)
        self.assertEqual(fw.state[ff.JOB], events[3][1]["timestamp"])
        self.assertEqual(fw.state[ff.RESOURCE], 99.0)
        self.assertEqual(out.unacknowledged(), [])
        out.stop()

    @unittest.skipUnless(os.environ.get("FLUXPIPE_KAFKA_BROKER"), "no broker")
    def test_a_real_broker_acknowledges_everything(self):
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            self.skipTest("no confluent-kafka")
        broker = os.environ["FLUXPIPE_KAFKA_BROKER"]
        out = ff.KafkaSender(broker, f"forwarder-test-{os.getpid()}", print)
        fw = ff.Forwarder(out, ff.empty_state())
        events = journal_lines()
        for jobid, ev in events:
            fw.job_event(jobid, dict(ev))
        self.assertTrue(out.wait_empty(30))
        self.assertEqual(fw.state[ff.JOB], max(e["timestamp"] for _, e in events))
        out.stop()


def wait_for(predicate, timeout: float = 5.0) -> bool:
    """Poll until predicate() is true (True) or timeout (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


class HeartbeatTest(unittest.TestCase):
    """--heartbeat: after an interval with nothing sent, a sign of life
    that fluxpipe applies as nothing (http: an empty POST; socket: a blank
    line; kafka: a blank message to every partition)."""

    def test_the_option(self):
        self.assertEqual(ff.parse_args([]).heartbeat, 30.0)
        self.assertEqual(ff.parse_args(["--heartbeat", "0"]).heartbeat, 0.0)
        for bad in ("-1", "nan", "inf"):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
                ff.parse_args(["--heartbeat", bad])
            self.assertIn("--heartbeat", err.getvalue())

    def test_an_idle_http_sender_posts_an_empty_body(self):
        fake = FakeFluxpipe([])
        try:
            out = ff.HttpSender(fake.url, [].append, token="secret", heartbeat=0.2)
            time.sleep(0.1)
            self.assertEqual(fake.received, [], "a heartbeat before the interval")
            self.assertTrue(wait_for(lambda: len(fake.received) >= 2))
            out.stop()
            self.assertEqual(set(fake.received), {b""})
            h = fake.headers[0]
            self.assertEqual(h["Content-Length"], "0")
            self.assertNotIn("Content-Encoding", h)
            self.assertEqual(h["Authorization"], "Bearer secret")
        finally:
            fake.close()

    def test_no_http_heartbeat_while_a_batch_is_in_flight_or_sent_again(self):
        # In flight: fluxpipe holds the batch.
        # The lines are read before the sender starts: a heartbeat sent
        # while they are read would come first.
        events = journal_lines()[:5]
        fake = FakeFluxpipe(["hold"])
        try:
            out = ff.HttpSender(fake.url, [].append, heartbeat=0.05)
            fw = ff.Forwarder(out, ff.empty_state())
            for jobid, ev in events:
                fw.job_event(jobid, dict(ev))
            self.assertTrue(fake.holding.wait(5))
            time.sleep(0.4)
            self.assertEqual(len(fake.received), 1, fake.received)
            fake.release.set()
            self.assertTrue(out.wait_empty(10))
            # Idle again: heartbeats, and they acknowledge nothing.
            self.assertTrue(wait_for(lambda: b"" in fake.received))
            out.stop()
            self.assertNotEqual(fake.received[0], b"")
            self.assertEqual(fake.acknowledged_lines(),
                             [ff.encode(ff.job_message(j, e)) for j, e in events])
            self.assertEqual(fw.state[ff.JOB], max(e["timestamp"] for _, e in events))
        finally:
            fake.close()
        # Sent again after failures, with backoffs longer than the interval.
        first = journal_lines()[0]
        fake = FakeFluxpipe(["503"] * 8)
        try:
            out = ff.HttpSender(fake.url, [].append, heartbeat=0.01,
                                sleep=lambda s: time.sleep(0.05))
            fw = ff.Forwarder(out, ff.empty_state())
            fw.job_event(*first)
            self.assertTrue(out.wait_empty(10))
            out.stop()
            # The batch, 8 times refused then taken; heartbeats only after.
            self.assertNotIn(b"", fake.received[:9])
            self.assertEqual(len(set(fake.received[:9])), 1)
        finally:
            fake.close()

    def test_failed_http_heartbeats_are_not_retried_and_logged_sparingly(self):
        fake = FakeFluxpipe(["503"] * 1000)
        try:
            logs: list[str] = []
            out = ff.HttpSender(fake.url, logs.append, heartbeat=0.02)
            started = time.monotonic()
            self.assertTrue(wait_for(lambda: len(fake.received) >= 12))
            out.stop()
            took = time.monotonic() - started
            # One per interval, not a retry storm.
            self.assertLessEqual(len(fake.received), took / 0.02 + 2)
            failed = [m for m in logs if "heartbeat failed" in m]
            self.assertTrue(failed)
            self.assertLessEqual(len(failed), len(fake.received) // 10 + 1, logs)
        finally:
            fake.close()

    def test_heartbeat_0_sends_none(self):
        fake = FakeFluxpipe([])
        try:
            out = ff.HttpSender(fake.url, [].append, heartbeat=0)
            time.sleep(0.3)
            out.stop()
            self.assertEqual(fake.received, [])
        finally:
            fake.close()
        producer = FakeProducer()
        out = ff.KafkaSender("b:9092", "flux", [].append, producer=producer, heartbeat=0)
        time.sleep(0.3)
        out.stop()
        self.assertEqual((producer.beats, producer.metadata_asked), ([], 0))
        server = socket.create_server(("127.0.0.1", 0))
        try:
            w = ff.SocketWriter("tcp", server.getsockname(), [].append, heartbeat=0)
            self.assertIsNone(w.thread)
            server.settimeout(0.3)
            with self.assertRaises(socket.timeout):
                server.accept()
            w.stop()
        finally:
            server.close()

    def test_heartbeats_go_on_while_waiting_for_the_instance(self):
        fake = FakeFluxpipe([])
        try:
            out = ff.HttpSender(fake.url, [].append, heartbeat=0.05)
            fw = ff.Forwarder(out, ff.empty_state())
            beats_in_wait = []

            def sleep(seconds):
                # The --reconnect wait: the reactor is not running.
                beats_in_wait.append(wait_for(lambda: b"" in fake.received))

            args = ff.parse_args(["--reconnect", "--connect", fake.url])
            status = ff.run_flux(args, fw, [].append, flux_module=crashing_flux(-1),
                                 sleep=sleep)
            self.assertEqual(status, 0)
            self.assertEqual(beats_in_wait, [True])
            # Everything, the instance-down line included, acknowledged.
            lines = [json.loads(l) for l in fake.acknowledged_lines()]
            self.assertTrue(any(m.get("events") and m["events"][0]["name"] == "instance-down"
                                for m in lines))
        finally:
            fake.close()

    def test_a_socket_gets_a_blank_line_and_a_broken_connection_shows(self):
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(5)
        logs: list[str] = []
        w = ff.SocketWriter("tcp", server.getsockname(), logs.append,
                            sleep=lambda s: None, heartbeat=0.1)
        try:
            conn, _ = server.accept()
            conn.settimeout(5)
            self.assertEqual(conn.recv(100), b"\n")
            w(b'{"n":1}\n')
            f = conn.makefile("rb")
            self.assertEqual(f.readline(), b'{"n":1}\n')
            self.assertEqual(f.readline(), b"\n")
            # fluxpipe goes away: the heartbeats notice, and connect again.
            f.close()
            conn.close()
            conn2, _ = server.accept()
            conn2.settimeout(5)
            self.assertEqual(conn2.recv(100)[:1], b"\n")
            conn2.close()
            self.assertTrue(any("lost" in m for m in logs), logs)
        finally:
            w.stop()
            w.close()
            server.close()

    def test_kafka_heartbeats_reach_every_partition(self):
        producer = FakeProducer(partitions=4)
        logs: list[str] = []
        out = ff.KafkaSender("b:9092", "flux", logs.append, producer=producer, heartbeat=0.2)
        try:
            self.assertTrue(wait_for(lambda: len(producer.beats) >= 4))
            first = list(producer.beats)
            self.assertEqual(sorted(p for p, _, _, _ in first), [0, 1, 2, 3])
            self.assertEqual({(k, v) for _, k, v, _ in first}, {(None, b"\n")})
            # Undelivered (the broker is down): no round added behind it.
            time.sleep(0.5)
            self.assertEqual(len(producer.beats), 4)
            # Delivered; then a line lands in partition 1: the next round
            # skips it, having heard from it within the interval.
            for _, _, _, cb in first:
                cb(None, None)
            fw = ff.Forwarder(out, ff.empty_state())
            fw.job_event(*journal_lines()[0])
            producer.sent[0][3](None, argparse.Namespace(partition=lambda: 1))
            self.assertTrue(wait_for(lambda: len(producer.beats) >= 7))
            self.assertEqual(sorted(p for p, _, _, _ in producer.beats[4:7]), [0, 2, 3])
            # Metadata asked once, kept; a failed heartbeat drops it, and
            # while it cannot be had, it is asked again each interval.
            self.assertEqual(producer.metadata_asked, 1)
            producer.metadata_error = RuntimeError("no broker")
            for _, _, _, cb in producer.beats[4:7]:
                cb("partition gone", None)
            self.assertTrue(wait_for(lambda: producer.metadata_asked >= 3, 3))
            self.assertEqual(len(producer.beats), 7)
            # Logged once (then every tenth failure), not each time.
            failed = [m for m in logs if "heartbeat failed" in m]
            self.assertEqual(len(failed), 1, logs)
            self.assertIn("partition gone", failed[0])
            producer.metadata_error = None
            self.assertTrue(wait_for(lambda: len(producer.beats) >= 11))
            self.assertEqual(sorted(p for p, _, _, _ in producer.beats[7:11]), [0, 1, 2, 3])
            for _, _, _, cb in producer.beats[7:11]:
                cb(None, None)
            self.assertTrue(any("heartbeats delivered again" in m for m in logs), logs)
        finally:
            out.stop()


def openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class HttpsTest(unittest.TestCase):
    """https:// to a fake fluxpipe with certificates made by the openssl
    command: --cacert trusts a private CA, the system's trust store does
    not, and --client-cert answers a source that asks for one."""

    @classmethod
    def setUpClass(cls):
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("no openssl command to make certificates with")
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                "-subj", "/CN=flux-forwarder test CA", cwd=d)
        for name, usage, san in (("server", "serverAuth", "subjectAltName=IP:127.0.0.1\n"),
                                 ("client", "clientAuth", "")):
            with open(os.path.join(d, f"{name}.ext"), "w", encoding="utf-8") as f:
                f.write(f"{san}basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
                        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
            openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                    "-subj", f"/CN={name}", cwd=d)
            openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                    "-out", f"{name}.pem", cwd=d)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def path(self, name: str) -> str:
        return os.path.join(self.tmp.name, name)

    def server(self, client_certificates: bool = False):
        import ssl
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(self.path("server.pem"), self.path("server.key"))
        if client_certificates:
            tls.verify_mode = ssl.CERT_REQUIRED
            tls.load_verify_locations(self.path("ca.pem"))
        return FakeFluxpipe([], tls=tls)

    def send(self, fake: FakeFluxpipe, *options: str, wait: float = 10):
        """Five journal lines through an HttpSender made as `main` makes
        it: (lines sent, lines acknowledged, whether all were, logs)."""
        logs: list[str] = []
        args = ff.parse_args(["--connect", fake.url, *options])
        out = ff.HttpSender(fake.url, logs.append, sleep=lambda s: time.sleep(0.01),
                            context=args.tls)
        fw = ff.Forwarder(out, ff.empty_state())
        events = journal_lines()[:5]
        for jobid, ev in events:
            fw.job_event(jobid, dict(ev))
        done = out.wait_empty(wait)
        out.stop()
        sent = [ff.encode(ff.job_message(j, e)) for j, e in events]
        return sent, fake.acknowledged_lines(), done, logs

    def test_https_with_cacert_is_acknowledged(self):
        fake = self.server()
        try:
            self.assertTrue(fake.url.startswith("https://"))
            sent, acknowledged, done, logs = self.send(fake, "--cacert", self.path("ca.pem"))
            self.assertTrue(done, logs)
            self.assertEqual(acknowledged, sent)
        finally:
            fake.close()

    def test_a_private_ca_is_not_trusted_without_cacert(self):
        fake = self.server()
        try:
            _, acknowledged, done, logs = self.send(fake, wait=0.5)
            self.assertFalse(done)
            self.assertEqual(acknowledged, [])
            self.assertTrue(any("CERTIFICATE_VERIFY_FAILED" in m for m in logs), logs)
        finally:
            fake.close()

    def test_a_client_certificate_is_presented_when_given(self):
        fake = self.server(client_certificates=True)
        try:
            _, acknowledged, done, _ = self.send(fake, "--cacert", self.path("ca.pem"),
                                                 wait=0.5)
            self.assertFalse(done)
            self.assertEqual(acknowledged, [])
            sent, acknowledged, done, logs = self.send(
                fake, "--cacert", self.path("ca.pem"), "--client-cert", self.path("client.pem"),
                "--client-key", self.path("client.key"))
            self.assertTrue(done, logs)
            self.assertEqual(acknowledged, sent)
        finally:
            fake.close()

    def test_tls_option_errors_are_one_line(self):
        for argv, words in [
            (["--connect", "http://h:1/", "--cacert", self.path("ca.pem")],
             "--cacert is for https://"),
            (["--connect", "https://h:1/", "--cacert", "/nonexistent/ca.pem"], "--cacert"),
            (["--connect", "https://h:1/", "--cacert", self.path("server.ext")], "--cacert"),
            (["--connect", "https://h:1/", "--client-key", self.path("client.key")],
             "--client-key needs --client-cert"),
            (["--connect", "https://h:1/", "--client-cert", self.path("ca.pem")],
             "--client-cert"),
        ]:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
                ff.parse_args(argv)
            self.assertIn(words, err.getvalue(), argv)
        self.assertIsNone(ff.parse_args(["--connect", "http://h:1/"]).tls)
        self.assertIsNotNone(ff.parse_args(["--connect", "https://h:1/"]).tls)


if __name__ == "__main__":
    unittest.main()
