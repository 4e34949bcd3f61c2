"""Tests of flux-forwarder without Flux: a fake journal built from the
sample corpus (tests/corpus/instances/B/journals) stands in for
flux.job.JournalConsumer and flux.resource.journal.ResourceJournalConsumer.

    cd contrib/flux-forwarder && python3 -m unittest -v
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
JOURNALS = REPO / "tests/corpus/instances/B/journals"

_loader = importlib.machinery.SourceFileLoader("flux_forwarder", str(HERE / "flux-forwarder"))
_spec = importlib.util.spec_from_loader("flux_forwarder", _loader)
ff = importlib.util.module_from_spec(_spec)
_loader.exec_module(ff)


def read_journal(name: str) -> list[dict]:
    with open(JOURNALS / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class FakeEvent(dict):
    """What the bindings hand to a callback: the event as a dict (with an
    empty context added when it had none), plus jobid and R."""

    def __init__(self, event: dict, jobid: int = -1, R=None):
        super().__init__(event)
        self.setdefault("context", {})
        self.jobid = jobid
        self.R = R


class FakeConsumer:
    """A journal consumer over recorded journal messages: the backlog (the
    messages before the sentinel) split into events newer than `since`,
    sorted by time, then the sentinel, then the live messages, then None."""

    def __init__(self, messages: list[dict], stream: str, since: float = 0.0):
        self.stream = stream
        self.since = since
        self.cb = None
        self.started = False
        backlog, live, seen_sentinel = [], [], False
        for m in messages:
            if not m["events"] and (stream == ff.RESOURCE or m.get("id") == -1):
                seen_sentinel = True
                continue
            for e in m["events"]:
                ev = FakeEvent(e, m.get("id", -1), m.get("R"))
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


class FramingTest(unittest.TestCase):
    def test_job_message_keeps_R_with_alloc_only_and_drops_jobspec(self):
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
                self.assertNotIn("jobspec", m)
                if "R" in m:
                    self.assertEqual(m["events"][0]["name"], "alloc")
            allocs_with_R = {m["id"] for m in messages if "R" in m}
            self.assertEqual({m["id"] for m in lines if "R" in m}, allocs_with_R)
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
                return sorted(run.stdout.splitlines())
            self.assertEqual(replay(fwd), replay(orig))


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
        self.assertEqual(ff.load_state(self.state_path), {"job": 12.5, "resource": 3.0})
        self.assertEqual(os.listdir(os.path.dirname(self.state_path)), ["state.json"])

    def test_bad_state_files_are_errors(self):
        os.makedirs(os.path.dirname(self.state_path))
        for text in ("{not json", "[1]", '{"job": "x"}', '{"job": -1}',
                     '{"resource": true}', '{"job": NaN}'):
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
        self.assertEqual(ff.load_state(self.state_path), {"job": 11.0, "resource": 7.0})

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
            import contextlib
            with contextlib.redirect_stderr(null):
                ff.parse_args(["--streams", "jobs"])


class FakeFlux:
    """Just enough of the flux module for run_flux()."""

    def __init__(self, messages_job, messages_res):
        fake = self
        self.consumers = []

        class Handle:
            def __init__(self, *a):
                self.stopped = False

            def reactor_run(self):
                for c in fake.consumers:
                    c.deliver()
                    if self.stopped:
                        break

            def reactor_stop(self):
                self.stopped = True

            def timer_watcher_create(self, after, cb, repeat=0.0):
                return Watcher()

            def signal_watcher_create(self, signum, cb):
                return Watcher()

        class Watcher:
            def start(self):
                pass

            def stop(self):
                pass

        def job_consumer(handle, full, since, include_sentinel):
            assert full and include_sentinel
            c = FakeConsumer(messages_job, ff.JOB, since)
            c.asked_since = since
            fake.consumers.append(c)
            return c

        def resource_consumer(handle, since, include_sentinel):
            c = FakeConsumer(messages_res, ff.RESOURCE, since)
            c.asked_since = since
            fake.consumers.append(c)
            return c

        self.Flux = Handle
        self.job = argparse.Namespace(JournalConsumer=job_consumer)
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


if __name__ == "__main__":
    unittest.main()
