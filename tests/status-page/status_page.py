#!/usr/bin/env python3
"""The status page (`/` of `fluxpipe run`) in a real browser.

A known workload is generated (`fluxpipe generate`, two clusters, one cut
off mid-run, plus a drain whose reason needs escaping) and replayed with
`fluxpipe replay --format json` and the same alert rules: that says which
ranks are drained, why, and which alerts fire, so nothing below is
hard-coded. `fluxpipe run` then reads the same journals on a free loopback
port, and headless Chromium renders `/`:

- `--dump-dom`: every drained rank is a grid cell whose title names its host
  and its drain reason; every alert of `/api/v1/alerts` is a row of its
  cluster's alert table (and no other row is); pending and running are what
  `/api/v1/clusters` says; one grid cell per rank.
- `--screenshot` at a phone's size (412x915): a real PNG of that size, with
  the grid's colours painted.
- chromedriver (WebDriver over HTTP): no SEVERE entry in the browser log
  (the console), and nothing wider than the phone's screen. Without
  chromedriver, Chromium's `--enable-logging=stderr` output is searched for
  console errors instead; the output says which was used.
- `[api] token_file`: `/` and `/api/v1` answer 401 without the secret, 200
  with `Authorization: Bearer SECRET` (and HTTP Basic, as browsers send it);
  `/metrics` stays open.
- SIGTERM stops `fluxpipe run` with exit status 0.

Without Chromium the browser checks are SKIPPED (the others still run): the
exit status is then 0 unless FLUXPIPE_REQUIRE_BROWSER is set. Packages:

    apt-get install -y --no-install-recommends chromium chromium-driver

Usage: status_page.py --fluxpipe target/release/fluxpipe [--artifacts DIR]
"""

import argparse
import base64
import collections
import html
import html.parser
import json
import re
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

# What the page shows at most per cluster (ALERTS_SHOWN in src/api/page.rs):
# the workload keeps under it, so that every alert must be listed.
ALERTS_SHOWN = 50
# The grid's colours (STYLE in src/api/page.rs), to find in the screenshot.
COLOURS = {
    "up": (0x33, 0xAA, 0x33),
    "drained": (0xEE, 0x88, 0x00),
    "draining": (0xFF, 0xCC, 0x33),
    "offline": (0xCC, 0x33, 0x33),
    "torpid": (0xAA, 0x44, 0xCC),
}
PHONE = (412, 915)
# How long the browser log is read after the page loaded.
CONSOLE_SETTLE_SECS = 2.0
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SECRET = "s3cret-status-page"
# A drain reason the page must escape (and the browser show as it is).
ODD_REASON = 'fan <3 & "hot" \'psu\''


class Report:
    def __init__(self, strict):
        self.failures = []
        self.warnings = []
        self.strict = strict

    def ok(self, what):
        print(f"  ok    {what}", flush=True)

    def fail(self, what):
        print(f"  FAIL  {what}", flush=True)
        self.failures.append(what)

    def warn(self, what):
        """A page defect outside the required checks: fails only with --strict."""
        if self.strict:
            self.fail(what)
        else:
            print(f"  WARN  {what}", flush=True)
            self.warnings.append(what)

    def check(self, cond, what, detail=""):
        if cond:
            self.ok(what)
        else:
            self.fail(what + (f": {detail}" if detail else ""))
        return cond


# ---------------------------------------------------------------- workload


def run_ok(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(map(str, cmd))}: exit {p.returncode}\n{p.stderr}")
    return p.stdout


def resource_line(ts, name, context):
    return json.dumps({"events": [{"timestamp": ts, "name": name, "context": context}]}) + "\n"


def newest_timestamp(path):
    """The newest event time of a journal."""
    newest = 0.0
    with open(path) as f:
        for line in f:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            events = msg.get("events") or []
            if isinstance(msg.get("event"), dict):
                events = events + [msg["event"]]
            for ev in events:
                if isinstance(ev, dict) and isinstance(ev.get("timestamp"), (int, float)):
                    newest = max(newest, float(ev["timestamp"]))
    return newest


def replay(fluxpipe, rules, cluster, path):
    out = run_ok(
        [fluxpipe, "replay", "--format", "json", "--cluster", cluster, "--config", rules, path]
    )
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def alert_key(cluster, alert):
    labels = alert.get("labels") or {}
    about = labels.get("jobid") or labels.get("node") or ""
    return (cluster, alert.get("alertname", ""), about)


def expected_from(cluster, records):
    """What replay says the run must hold at the end for one cluster."""
    jobs = collections.Counter(r["state"] for r in records if r["kind"] == "job")
    ranks = {r["rank"]: r for r in records if r["kind"] == "rank"}
    firing = {}
    for a in (r for r in records if r["kind"] == "alert"):
        key = alert_key(cluster, a)
        if a["status"] == "firing":
            firing[key] = a
        else:
            firing.pop(key, None)
    return {"jobs": dict(jobs), "ranks": ranks, "firing": firing}


RULES = """
[alerts]
clock = "event"

[alerts.rules.node_drained]
kind = "node_drained"
for = "1s"
severity = "critical"

[alerts.rules.depend_too_long]
kind = "job_state"
state = "DEPEND"
for = "10s"
severity = "info"
"""


def build_workload(fluxpipe, work):
    """Two journals (cluster name -> path) and the rules file for replay."""
    rules = os.path.join(work, "rules.toml")
    with open(rules, "w") as f:
        f.write(RULES + '\n[sources.s]\ntype = "stdin"\n\n[sinks.o]\ntype = "stdout"\ninputs = ["alerts"]\n')
    alpha = os.path.join(work, "alpha.jsonl")
    # Stopped part way: jobs pending and running, drained and draining ranks.
    run_ok([fluxpipe, "generate", "--jobs", "60", "--nodes", "24", "--seed", "11",
            "--active", "--out", alpha])
    beta = os.path.join(work, "beta.jsonl")
    run_ok([fluxpipe, "generate", "--jobs", "30", "--nodes", "12", "--seed", "5", "--out", beta])
    # beta: one more drain, with a reason to escape, held long enough to
    # fire; then one more that is too new to fire (drained, not alerting).
    before = replay(fluxpipe, rules, "beta", beta)
    last = newest_timestamp(beta)
    free = [r for r in before if r["kind"] == "rank" and not r["drained"] and r["online"]]
    if len(free) < 2:
        raise SystemExit("FAIL: the generated workload left no two undrained online ranks")
    a, b = free[0], free[1]
    with open(beta, "a") as f:
        f.write(resource_line(last + 5.0, "drain", {
            "idset": str(a["rank"]), "nodelist": a["hostname"], "overwrite": 0,
            "reason": ODD_REASON}))
        f.write(resource_line(last + 10.0, "drain", {
            "idset": str(b["rank"]), "nodelist": b["hostname"], "overwrite": 0,
            "reason": "just now"}))
    # gamma: an instance that went down (the forwarder's instance-down
    # line): the page's banner names it, and only it.
    gamma = os.path.join(work, "gamma.jsonl")
    with open(gamma, "w") as f:
        f.write(resource_line(last, "restart",
                              {"ranks": "0-3", "online": "", "nodelist": "g[0-3]"}))
        # Its R gives ranks 2-3 the instance-local property of the gpu
        # queue, and the forwarder's queue-config line the queues.
        f.write(json.dumps({
            "events": [{"timestamp": last + 0.5, "name": "resource-define",
                        "context": {"method": "configuration"}}],
            "R": {"version": 1, "execution": {
                "R_lite": [{"rank": "0-3", "children": {"core": "0-1"}}],
                "nodelist": ["g[0-3]"], "properties": {"+gpu": "2-3"}}}}) + "\n")
        f.write(resource_line(last + 0.6, "queue-config", {"queues": {
            "all": {}, "gpu": {"requires": ["+gpu"]}, "quick": {"parent": "all"}}}))
        f.write(resource_line(last + 1.0, "online", {"idset": "0-3"}))
        f.write(resource_line(last + 2.0, "drain", {
            "idset": "1", "nodelist": "g1", "overwrite": 0, "reason": "fan"}))
        f.write(resource_line(last + 60.0, "instance-down",
                              {"reason": "the forwarder lost the instance"}))
    return {"alpha": alpha, "beta": beta, "gamma": gamma}, rules, a["rank"], b["rank"]


# ---------------------------------------------------------------- fluxpipe run


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(work, name, port, journals, token_file=None):
    path = os.path.join(work, f"{name}.toml")
    lines = [f"data_dir = {json.dumps(os.path.join(work, name + '-state'))}", "workers = 2", RULES]
    for cluster, journal in journals.items():
        lines += [f"[sources.{cluster}]", 'type = "file"', f"include = [{json.dumps(journal)}]",
                  f'cluster = "{cluster}"', "poll_interval_ms = 100", ""]
    lines += ["[api]", f'address = "127.0.0.1:{port}"']
    if token_file:
        lines.append(f"token_file = {json.dumps(token_file)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def start_run(fluxpipe, config, work, name):
    log = open(os.path.join(work, f"{name}.stderr"), "w")
    proc = subprocess.Popen([fluxpipe, "run", "--config", config],
                            stdout=subprocess.DEVNULL, stderr=log)
    proc.log_path = log.name
    return proc


def stop_run(proc, report, name):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            report.fail(f"{name}: fluxpipe run did not stop within 20 s of SIGTERM (killed)")
            return
    rc = proc.returncode
    tail = ""
    if rc != 0:
        with open(proc.log_path) as f:
            tail = f.read()[-2000:]
    report.check(rc == 0, f"{name}: fluxpipe run exits 0 on SIGTERM", f"exit {rc}\n{tail}")


def http_get(port, path, headers=None, timeout=10):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, ConnectionError, OSError):
        return None, {}, ""


def get_json(port, path, headers=None):
    status, _, body = http_get(port, path, headers)
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def pending_running(jobs):
    pending = sum(jobs.get(s, 0) for s in ("NEW", "DEPEND", "PRIORITY", "SCHED"))
    running = sum(jobs.get(s, 0) for s in ("RUN", "CLEANUP"))
    return pending, running


def api_state(port):
    """(clusters by name, nodes, firing alert keys) or None."""
    clusters = get_json(port, "/api/v1/clusters")
    nodes = get_json(port, "/api/v1/nodes")
    alerts = get_json(port, "/api/v1/alerts?limit=10000")
    if clusters is None or nodes is None or alerts is None:
        return None
    return (
        {c["cluster"]: c for c in clusters["clusters"]},
        nodes["nodes"],
        alerts["alerts"],
    )


def api_matches(state, expected):
    """What differs between the API's answers and replay's (empty: none)."""
    clusters, nodes, alerts = state
    diffs = []
    for name, want in expected.items():
        got = clusters.get(name, {}).get("jobs", {})
        if got != want["jobs"]:
            diffs.append(f"{name}: jobs {got} != replay {want['jobs']}")
        got_nodes = {n["rank"]: n for n in nodes if n["cluster"] == name}
        if sorted(got_nodes) != sorted(want["ranks"]):
            diffs.append(f"{name}: ranks {sorted(got_nodes)} != replay {sorted(want['ranks'])}")
            continue
        for rank, r in want["ranks"].items():
            n = got_nodes[rank]
            for k in ("hostname", "online", "drained", "draining", "drain_reason"):
                if n.get(k) != r.get(k):
                    diffs.append(f"{name}: rank {rank} {k} {n.get(k)!r} != replay {r.get(k)!r}")
    got_alerts = {alert_key(a.get("cluster", ""), a) for a in alerts}
    want_alerts = set().union(*(set(w["firing"]) for w in expected.values()))
    if got_alerts != want_alerts:
        diffs.append(f"alerts: only in the API {sorted(got_alerts - want_alerts)}, "
                     f"only in replay {sorted(want_alerts - got_alerts)}")
    return diffs


def wait_for_replayed(port, proc, expected, secs=30):
    """Until the API holds every job (then everything) replay found."""
    deadline = time.monotonic() + secs
    total = {name: sum(w["jobs"].values()) for name, w in expected.items()}
    diffs = ["no answer yet"]
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return [f"fluxpipe run exited early ({proc.returncode})"]
        state = api_state(port)
        if state is not None:
            clusters = state[0]
            held = {n: sum(clusters.get(n, {}).get("jobs", {}).values()) for n in total}
            if held == total:
                diffs = api_matches(state, expected)
                if not diffs:
                    return []
            else:
                diffs = [f"jobs held {held}, replay has {total}"]
        time.sleep(0.2)
    return diffs


# ---------------------------------------------------------------- the DOM


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
        "source", "track", "wbr"}


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    @property
    def classes(self):
        return (self.attrs.get("class") or "").split()

    def text(self):
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self):
        for c in self.children:
            if isinstance(c, Node):
                yield c
                yield from c.walk()

    def find_all(self, tag=None, cls=None):
        return [n for n in self.walk()
                if (tag is None or n.tag == tag) and (cls is None or cls in n.classes)]


class TreeBuilder(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", [], None)
        self.at = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.at)
        self.at.children.append(node)
        if tag not in VOID:
            self.at = node

    def handle_startendtag(self, tag, attrs):
        self.at.children.append(Node(tag, attrs, self.at))

    def handle_endtag(self, tag):
        n = self.at
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.at = n.parent

    def handle_data(self, data):
        self.at.children.append(data)


def parse(text):
    b = TreeBuilder()
    b.feed(text)
    b.close()
    return b.root


SEVERITY_ORDER = ["critical", "error", "warning", "info"]


def node_counts(port):
    """{cluster: {count: n}} as /metrics says (flux_nodes_online, ...)."""
    _, _, text = http_get(port, "/metrics")
    names = {"flux_nodes_online": "online", "flux_nodes_offline": "offline",
             "flux_nodes_liveness_unknown": "unknown", "flux_nodes_drained": "drained",
             "flux_nodes_draining": "draining", "flux_nodes_torpid": "torpid"}
    out = collections.defaultdict(dict)
    for line in text.splitlines():
        m = re.match(r'^(flux_nodes_\w+)\{flux_cluster="([^"]*)"\} (\S+)$', line)
        if m and m.group(1) in names:
            out[m.group(2)][names[m.group(1)]] = int(float(m.group(3)))
    return dict(out)


def check_dom(dom_text, expected, api, report, where, counts=None):
    """The required checks on the page, and the advisory ones."""
    clusters, _, alerts = api
    root = parse(dom_text)
    # The banner of an instance that is down: at the top, for it alone.
    banners = [n.attrs.get("id", "") for n in root.find_all("div", "banner")]
    want_down = sorted(f"down-{c}" for c in expected if c == "gamma")
    report.check(sorted(banners) == want_down,
                 f"{where}: a banner for each instance that is down ({want_down})",
                 f"banners {banners}")
    title = "".join(n.text() for n in root.find_all("title"))
    report.check(title.strip() == f"fluxpipe: {len(expected)} clusters",
                 f"{where}: title names {len(expected)} clusters", repr(title))
    sections = {n.attrs.get("id"): n for n in root.find_all("section", "cluster")}
    for name, want in expected.items():
        sec = sections.get(f"cluster-{name}")
        if not report.check(sec is not None, f"{where}: a section for cluster {name}",
                            f"sections {sorted(k for k in sections if k)}"):
            continue
        cells = {}
        for grid in sec.find_all("div", "grid"):
            for cell in grid.find_all("span", "n"):
                cells[int(cell.attrs.get("data-rank", "-1"))] = cell
        report.check(sorted(cells) == sorted(want["ranks"]),
                     f"{where}: {name}: one grid cell per rank ({len(want['ranks'])})",
                     f"cells for ranks {sorted(cells)}")
        drained = [r for r in want["ranks"].values() if r["drained"]]
        bad = []
        for r in drained:
            cell = cells.get(r["rank"])
            tip = cell.attrs.get("title", "") if cell else ""
            reason = r.get("drain_reason") or ""
            cls = [c for c in (cell.classes if cell else []) if c != "n"]
            if (cell is None or r["hostname"] not in tip or reason not in tip
                    or "drain" not in tip
                    or not set(cls) & {"drained", "draining", "offline"}):
                bad.append(f"rank {r['rank']} ({r['hostname']}, {reason!r}): "
                           f"class {cls} title {tip!r}")
        report.check(drained and not bad,
                     f"{where}: {name}: {len(drained)} drained ranks shown with host and reason",
                     "; ".join(bad) or "none drained")
        wrong = [f"rank {r['rank']} {cells[r['rank']].classes}"
                 for r in want["ranks"].values()
                 if not r["drained"] and r["rank"] in cells
                 and set(cells[r["rank"]].classes) & {"drained", "draining"}]
        report.check(not wrong, f"{where}: {name}: no undrained rank shown drained",
                     "; ".join(wrong))

        # Pending and running, as /api/v1/clusters has them.
        pending, running = pending_running(clusters[name]["jobs"])
        shown_p = [b.text().strip() for b in sec.find_all("b", "pending")]
        shown_r = [b.text().strip() for b in sec.find_all("b", "running")]
        report.check(shown_p == [str(pending)] and shown_r == [str(running)],
                     f"{where}: {name}: pending {pending}, running {running} as the API says",
                     f"page pending {shown_p} running {shown_r}")

        # The alerts: each of the API's in a row under its rule's group,
        # and no other row; groups the most severe first, with counts.
        mine = [a for a in alerts if a.get("cluster") == name]
        rows, groups, group = [], [], None
        for tr in sec.find_all("tr"):
            if "group" in tr.classes:
                group = tr.attrs.get("data-rule", "")
                sev = next((sp.text().strip() for sp in tr.find_all("span")
                            if "sev" in sp.classes), "")
                count = next((sp.text().strip() for sp in tr.find_all("span")
                              if "count" in sp.classes), "")
                groups.append((group, sev, count))
            elif "alert" in tr.classes:
                tds = [td.text().strip() for td in tr.find_all("td")]
                rows.append((tr.attrs.get("data-about", ""), group, tds))
        missing = []
        for a in mine:
            _, alertname, about = alert_key(name, a)
            summary = a.get("annotations", {}).get("summary", "")
            # A row: when it began, then "SUMMARY (REASON)", under its rule.
            if not any(len(t) == 2 and whom == about and rule == alertname
                       and summary in t[1] for whom, rule, t in rows):
                missing.append(f"{alertname} {about}")
        report.check(not missing and len(rows) == len(mine),
                     f"{where}: {name}: the {len(mine)} firing alerts are the table's rows",
                     f"missing {missing}, {len(rows)} rows for {len(mine)} alerts")
        if not mine:
            report.check("Nothing firing." in sec.text(),
                         f"{where}: {name}: says nothing fires", sec.text()[:300])
        per_rule = collections.Counter(a.get("alertname", "") for a in mine)
        report.check(sorted((g, c) for g, _, c in groups)
                     == sorted((r, f"({n})") for r, n in per_rule.items()),
                     f"{where}: {name}: one group per rule, with its count",
                     f"groups {groups}, alerts per rule {dict(per_rule)}")
        ranks = [SEVERITY_ORDER.index(sv) if sv in SEVERITY_ORDER else len(SEVERITY_ORDER)
                 for _, sv, _ in groups]
        report.check(ranks == sorted(ranks), f"{where}: {name}: the most severe rules first",
                     f"{groups}")

        # The key's counts are /metrics' (a node may count under two).
        key = {}
        for k in sec.find_all("div", "key"):
            for sp in k.find_all("span"):
                what = sp.attrs.get("data-count")
                words = sp.text().split()
                if what and words and words[-1].isdigit():
                    key[what] = int(words[-1])
        if counts is not None:
            want = {k: v for k, v in counts.get(name, {}).items() if k in key or v}
            report.check(key == want, f"{where}: {name}: the key's counts are /metrics'",
                         f"key {key}, /metrics {counts.get(name)}")
        # Queues by property (gamma's queue-config and R): each queue that
        # is not virtual, its virtual queue beside its parent.
        queues = {d.attrs.get("data-queue"): " ".join(d.text().split())
                  for d in sec.find_all("div", "queue")}
        if name == "gamma":
            report.check(sorted(queues) == ["all", "gpu"]
                         and queues["all"].startswith("queue all (and quick): 4 nodes")
                         and queues["gpu"].startswith("queue gpu: 2 nodes"),
                         f"{where}: gamma: its queues and their nodes", f"{queues}")
        else:
            report.check(not queues, f"{where}: {name}: no queues (no table sent)", f"{queues}")
    # Advisory: the pipeline figures are plain numbers.
    health = root.find_all("section")
    figs = [b.text().strip() for s in health if s.attrs.get("id") == "health"
            for b in s.find_all("b")]
    neg = [f for f in figs if f.startswith("-")]
    if neg:
        report.warn(f"{where}: pipeline figures shown negative (negative zero?): {figs}")
    else:
        report.ok(f"{where}: pipeline figures are non-negative")
    return root


# ---------------------------------------------------------------- the PNG


def png_info(path):
    """(width, height, Counter of RGB pixels or None if not decodable here)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("no PNG signature")
    pos, idat, ihdr = 8, [], None
    while pos + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if ihdr is None:
        raise ValueError("no IHDR")
    w, h, depth, ctype, _, _, interlace = ihdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        return w, h, None
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = w * bpp
    prev = bytearray(stride)
    pixels = collections.Counter()
    i = 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        if f == 1:
            for x in range(bpp, stride):
                line[x] = (line[x] + line[x - bpp]) & 255
        elif f == 2:
            for x in range(stride):
                line[x] = (line[x] + prev[x]) & 255
        elif f == 3:
            for x in range(stride):
                left = line[x - bpp] if x >= bpp else 0
                line[x] = (line[x] + ((left + prev[x]) >> 1)) & 255
        elif f == 4:
            for x in range(stride):
                a = line[x - bpp] if x >= bpp else 0
                b = prev[x]
                c = prev[x - bpp] if x >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pr) & 255
        pixels.update(bytes(line[x:x + 3]) for x in range(0, stride, bpp))
        prev = line
    return w, h, pixels


def check_png(path, first_cells, report):
    size = os.path.getsize(path) if os.path.exists(path) else 0
    if not report.check(size > 5000, "screenshot: a PNG file of more than 5 KB", f"{size} bytes"):
        return
    try:
        w, h, pixels = png_info(path)
    except (ValueError, zlib.error, struct.error) as e:
        report.fail(f"screenshot: not a PNG: {e}")
        return
    report.ok("screenshot: PNG signature and header")
    report.check((w, h) == PHONE or (w * PHONE[1] == h * PHONE[0]),
                 f"screenshot: the phone's size {PHONE[0]}x{PHONE[1]}", f"{w}x{h}")
    if pixels is None:
        report.ok("screenshot: (PNG form not decoded here; colours not checked)")
        return
    report.check(len(pixels) > 20, "screenshot: not a blank image", f"{len(pixels)} colours")
    # Each 14x14 cell (and the key's swatch) paints ~190 pixels of its
    # colour; the first cluster's grid is above the fold on a phone.
    scale = (w / PHONE[0]) ** 2
    short = {}
    for cls, n in collections.Counter(first_cells).items():
        if cls not in COLOURS:
            continue
        want = int(150 * (n + 1) * scale)
        got = pixels.get(bytes(COLOURS[cls]), 0)
        if got < want:
            short[cls] = (got, want)
    report.check(not short, "screenshot: the first cluster's grid cells are painted in their colours",
                 f"(class: (pixels, at least)) {short}")


# ---------------------------------------------------------------- Chromium


def chromium_cmd(profile, *extra):
    return ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra]


def chromium(work, args, timeout=60):
    profile = tempfile.mkdtemp(prefix="profile-", dir=work)
    return subprocess.run(chromium_cmd(profile, *args), capture_output=True, text=True,
                          timeout=timeout)


class WebDriver:
    """Just enough of the WebDriver protocol, over urllib."""

    def __init__(self, work):
        self.port = free_port()
        self.log = open(os.path.join(work, "chromedriver.log"), "w")
        self.proc = subprocess.Popen(["chromedriver", f"--port={self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.session = None
        deadline = time.monotonic() + 15
        while True:
            try:
                if self.call("GET", "/status")[1]["value"].get("ready"):
                    break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.1)
        profile = tempfile.mkdtemp(prefix="profile-", dir=work)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": CHROMIUM_FLAGS + [f"--user-data-dir={profile}",
                                          f"--window-size={PHONE[0]},{PHONE[1]}"],
                # A phone's screen: headless windows are at least 500 px wide.
                "mobileEmulation": {"deviceMetrics": {
                    "width": PHONE[0], "height": PHONE[1], "pixelRatio": 1,
                    "mobile": True, "touch": True}},
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}}
        status, answer = self.call("POST", "/session", caps)
        if status != 200:
            self.close()
            raise RuntimeError(f"no session: {answer}")
        self.session = answer["value"]["sessionId"]

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def s(self, method, path, body=None):
        return self.call(method, f"/session/{self.session}{path}", body)

    def close(self):
        if self.session:
            try:
                self.s("DELETE", "")
            except OSError:
                pass
            self.session = None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def console_via_webdriver(url, work, report):
    """The browser log's entries, and the page's width; None without WebDriver."""
    if not shutil.which("chromedriver"):
        return None
    try:
        wd = WebDriver(work)
    except RuntimeError as e:
        print(f"  note  chromedriver unusable ({e})")
        return None
    try:
        status, answer = wd.s("POST", "/url", {"url": url})
        if status != 200:
            report.fail(f"webdriver: navigating to {url}: {answer}")
        # Each read takes what was logged since the one before; what the
        # browser fetches after the load (the favicon) comes some 0.5 s
        # later, so read for a while.
        path, entries = "/se/log", []
        until = time.monotonic() + CONSOLE_SETTLE_SECS
        while True:
            status, answer = wd.s("POST", path, {"type": "browser"})
            if status != 200 and path == "/se/log":
                print(f"  note  chromedriver has no /se/log ({status}); trying /log")
                path = "/log"
                continue
            if status != 200:
                return None
            entries += answer["value"]
            if time.monotonic() > until:
                break
            time.sleep(0.25)
        status, size = wd.s("POST", "/execute/sync", {
            "script": "return [document.documentElement.scrollWidth, window.innerWidth,"
                      " document.querySelectorAll('.grid .n').length]",
            "args": []})
        if status == 200:
            scroll, inner, cells = size["value"]
            report.check(scroll <= inner,
                         f"phone: the page fits the {inner}px-wide screen (no sideways scroll)",
                         f"scrollWidth {scroll}")
        return entries
    finally:
        wd.close()


def console_via_stderr(url, work):
    """Chromium logs every console message as `INFO:CONSOLE` whatever its
    level, and not the failed loads (a 404) the WebDriver log has: the page
    has no script, so any console line at all counts as an error here."""
    p = chromium(work, ["--enable-logging=stderr", "--v=0", "--dump-dom", url])
    return [{"level": "SEVERE", "message": line}
            for line in p.stderr.splitlines() if ":CONSOLE" in line]


def browser_checks(args, port, work, expected, report):
    url = f"http://127.0.0.1:{port}/"
    api = api_state(port)
    if api is None:
        report.fail("the API stopped answering before the browser checks")
        return

    p = chromium(work, ["--dump-dom", url])
    dom = p.stdout
    with open(os.path.join(work, "dom.html"), "w") as f:
        f.write(dom)
    if not report.check(p.returncode == 0 and "</html>" in dom,
                        "chromium --dump-dom renders /", f"exit {p.returncode}: {p.stderr[-500:]}"):
        return
    root = check_dom(dom, expected, api, report, "dom", counts=node_counts(port))
    # The pages the front page links to: a job's, and a cluster's alerts.
    links = [a.attrs.get("href", "") for a in root.find_all("a", "job")]
    if report.check(bool(links), "dom: job ids are links", "no a.job"):
        status, _, body = http_get(port, links[0])
        f58 = urllib.parse.unquote(links[0].split("/jobs/", 1)[1].split("?", 1)[0])
        report.check(status == 200 and f58 in body and "state" in body,
                     f"{links[0]}: the job's page", f"{status}: {body[:300]}")
    _, _, alerts = api
    for name in expected:
        status, _, body = http_get(port, f"/alerts?cluster={name}")
        mine = [a for a in alerts if a.get("cluster") == name]
        absent = [a["alertname"] for a in mine
                  if html.escape(a.get("annotations", {}).get("summary", ""), quote=False)
                  not in body]
        report.check(status == 200 and not absent,
                     f"/alerts?cluster={name}: every firing alert ({len(mine)})",
                     f"{status}: missing {absent}")
    first = sorted(expected)[0]
    first_cells = [c for sec in root.find_all("section", "cluster")
                   if sec.attrs.get("id") == f"cluster-{first}"
                   for cell in sec.find_all("span", "n") if cell.attrs.get("data-rank")
                   for c in cell.classes if c != "n"]

    shot = os.path.join(work, "status-page.png")
    p = chromium(work, [f"--screenshot={shot}", f"--window-size={PHONE[0]},{PHONE[1]}", url])
    report.check(p.returncode == 0, "chromium --screenshot at a phone's size",
                 f"exit {p.returncode}: {p.stderr[-500:]}")
    check_png(shot, first_cells, report)

    how = "chromedriver (WebDriver browser log)"
    entries = None if args.console == "stderr" else console_via_webdriver(url, work, report)
    if entries is None:
        how = "chromium --enable-logging=stderr CONSOLE lines (fallback: no failed loads)"
        entries = console_via_stderr(url, work)
    print(f"  info  console errors read with {how}")
    severe = [e for e in entries if e.get("level") == "SEVERE"]
    known = [e for e in severe if any(k in e.get("message", "") for k in args.known_console_error)]
    for e in known:
        report.warn(f"console: known error tolerated: {e.get('message')}")
    severe = [e for e in severe if e not in known]
    report.check(not severe, f"console: no errors ({how})",
                 "; ".join(e.get("message", "") for e in severe))

    if args.artifacts:
        os.makedirs(args.artifacts, exist_ok=True)
        for name in ("status-page.png", "dom.html"):
            if os.path.exists(os.path.join(work, name)):
                shutil.copy(os.path.join(work, name), args.artifacts)
        print(f"  info  screenshot and DOM copied to {args.artifacts}")


# ---------------------------------------------------------------- the token


def auth_checks(port, report):
    bearer = {"Authorization": f"Bearer {SECRET}"}
    basic = {"Authorization": "Basic " + base64.b64encode(f"me:{SECRET}".encode()).decode()}
    status, headers, _ = http_get(port, "/")
    report.check(status == 401, "token: / without the secret is 401", f"{status}")
    www = {k.lower(): v for k, v in headers.items()}.get("www-authenticate", "")
    report.check(www.lower().startswith("basic"), "token: the 401 asks a browser for Basic",
                 repr(www))
    status, _, _ = http_get(port, "/", {"Authorization": "Bearer wrong"})
    report.check(status == 401, "token: / with a wrong secret is 401", f"{status}")
    status, _, body = http_get(port, "/", bearer)
    report.check(status == 200 and "<title>fluxpipe" in body,
                 "token: / with Authorization: Bearer SECRET is 200 and the page", f"{status}")
    status, _, body = http_get(port, "/", basic)
    report.check(status == 200 and "<title>fluxpipe" in body,
                 "token: / with Basic (any user, the secret) is 200", f"{status}")
    status, _, _ = http_get(port, "/api/v1/clusters")
    report.check(status == 401, "token: /api/v1/clusters without the secret is 401", f"{status}")
    status, _, _ = http_get(port, "/metrics")
    report.check(status == 200, "token: /metrics stays open", f"{status}")


def wait_answering(port, proc, headers, secs=20):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline and proc.poll() is None:
        if http_get(port, "/healthz", headers, timeout=2)[0] == 200:
            return True
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fluxpipe", required=True, help="the fluxpipe binary")
    ap.add_argument("--artifacts", help="copy the screenshot and the DOM here")
    ap.add_argument("--console", choices=["auto", "stderr"], default="auto",
                    help="how console errors are read (auto: chromedriver, else stderr)")
    ap.add_argument("--known-console-error", action="append", default=[], metavar="TEXT",
                    help="tolerate console errors containing TEXT (warned, not failed)")
    ap.add_argument("--strict", action="store_true",
                    help="fail on the advisory checks too (the key's counts, negative figures)")
    args = ap.parse_args()
    fluxpipe = os.path.abspath(args.fluxpipe)
    if not os.access(fluxpipe, os.X_OK):
        print(f"FAIL: status page: {fluxpipe} is not an executable")
        return 1
    have_browser = shutil.which("chromium") is not None
    require = bool(os.environ.get("FLUXPIPE_REQUIRE_BROWSER"))
    report = Report(args.strict)
    started = time.monotonic()
    runs = []
    with tempfile.TemporaryDirectory(prefix="status-page-") as work:
        try:
            print("status page: building the workload", flush=True)
            journals, rules, odd_rank, new_rank = build_workload(fluxpipe, work)
            expected = {c: expected_from(c, replay(fluxpipe, rules, c, path))
                        for c, path in journals.items()}
            for name, want in expected.items():
                drained = [r for r in want["ranks"].values() if r["drained"]]
                pending, running = pending_running(want["jobs"])
                print(f"  info  {name}: {sum(want['jobs'].values())} jobs ({pending} pending, "
                      f"{running} running), {len(want['ranks'])} ranks, {len(drained)} drained, "
                      f"{len(want['firing'])} alerts firing")
                report.check(drained and all(r.get("drain_reason") for r in drained),
                             f"workload: {name} has drained ranks, each with a reason")
                report.check(0 < len(want["firing"]) <= ALERTS_SHOWN,
                             f"workload: {name} has 1..{ALERTS_SHOWN} alerts firing",
                             f"{len(want['firing'])}")
            beta = expected["beta"]
            report.check(beta["ranks"][odd_rank].get("drain_reason") == ODD_REASON
                         and ("beta", "node_drained", beta["ranks"][odd_rank]["hostname"])
                         in beta["firing"],
                         "workload: the drain with an odd reason fires")
            report.check(beta["ranks"][new_rank]["drained"]
                         and ("beta", "node_drained", beta["ranks"][new_rank]["hostname"])
                         not in beta["firing"],
                         "workload: the newest drain is too recent to fire")
            alpha = expected["alpha"]
            p, r = pending_running(alpha["jobs"])
            report.check(p > 0 and r > 0, "workload: alpha has jobs pending and running")

            print("status page: fluxpipe run", flush=True)
            port, tport = free_port(), free_port()
            token_file = os.path.join(work, "token")
            with open(token_file, "w") as f:
                f.write(SECRET + "\n")
            open_run = start_run(fluxpipe, write_config(work, "open", port, journals), work, "open")
            runs.append(("open", open_run))
            guarded = start_run(fluxpipe, write_config(work, "guarded", tport, journals,
                                                       token_file), work, "guarded")
            runs.append(("guarded", guarded))
            diffs = wait_for_replayed(port, open_run, expected)
            report.check(not diffs, "api: /api/v1/{clusters,nodes,alerts} hold what replay found",
                         "; ".join(diffs))

            print("status page: in the browser", flush=True)
            if not diffs and have_browser:
                browser_checks(args, port, work, expected, report)
            elif not have_browser:
                # Still check the page as served, without a browser.
                status, _, body = http_get(port, "/")
                if report.check(status == 200, "/ answers 200", f"{status}"):
                    api = api_state(port)
                    if api is not None:
                        check_dom(body, expected, api, report, "html (no browser)",
                                  counts=node_counts(port))
                print("  SKIP  browser checks: chromium is not installed "
                      "(apt-get install -y --no-install-recommends chromium chromium-driver)")

            print("status page: token_file", flush=True)
            if report.check(wait_answering(tport, guarded, {}), "token: the guarded run answers"):
                auth_checks(tport, report)
        except (subprocess.TimeoutExpired, OSError, KeyError, ValueError) as e:
            report.fail(f"error: {type(e).__name__}: {e}")
        finally:
            print("status page: SIGTERM", flush=True)
            for name, proc in runs:
                stop_run(proc, report, name)
            if report.failures:
                for name, proc in runs:
                    with open(proc.log_path) as f:
                        tail = f.read()[-1500:]
                    if tail.strip():
                        print(f"--- {name}: fluxpipe run stderr (end)\n{tail}")

    took = time.monotonic() - started
    extra = f", {len(report.warnings)} warnings" if report.warnings else ""
    if report.failures:
        print(f"FAIL: status page: {len(report.failures)} checks failed{extra} ({took:.1f} s)")
        for f in report.failures:
            print(f"  - {f}")
        return 1
    if not have_browser:
        print(f"SKIPPED: status page browser test: chromium is not installed "
              f"(other checks passed{extra}, {took:.1f} s)")
        return 1 if require else 0
    print(f"PASS: status page{extra} ({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
