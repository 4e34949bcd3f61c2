//! Synthetic Flux traffic for benchmarks and tests, deterministic by seed.
//!
//! [`Workload`] yields the events of N jobs and of the resource eventlog of
//! M nodes in time order, as a live instance would journal them. Each job
//! follows one path through the RFC 21 state machine with the mix seen on
//! real systems: most complete, about 10% fail (nonzero finish status),
//! some are canceled (pending or running), some time out, some are held
//! (submitted with urgency 0 and released later), some wait on a
//! dependency, a few go through a `flux-restart`; about half run a prolog
//! and an epilog. Running jobs have an exec eventlog with shell events.
//! With `active`, jobs stop part way (DEPEND, SCHED held or not, RUN) and
//! never finish: for memory measurements.
//!
//! Everything here is pure: the same [`Spec`] gives the same events. The
//! writers turn them into journal JSON Lines or a KVS dump tree.

use crate::flux::jobid::JobId;
use serde::Serialize;
use serde_json::{Value, json};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A small seeded generator (SplitMix64): the same sequence on every
/// platform and version, which a library RNG does not promise.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Microseconds, uniform between `lo` and `hi` seconds (at least 1).
    pub fn gap(&mut self, lo: f64, hi: f64) -> u64 {
        (((lo + (hi - lo) * self.unit()) * 1e6) as u64).max(1)
    }
}

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub seed: u64,
    pub jobs: u64,
    pub nodes: u32,
    /// Jobs stop part way and never finish.
    pub active: bool,
    /// Seconds since the epoch of the first event.
    pub start: u64,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            seed: 1,
            jobs: 1000,
            nodes: 16,
            active: false,
            start: DEFAULT_START,
        }
    }
}

/// The default first timestamp (November 2026), so output depends only on
/// the seed and the sizes.
pub const DEFAULT_START: u64 = 1_795_000_000;

/// Mean time between two submits, in microseconds.
const SUBMIT_GAP_US: u64 = 20_000;

/// Which eventlog an event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Job,
    Exec,
    Resource,
}

/// One generated event.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub kind: Kind,
    /// The job (job and exec events).
    pub id: Option<u64>,
    /// Microseconds since the epoch; strictly increasing within a job and
    /// within the resource eventlog.
    pub time_us: u64,
    pub name: &'static str,
    pub context: Option<Value>,
    /// The job's R, beside its `alloc`.
    pub r: Option<Value>,
    /// The job's jobspec, beside its `submit` (as the journal carries it).
    pub jobspec: Option<Value>,
    /// The event moves the job to another state.
    pub transition: bool,
    /// The job's last event.
    pub last: bool,
}

#[derive(Serialize)]
struct EventOut<'a> {
    timestamp: f64,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<&'a Value>,
}

impl Item {
    pub fn timestamp(&self) -> f64 {
        self.time_us as f64 / 1e6
    }

    fn event(&self) -> EventOut<'_> {
        EventOut {
            timestamp: self.timestamp(),
            name: self.name,
            context: self.context.as_ref(),
        }
    }

    /// The RFC 18 eventlog line, without its newline.
    pub fn eventlog_line(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        serde_json::to_writer(out, &self.event())
    }

    /// The line a live feed carries, without its newline: a job-manager
    /// journal message (with R beside `alloc`), a resource journal
    /// message, or an envelope for exec events.
    pub fn journal_line(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        #[derive(Serialize)]
        struct JobMsg<'a> {
            id: u64,
            events: [EventOut<'a>; 1],
            #[serde(rename = "R", skip_serializing_if = "Option::is_none")]
            r: Option<&'a Value>,
            #[serde(skip_serializing_if = "Option::is_none")]
            jobspec: Option<&'a Value>,
        }
        #[derive(Serialize)]
        struct ResourceMsg<'a> {
            events: [EventOut<'a>; 1],
        }
        #[derive(Serialize)]
        struct Envelope<'a> {
            stream: &'a str,
            id: u64,
            event: EventOut<'a>,
        }
        let id = self.id.unwrap_or(0);
        match self.kind {
            Kind::Job => serde_json::to_writer(
                out,
                &JobMsg {
                    id,
                    events: [self.event()],
                    r: self.r.as_ref(),
                    jobspec: self.jobspec.as_ref(),
                },
            ),
            Kind::Resource => serde_json::to_writer(
                out,
                &ResourceMsg {
                    events: [self.event()],
                },
            ),
            Kind::Exec => serde_json::to_writer(
                out,
                &Envelope {
                    stream: "exec",
                    id,
                    event: self.event(),
                },
            ),
        }
    }
}

/// What the stream yields: events, and the journals' end-of-backlog
/// sentinels.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Event(Item),
    /// `{"id":-1,"events":[]}` (job) or `{"events":[]}` (resource).
    Sentinel(Kind),
}

impl Entry {
    /// The journal line of this entry, without its newline.
    pub fn journal_line(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        match self {
            Entry::Event(item) => item.journal_line(out),
            Entry::Sentinel(Kind::Resource) => {
                out.extend_from_slice(br#"{"events":[]}"#);
                Ok(())
            }
            Entry::Sentinel(_) => {
                out.extend_from_slice(br#"{"id":-1,"events":[]}"#);
                Ok(())
            }
        }
    }
}

/// How a finished job ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Completed,
    Failed,
    CanceledPending,
    CanceledRunning,
    Timeout,
}

/// Where an active job stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Never,
    Depend,
    Sched,
    Run,
}

/// A job's events, built in order.
struct Plan {
    id: u64,
    t: u64,
    items: VecDeque<Item>,
}

impl Plan {
    fn push(&mut self, kind: Kind, gap: u64, name: &'static str, ctx: Option<Value>, moves: bool) {
        self.t += gap.max(1);
        self.items.push_back(Item {
            kind,
            id: Some(self.id),
            time_us: self.t,
            name,
            context: ctx,
            r: None,
            jobspec: None,
            transition: moves,
            last: false,
        });
    }

    fn job(&mut self, gap: u64, name: &'static str, ctx: Option<Value>, moves: bool) {
        self.push(Kind::Job, gap, name, ctx, moves);
    }

    fn exec(&mut self, gap: u64, name: &'static str, ctx: Option<Value>) {
        self.push(Kind::Exec, gap, name, ctx, false);
    }
}

fn ranks_text(first: u32, n: u32) -> String {
    if n <= 1 {
        first.to_string()
    } else {
        format!("{first}-{}", first + n - 1)
    }
}

fn hosts_text(first: u32, n: u32) -> String {
    if n <= 1 {
        format!("node{first}")
    } else {
        format!("node[{first}-{}]", first + n - 1)
    }
}

/// A redacted jobspec as the journal carries it, its shape taken from the
/// id (the random stream, and so the rest of the workload, stays as it
/// was): a few programs, queues, task and node counts, time limits.
fn jobspec_of(id: u64) -> Value {
    const NAMES: [&str; 5] = ["lmp", "python3", "sleep", "hostname", "a.out"];
    const QUEUES: [&str; 3] = ["batch", "batch", "debug"];
    let pick = |n: u64, salt: u64| (id / 7 + salt).wrapping_mul(0x9e37_79b9) % n;
    let nodes = 1 + pick(4, 1);
    let tasks = 1 + pick(8, 2);
    json!({
        "resources": [{"type": "node", "count": nodes, "with": [
            {"type": "slot", "count": tasks, "label": "task",
             "with": [{"type": "core", "count": 1}]}]}],
        "tasks": [{"command": [format!("/usr/bin/{}", NAMES[pick(5, 3) as usize]), "-in", "in.lj"],
                   "slot": "task", "count": {"per_slot": 1}}],
        "attributes": {"system": {
            "duration": 600 * (1 + pick(6, 4)),
            "queue": QUEUES[pick(3, 5) as usize],
            "cwd": "/home/user/run",
            "shell": {"options": {"rlimit": {"cpu": -1, "nofile": 20000}}},
        }},
        "version": 1,
    })
}

/// Plan every event of one job submitted at `submit` (microseconds).
fn plan_job(rng: &mut Rng, id: u64, submit: u64, nodes: u32, active: bool) -> VecDeque<Item> {
    let mut p = Plan {
        id,
        t: submit.saturating_sub(1),
        items: VecDeque::new(),
    };
    let ms = |lo: f64, hi: f64, rng: &mut Rng| rng.gap(lo / 1e3, hi / 1e3);
    let userid = 1000 + rng.below(64);
    let stop = if active {
        match rng.below(100) {
            0..5 => Stop::Depend,
            5..70 => Stop::Sched,
            _ => Stop::Run,
        }
    } else {
        Stop::Never
    };
    let outcome = match rng.below(100) {
        0..2 => Outcome::CanceledPending,
        2..5 => Outcome::CanceledRunning,
        5..7 => Outcome::Timeout,
        7..17 => Outcome::Failed,
        _ => Outcome::Completed,
    };
    let held = rng.chance(0.03) || (stop == Stop::Sched && rng.chance(0.15));
    let dependency = rng.chance(0.05) || stop == Stop::Depend;
    let restart = rng.chance(0.01);
    let perilog = rng.chance(0.5);
    let urgency = if held { 0 } else { 16 };

    p.job(
        1,
        "submit",
        Some(json!({"userid": userid, "urgency": urgency, "flags": 0, "version": 1})),
        false,
    );
    if let Some(item) = p.items.back_mut() {
        item.jobspec = Some(jobspec_of(id));
    }
    p.job(ms(5.0, 20.0, rng), "validate", None, true);
    if dependency {
        let on = JobId(id.saturating_sub(1 + rng.below(1000) * 1024)).to_f58();
        let desc = json!({"description": format!("afterok={on}")});
        p.job(
            ms(1.0, 5.0, rng),
            "dependency-add",
            Some(desc.clone()),
            false,
        );
        if stop == Stop::Depend {
            return finish_plan(p);
        }
        p.job(rng.gap(1.0, 60.0), "dependency-remove", Some(desc), false);
    }
    p.job(ms(5.0, 20.0, rng), "depend", None, true);
    p.job(
        ms(0.1, 2.0, rng),
        "priority",
        Some(json!({"priority": urgency})),
        true,
    );
    if stop == Stop::Sched && (held || rng.chance(0.5)) {
        return finish_plan(p);
    }
    if held {
        p.job(
            rng.gap(10.0, 300.0),
            "urgency",
            Some(json!({"userid": userid, "urgency": 16})),
            true,
        );
        p.job(
            ms(0.1, 2.0, rng),
            "priority",
            Some(json!({"priority": 16})),
            true,
        );
    }
    if restart {
        p.job(rng.gap(1.0, 30.0), "flux-restart", None, true);
        p.job(
            ms(0.1, 2.0, rng),
            "priority",
            Some(json!({"priority": 16})),
            true,
        );
    }
    if stop == Stop::Sched {
        return finish_plan(p);
    }
    if outcome == Outcome::CanceledPending && stop == Stop::Never {
        p.job(
            rng.gap(1.0, 120.0),
            "exception",
            Some(json!({"type": "cancel", "severity": 0, "userid": userid, "note": ""})),
            true,
        );
        p.job(ms(1.0, 10.0, rng), "clean", None, true);
        return finish_plan(p);
    }

    // Allocation: a few contiguous nodes.
    let size = (1 + rng.below(4) as u32).min(nodes.max(1));
    let first = rng.below(u64::from(nodes.max(1) - size + 1)) as u32;
    let ranks = ranks_text(first, size);
    let runtime = rng.gap(1.0, 600.0);
    let limit = if outcome == Outcome::Timeout {
        runtime
    } else {
        3_600_000_000
    };
    p.job(
        ms(1.0, 500.0, rng),
        "alloc",
        Some(json!({"annotations": {"sched": {"resource_summary": format!("rank{ranks}/core[0-3]")}}})),
        true,
    );
    let alloc_t = p.t;
    if let Some(item) = p.items.back_mut() {
        item.r = Some(json!({
            "version": 1,
            "execution": {
                "R_lite": [{"rank": ranks, "children": {"core": "0-3"}}],
                "starttime": alloc_t as f64 / 1e6,
                "expiration": (alloc_t + limit) as f64 / 1e6,
                "nodelist": [hosts_text(first, size)],
            }
        }));
    }
    if perilog {
        let d = json!({"description": "job-manager.prolog"});
        p.job(ms(0.5, 2.0, rng), "prolog-start", Some(d), false);
        p.job(
            ms(100.0, 2000.0, rng),
            "prolog-finish",
            Some(json!({"description": "job-manager.prolog", "status": 0})),
            false,
        );
    }
    p.exec(ms(1.0, 5.0, rng), "init", None);
    p.exec(ms(1.0, 5.0, rng), "starting", None);
    p.job(ms(1.0, 5.0, rng), "start", None, false);
    let service = format!("{userid}-shell-{}", JobId(id).to_f58());
    p.exec(
        ms(5.0, 30.0, rng),
        "shell.init",
        Some(json!({"service": service, "leader-rank": first, "size": size})),
    );
    p.exec(
        ms(1.0, 5.0, rng),
        "shell.start",
        Some(json!({"taskmap": {"version": 1, "map": [[0, size, 1, 1]]}})),
    );
    if stop == Stop::Run {
        return finish_plan(p);
    }

    let status: u64 = match outcome {
        Outcome::Completed | Outcome::CanceledPending => 0,
        Outcome::Failed => 256 * (1 + rng.below(3)),
        Outcome::CanceledRunning => 15,
        Outcome::Timeout => 36352,
    };
    let mut in_cleanup = false;
    match outcome {
        Outcome::CanceledRunning => {
            p.job(
                rng.gap(1.0, 300.0),
                "exception",
                Some(json!({"type": "cancel", "severity": 0, "userid": userid, "note": ""})),
                true,
            );
            in_cleanup = true;
        }
        Outcome::Timeout => {
            p.t = p.t.max(alloc_t + limit);
            p.job(
                1,
                "exception",
                Some(json!({"type": "timeout", "severity": 0, "userid": 0, "note": "resource allocation expired"})),
                true,
            );
            in_cleanup = true;
        }
        _ => p.t += runtime,
    }
    p.exec(
        ms(1.0, 50.0, rng),
        "shell.task-exit",
        Some(json!({
            "localid": 0, "rank": first, "state": "Exited", "pid": 1000 + rng.below(60000),
            "wait_status": status, "exitcode": status >> 8,
        })),
    );
    p.exec(
        ms(1.0, 10.0, rng),
        "shell-exit",
        Some(json!({"rank": first, "wait_status": status})),
    );
    p.exec(
        ms(0.1, 1.0, rng),
        "complete",
        Some(json!({"status": status})),
    );
    p.exec(ms(0.01, 0.1, rng), "done", None);
    p.job(
        ms(0.1, 1.0, rng),
        "finish",
        Some(json!({"status": status})),
        !in_cleanup,
    );
    p.job(
        ms(1.0, 10.0, rng),
        "release",
        Some(json!({"ranks": "all", "final": true})),
        false,
    );
    if perilog {
        p.job(
            ms(0.5, 2.0, rng),
            "epilog-start",
            Some(json!({"description": "job-manager.epilog"})),
            false,
        );
        p.job(
            ms(100.0, 3000.0, rng),
            "epilog-finish",
            Some(json!({"description": "job-manager.epilog", "status": 0})),
            false,
        );
    }
    p.job(ms(0.1, 1.0, rng), "free", None, false);
    p.job(ms(0.01, 0.1, rng), "clean", None, true);
    finish_plan(p)
}

fn finish_plan(mut p: Plan) -> VecDeque<Item> {
    if let Some(last) = p.items.back_mut() {
        last.last = true;
    }
    p.items
}

/// One node as the resource generator sees it.
#[derive(Debug, Clone, Copy, Default)]
struct Node {
    online: bool,
    torpid: bool,
    drained: bool,
}

const DRAIN_REASONS: [&str; 4] = [
    "bad memory",
    "nodediag failed",
    "admin maintenance",
    "epilog failed",
];

/// The resource eventlog: a restart, every node online, then drains,
/// undrains, nodes going offline and back, torpid and lively again.
struct ResourceGen {
    rng: Rng,
    nodes: Vec<Node>,
    next_t: u64,
}

impl ResourceGen {
    fn event(&mut self) -> Item {
        let r = self.rng.below(self.nodes.len() as u64) as usize;
        let Some(node) = self.nodes.get(r).copied() else {
            return self.item("lively", json!({"idset": "0"}));
        };
        let mut choices: Vec<&'static str> = Vec::with_capacity(4);
        choices.push(if node.drained { "undrain" } else { "drain" });
        if !node.online {
            choices.push("online");
        } else {
            choices.push("offline");
            choices.push(if node.torpid { "lively" } else { "torpid" });
        }
        let name = choices[self.rng.below(choices.len() as u64) as usize];
        let n = &mut self.nodes[r];
        let ctx = match name {
            "drain" => {
                n.drained = true;
                let reason = DRAIN_REASONS[self.rng.below(DRAIN_REASONS.len() as u64) as usize];
                json!({"idset": r.to_string(), "nodelist": format!("node{r}"), "reason": reason, "overwrite": 0})
            }
            "undrain" => {
                n.drained = false;
                json!({"idset": r.to_string()})
            }
            "online" => {
                n.online = true;
                n.torpid = false;
                json!({"idset": r.to_string()})
            }
            "offline" => {
                n.online = false;
                n.torpid = false;
                json!({"idset": r.to_string()})
            }
            "torpid" => {
                n.torpid = true;
                json!({"idset": r.to_string()})
            }
            _ => {
                n.torpid = false;
                json!({"idset": r.to_string()})
            }
        };
        self.item(name, ctx)
    }

    fn item(&mut self, name: &'static str, ctx: Value) -> Item {
        let item = Item {
            kind: Kind::Resource,
            id: None,
            time_us: self.next_t,
            name,
            context: Some(ctx),
            r: None,
            jobspec: None,
            transition: false,
            last: false,
        };
        // About one resource event per 40 jobs.
        self.next_t += 1 + self.rng.below(80 * SUBMIT_GAP_US);
        item
    }
}

/// A job's remaining events, ordered by the time of the next one.
struct Pending {
    time: u64,
    seq: u64,
    items: VecDeque<Item>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    // Reversed: BinaryHeap is a max-heap and the earliest must come first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// Every event of a [`Spec`], in time order. Memory holds only the jobs in
/// flight.
pub struct Workload {
    spec: Spec,
    arrivals: Rng,
    next_job: u64,
    next_submit: u64,
    heap: BinaryHeap<Pending>,
    resource: ResourceGen,
    intro: VecDeque<Entry>,
}

impl Workload {
    pub fn new(spec: Spec) -> Self {
        let start = spec.start.saturating_mul(1_000_000);
        let nodes = spec.nodes.max(1);
        let mut resource = ResourceGen {
            rng: Rng::new(spec.seed ^ 0x7265_736f_7572_6365),
            nodes: vec![
                Node {
                    online: true,
                    ..Node::default()
                };
                nodes as usize
            ],
            next_t: start,
        };
        let all = ranks_text(0, nodes);
        let restart = resource.item(
            "restart",
            json!({"ranks": all, "online": "", "nodelist": hosts_text(0, nodes)}),
        );
        let online = resource.item("online", json!({"idset": all}));
        let intro = VecDeque::from([
            Entry::Event(restart),
            Entry::Event(online),
            Entry::Sentinel(Kind::Resource),
            Entry::Sentinel(Kind::Job),
        ]);
        let first_submit = resource.next_t + 1000;
        Workload {
            arrivals: Rng::new(spec.seed),
            spec,
            next_job: 0,
            next_submit: first_submit,
            heap: BinaryHeap::new(),
            resource,
            intro,
        }
    }

    /// A FLUID-like id: milliseconds since the first submit above a
    /// sequence number, so ids grow with submit time and never repeat.
    fn job_id(&self, index: u64, submit: u64) -> u64 {
        let ms = submit.saturating_sub(self.spec.start * 1_000_000) / 1000;
        (ms << 24) | (index & 0xff_ffff)
    }
}

impl Iterator for Workload {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        if let Some(e) = self.intro.pop_front() {
            return Some(e);
        }
        loop {
            let submitting = self.next_job < self.spec.jobs;
            let heap_t = self.heap.peek().map(|p| p.time);
            if !submitting && heap_t.is_none() {
                return None;
            }
            let first = [
                submitting.then_some(self.next_submit),
                heap_t,
                Some(self.resource.next_t),
            ]
            .into_iter()
            .flatten()
            .min()?;
            if submitting && first == self.next_submit {
                let index = self.next_job;
                let id = self.job_id(index, self.next_submit);
                // Each job draws from its own stream: a job's events depend
                // only on the seed and its index.
                let mut rng = Rng::new(self.spec.seed.wrapping_mul(0x1000_0001) ^ index);
                let items = plan_job(
                    &mut rng,
                    id,
                    self.next_submit,
                    self.spec.nodes.max(1),
                    self.spec.active,
                );
                if let Some(t) = items.front().map(|i| i.time_us) {
                    self.heap.push(Pending {
                        time: t,
                        seq: index,
                        items,
                    });
                }
                self.next_job += 1;
                self.next_submit += 1 + self.arrivals.below(2 * SUBMIT_GAP_US);
                continue;
            }
            if heap_t == Some(first) {
                let mut p = self.heap.pop()?;
                let item = p.items.pop_front()?;
                if let Some(t) = p.items.front().map(|i| i.time_us) {
                    p.time = t;
                    self.heap.push(p);
                }
                return Some(Entry::Event(item));
            }
            return Some(Entry::Event(self.resource.event()));
        }
    }
}

/// Write a workload as journal JSON Lines; returns (lines, bytes).
pub fn write_journal(spec: Spec, out: &mut impl Write) -> io::Result<(u64, u64)> {
    let mut line = Vec::with_capacity(512);
    let (mut lines, mut bytes) = (0u64, 0u64);
    for entry in Workload::new(spec) {
        line.clear();
        entry.journal_line(&mut line)?;
        line.push(b'\n');
        out.write_all(&line)?;
        lines += 1;
        bytes += line.len() as u64;
    }
    Ok((lines, bytes))
}

/// `job/xxxx/xxxx/xxxx/xxxx` under `root`, as `flux dump` lays it out.
pub fn kvs_job_dir(root: &Path, id: u64) -> PathBuf {
    root.join("job")
        .join(format!("{:04x}", id >> 48))
        .join(format!("{:04x}", (id >> 32) & 0xffff))
        .join(format!("{:04x}", (id >> 16) & 0xffff))
        .join(format!("{:04x}", id & 0xffff))
}

/// Write a workload as a KVS dump tree under `root`: each job's
/// `eventlog`, `jobspec`, `R` and `guest/exec/eventlog`, and
/// `resource/eventlog`.
/// Returns the number of events written.
pub fn write_kvs(spec: Spec, root: &Path) -> io::Result<u64> {
    #[derive(Default)]
    struct Files {
        job: Vec<u8>,
        exec: Vec<u8>,
        r: Option<Value>,
        jobspec: Option<Value>,
    }
    fn flush(root: &Path, id: u64, f: Files) -> io::Result<()> {
        let dir = kvs_job_dir(root, id);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("eventlog"), &f.job)?;
        if let Some(r) = f.r {
            std::fs::write(dir.join("R"), serde_json::to_vec(&r)?)?;
        }
        if let Some(spec) = f.jobspec {
            std::fs::write(dir.join("jobspec"), serde_json::to_vec(&spec)?)?;
        }
        if !f.exec.is_empty() {
            let exec = dir.join("guest").join("exec");
            std::fs::create_dir_all(&exec)?;
            std::fs::write(exec.join("eventlog"), &f.exec)?;
        }
        Ok(())
    }
    let resource_dir = root.join("resource");
    std::fs::create_dir_all(&resource_dir)?;
    let mut resource = io::BufWriter::new(std::fs::File::create(resource_dir.join("eventlog"))?);
    let mut open: HashMap<u64, Files> = HashMap::new();
    let mut events = 0u64;
    for entry in Workload::new(spec) {
        let Entry::Event(item) = entry else { continue };
        events += 1;
        let mut line = Vec::with_capacity(256);
        item.eventlog_line(&mut line)?;
        line.push(b'\n');
        let Some(id) = item.id else {
            resource.write_all(&line)?;
            continue;
        };
        let files = open.entry(id).or_default();
        match item.kind {
            Kind::Exec => files.exec.extend_from_slice(&line),
            _ => files.job.extend_from_slice(&line),
        }
        if item.r.is_some() {
            files.r = item.r;
        }
        if item.jobspec.is_some() {
            files.jobspec = item.jobspec;
        }
        if item.last
            && let Some(f) = open.remove(&id)
        {
            flush(root, id, f)?;
        }
    }
    for (id, f) in open {
        flush(root, id, f)?;
    }
    resource.flush()?;
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{self, Format, Origin};
    use crate::keyed::state::State;

    fn spec(jobs: u64, active: bool) -> Spec {
        Spec {
            seed: 7,
            jobs,
            nodes: 8,
            active,
            start: DEFAULT_START,
        }
    }

    fn journal(spec: Spec) -> Vec<u8> {
        let mut out = Vec::new();
        write_journal(spec, &mut out).expect("write");
        out
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let a = journal(spec(300, false));
        assert_eq!(a, journal(spec(300, false)));
        let mut other = spec(300, false);
        other.seed = 8;
        assert_ne!(a, journal(other));
    }

    #[test]
    fn timestamps_never_go_back_and_every_job_ends() {
        let mut last = 0;
        let mut ends = 0;
        let mut submits = 0;
        for e in Workload::new(spec(500, false)) {
            if let Entry::Event(i) = e {
                assert!(i.time_us >= last, "{} after {last}", i.time_us);
                last = i.time_us;
                submits += u64::from(i.name == "submit");
                ends += u64::from(i.last);
                if i.last {
                    assert_eq!(i.name, "clean");
                }
            }
        }
        assert_eq!(submits, 500);
        assert_eq!(ends, 500);
    }

    /// Through the real model: no anomaly, the planned transitions, the
    /// mix of results.
    fn replay(spec: Spec) -> (State, u64, u64) {
        let mut state = State::new();
        let mut planned = 0u64;
        let mut got = 0u64;
        for e in Workload::new(spec) {
            if let Entry::Event(i) = &e {
                planned += u64::from(i.transition);
            }
            let mut line = Vec::new();
            e.journal_line(&mut line).expect("line");
            let d = decode::decode_line(&line, &Origin::default(), Format::Auto);
            assert!(d.errors.is_empty(), "{:?}", d.errors);
            for rec in d.records {
                let fx = state.apply("c", rec);
                assert!(
                    fx.anomalies.is_empty(),
                    "{}: {:?}",
                    String::from_utf8_lossy(&line),
                    fx.anomalies
                );
                got += fx.transitions.len() as u64;
            }
        }
        (state, planned, got)
    }

    #[test]
    fn the_model_finds_no_anomaly_and_the_planned_transitions() {
        let (state, planned, got) = replay(spec(2000, false));
        assert_eq!(planned, got);
        let mut results: HashMap<String, u64> = HashMap::new();
        for job in state.jobs.values() {
            let s = serde_json::to_value(job.job.summary()).expect("summary");
            let r = s["result"].as_str().unwrap_or("none").to_string();
            *results.entry(r).or_default() += 1;
        }
        let share = |r: &str| results.get(r).copied().unwrap_or(0) as f64 / 2000.0;
        assert!((0.70..0.95).contains(&share("COMPLETED")), "{results:?}");
        assert!((0.05..0.16).contains(&share("FAILED")), "{results:?}");
        assert!(share("CANCELED") > 0.02, "{results:?}");
        assert!(share("TIMEOUT") > 0.005, "{results:?}");
    }

    #[test]
    fn active_jobs_never_finish() {
        let (state, planned, got) = replay(spec(1000, true));
        assert_eq!(planned, got);
        assert_eq!(state.jobs.len(), 1000);
        let mut states: HashMap<String, u64> = HashMap::new();
        for job in state.jobs.values() {
            *states
                .entry(job.job.state.as_str().to_string())
                .or_default() += 1;
        }
        for s in ["DEPEND", "SCHED", "RUN"] {
            assert!(states.get(s).copied().unwrap_or(0) > 20, "{states:?}");
        }
        assert!(!states.contains_key("INACTIVE"), "{states:?}");
    }

    #[test]
    fn kvs_tree_has_the_dump_layout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = write_kvs(spec(50, false), dir.path()).expect("kvs");
        assert!(n > 50 * 10);
        let first = Workload::new(spec(50, false))
            .find_map(|e| match e {
                Entry::Event(i) if i.name == "submit" => i.id,
                _ => None,
            })
            .expect("a job");
        let job = kvs_job_dir(dir.path(), first);
        for (p, want) in [
            (job.join("eventlog"), decode::EventStream::Job),
            (job.join("guest/exec/eventlog"), decode::EventStream::Exec),
            (
                dir.path().join("resource/eventlog"),
                decode::EventStream::Resource,
            ),
        ] {
            assert!(p.is_file(), "{}", p.display());
            match decode::classify_path(&p) {
                decode::PathKind::Eventlog(o) => assert_eq!(o.stream, Some(want)),
                other => panic!("{}: {other:?}", p.display()),
            }
        }
    }
}
