#!/usr/bin/env python3
"""Writes lines.jsonl (the bad-input corpus, envelope form, with three good
jobs interleaved) and expected.txt (one outcome per line):

  good                  applied, no anomaly
  dead_letter           undecodable: a dead_letter record names this line
  duplicate             an exact repeat: skipped and counted, nothing emitted
  anomaly:K1,K2@ID      applied or ignored with these anomaly kinds for job ID

tests/integration/bad_input.rs feeds lines.jsonl through `fluxpipe run` (adding the
binary and huge lines that do not belong in a text file) and checks every
outcome. Run this script again after changing it."""
import json

def env(i, ts, name, ctx=None):
    ev = {"timestamp": ts, "name": name}
    if ctx is not None:
        ev["context"] = ctx
    return json.dumps({"cluster": "x", "stream": "job", "id": i, "event": ev})

def raw(i, event_json):
    return '{"cluster":"x","stream":"job","id":%s,"event":%s}' % (i, event_json)

def life(i, t0, status=0):
    evs = [("submit", {"userid": 1000 + i, "urgency": 16, "flags": 0, "version": 1}),
           ("validate", None), ("depend", None), ("priority", {"priority": 16}),
           ("alloc", None), ("start", None), ("finish", {"status": status}),
           ("release", {"ranks": "all", "final": True}), ("free", None), ("clean", None)]
    return [env(i, t0 + k * 0.5, n, c) for k, (n, c) in enumerate(evs)]

good = [life(1, 100.0), life(2, 200.0, 256), life(3, 300.0)]
bad = [
    # not JSON, not an object, truncated
    ('{"cluster":"x","stream":"job","id":1,"event":{"timestamp":', "dead_letter"),
    ("not json at all", "dead_letter"),
    ("{}", "dead_letter"),
    ("[]", "dead_letter"),
    ("null", "dead_letter"),
    ("42", "dead_letter"),
    ('"a string"', "dead_letter"),
    # ids of every wrong kind
    (raw('"abc"', '{"timestamp":2.0,"name":"validate"}'), "dead_letter"),
    (raw("-1", '{"timestamp":2.0,"name":"validate"}'), "dead_letter"),
    (raw("1.5", '{"timestamp":2.0,"name":"validate"}'), "dead_letter"),
    (raw('"ƒ!!!"', '{"timestamp":2.0,"name":"validate"}'), "dead_letter"),
    (raw("99999999999999999999999", '{"timestamp":2.0,"name":"validate"}'), "dead_letter"),
    # timestamps: a string, negative, zero, overflowing, NaN, missing
    (raw(7, '{"timestamp":"2.0","name":"validate"}'), "dead_letter"),
    (raw(7, '{"timestamp":-5.0,"name":"validate"}'), "dead_letter"),
    (raw(7, '{"timestamp":0,"name":"validate"}'), "dead_letter"),
    (raw(7, '{"timestamp":1e999,"name":"validate"}'), "dead_letter"),
    (raw(7, '{"timestamp":NaN,"name":"validate"}'), "dead_letter"),
    (raw(7, '{"name":"validate"}'), "dead_letter"),
    # names and shapes
    (raw(7, '{"timestamp":2.0}'), "dead_letter"),
    (raw(7, '{"timestamp":2.0,"name":17}'), "dead_letter"),
    (raw(7, '"submit"'), "dead_letter"),
    ('{"cluster":"x","stream":"nope","id":7,"event":{"timestamp":2.0,"name":"validate"}}', "dead_letter"),
    ('{"cluster":["x"],"stream":"job","id":7,"event":{"timestamp":2.0,"name":"validate"}}', "dead_letter"),
    (raw(7, '{"timestamp":2.0,"name":"validate","context":"oops"}'), "dead_letter"),
    # decodable, wrong for the model
    (env(1, 104.2, "frobnicate"), "anomaly:unknown-event@1"),
    (env(2, 201.1, "priority", {"priority": "high"}), "anomaly:out-of-order,invalid-context@2"),
    (env(3, 301.1, "exception", {"type": "cancel"}), "anomaly:out-of-order,missing-context@3"),
    (env(8, 50.0, "alloc"), "anomaly:unknown-target@8"),
    # exact repeats of good lines
    (life(1, 100.0)[2], "duplicate"),
    (life(2, 200.0, 256)[0], "duplicate"),
]

flat = [g[k] for k in range(10) for g in good]
lines, expected = [], []
for i, line in enumerate(flat):
    lines.append(line)
    expected.append("good")
    if i < len(bad):
        lines.append(bad[i][0])
        expected.append(bad[i][1])
with open("lines.jsonl", "w") as f:
    f.write("\n".join(lines) + "\n")
with open("expected.txt", "w") as f:
    f.write("\n".join(expected) + "\n")
