//! RFC 44 resource events: per-rank state as flux-core's resource module
//! keeps it (online, torpid, excluded, drained with reason and timestamp).
//!
//! Input is either the KVS `resource.eventlog` (only `resource-define`,
//! `resource-update`, `drain`, `undrain`; older logs also `resource-init`,
//! `online`, `offline`) or the `resource.journal` stream (everything, with
//! `restart` opening each life of the instance). The model applies events
//! the way flux-core replays them (src/modules/resource/drain.c), records
//! what broke a rule as an [`Anomaly`], and never stops on bad input.
//!
//! Feeds are at-least-once: a reconnecting journal resends its whole
//! backlog, and after a restart the journal first replays the drains kept in
//! the KVS. An event not newer than the newest applied one is skipped,
//! without an anomaly, when it was already applied (same timestamp and name;
//! flux timestamps are unique within one log) or when it is a volatile
//! event (online, offline, ...) of an earlier life of the instance. Any
//! other older event is applied in log order and reported as out of order.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::anomaly::{Anomaly, AnomalyKind, Stream};
use super::event::{ContextError, Event};
use super::hostlist::Hostlist;
use super::idset::IdSet;
use super::queues::QueueConfig;

/// The `method` values RFC 44 allows in `resource-define`.
const DEFINE_METHODS: [&str; 5] = [
    "configuration",
    "dynamic-discovery",
    "reload",
    "job-info",
    "kvs",
];

/// Events that flux-core persists in the KVS and may therefore replay in a
/// later life of the instance; everything else belongs to one life only.
const PERSISTENT_EVENTS: [&str; 5] = [
    "drain",
    "undrain",
    "resource-update",
    "resource-define",
    "resource-init",
];

/// What a node counts as among its cluster's nodes, as `flux resource
/// status` counts them: a node may count under several (a drained node
/// that is offline is both). The metrics and the status page count by
/// these, so their figures agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeCount {
    Online,
    Offline,
    /// Nothing said whether it is online (an instance that is down, a KVS
    /// resource eventlog read alone).
    Unknown,
    /// Drained and running no job.
    Drained,
    /// Drained and still running a job.
    Draining,
    Torpid,
}

impl NodeCount {
    pub const ALL: [NodeCount; 6] = [
        NodeCount::Online,
        NodeCount::Drained,
        NodeCount::Draining,
        NodeCount::Offline,
        NodeCount::Torpid,
        NodeCount::Unknown,
    ];

    /// Whether `rank` counts as this.
    pub fn holds(self, rank: &RankState) -> bool {
        match self {
            NodeCount::Online => rank.online == Some(true),
            NodeCount::Offline => rank.online == Some(false),
            NodeCount::Unknown => rank.online.is_none(),
            NodeCount::Drained => rank.drained && !rank.draining,
            NodeCount::Draining => rank.draining,
            NodeCount::Torpid => rank.torpid,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NodeCount::Online => "online",
            NodeCount::Offline => "offline",
            NodeCount::Unknown => "unknown",
            NodeCount::Drained => "drained",
            NodeCount::Draining => "draining",
            NodeCount::Torpid => "torpid",
        }
    }
}

/// The state of one execution target (broker rank).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankState {
    pub rank: u32,
    pub hostname: Option<String>,
    /// `None` while nothing said whether it is up: the KVS resource
    /// eventlog (a `flux dump`) keeps no `restart`, `online` or `offline`,
    /// so ranks read from it alone are unknown, not offline. Older
    /// checkpoints saved a plain bool, which reads as `Some`.
    pub online: Option<bool>,
    /// Not heard from lately and not yet offline (RFC 44).
    pub torpid: bool,
    /// Excluded by configuration (only old `resource-init` events say so).
    pub excluded: bool,
    pub drained: bool,
    pub drain_reason: Option<String>,
    /// Set exactly when `drained` is.
    pub drain_timestamp: Option<f64>,
    /// Drained while a job still holds it (`flux resource status` calls it
    /// draining, and drained only once the jobs are gone). Not in any
    /// resource event: the state keeping the jobs sets it
    /// ([`ResourceState::set_draining`]). Saved last, with a default:
    /// older checkpoints read as before.
    #[serde(default)]
    pub draining: bool,
}

/// The name a rank goes by: its hostname, or `rank{N}` while none is known
/// (one spelling for alerts, metrics, tables and the status page).
pub fn rank_name(rank: u32, hostname: Option<&str>) -> std::borrow::Cow<'_, str> {
    match hostname {
        Some(h) => std::borrow::Cow::Borrowed(h),
        None => std::borrow::Cow::Owned(format!("rank{rank}")),
    }
}

impl RankState {
    /// Its hostname, or `rank{N}` while none is known.
    pub fn name(&self) -> std::borrow::Cow<'_, str> {
        rank_name(self.rank, self.hostname.as_deref())
    }

    /// A rank with nothing known about it: liveness unknown, not drained.
    pub fn new(rank: u32) -> Self {
        RankState {
            rank,
            hostname: None,
            online: None,
            torpid: false,
            excluded: false,
            drained: false,
            drain_reason: None,
            drain_timestamp: None,
            draining: false,
        }
    }
}

/// What one event did to one rank. `before` is `None` when the rank became
/// known with this event; `after` is `None` when it left the instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankChange {
    pub rank: u32,
    pub before: Option<RankState>,
    pub after: Option<RankState>,
}

impl RankChange {
    /// Names of the fields that differ between `before` and `after`
    /// (`"added"` / `"removed"` when one side is missing).
    pub fn changed_fields(&self) -> Vec<&'static str> {
        let (b, a) = match (&self.before, &self.after) {
            (None, _) => return vec!["added"],
            (_, None) => return vec!["removed"],
            (Some(b), Some(a)) => (b, a),
        };
        let mut out = Vec::new();
        if b.hostname != a.hostname {
            out.push("hostname");
        }
        if b.online != a.online {
            out.push("online");
        }
        if b.torpid != a.torpid {
            out.push("torpid");
        }
        if b.excluded != a.excluded {
            out.push("excluded");
        }
        if b.drained != a.drained {
            out.push("drained");
        }
        if b.drain_reason != a.drain_reason {
            out.push("drain_reason");
        }
        if b.drain_timestamp != a.drain_timestamp {
            out.push("drain_timestamp");
        }
        if b.draining != a.draining {
            out.push("draining");
        }
        out
    }
}

/// The outcome of applying one event (or one R object).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    pub changes: Vec<RankChange>,
    pub anomalies: Vec<Anomaly>,
    /// The event was a repeat of one already applied: nothing was done.
    pub skipped_duplicate: bool,
}

/// Resource state of one Flux instance, rebuilt from its resource events.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResourceState {
    ranks: BTreeMap<u32, RankState>,
    /// The instance's ranks, once a `restart` event or R has said so; rank
    /// range checks apply only then.
    instance_ranks: Option<IdSet>,
    nodelist: Option<Hostlist>,
    method: Option<String>,
    expiration: Option<f64>,
    last_timestamp: Option<f64>,
    /// Newest timestamp applied before the current life began (`restart`
    /// or `resource-init`): a volatile event at or before it that is not of
    /// this life belongs to an earlier life we already read, and can only be
    /// a resend (flux-core never replays volatile events of a past life).
    life_horizon: Option<f64>,
    truncated: bool,
    restarts: u64,
    applied: u64,
    /// Keys of applied events that a later life may replay (drains, ...).
    seen_persistent: HashSet<(u64, compact_str::CompactString)>,
    /// Keys of applied events of the current life; cleared at `restart`.
    seen_life: HashSet<(u64, compact_str::CompactString)>,
    /// The brokers' hosts by rank, from the latest `restart` event: what
    /// flux-core maps a drain's `nodelist` against (its broker hostmap),
    /// which can differ from R's nodelist (a test instance's
    /// `--test-hosts`). Saved last, with a default: older checkpoints
    /// read as before.
    #[serde(default)]
    broker_hosts: BTreeMap<u32, String>,
    /// Since when the whole instance is down (`instance-down`, which the
    /// forwarder sends when it loses the instance: Flux itself posts
    /// nothing), until the next `restart`. Saved last, with a default.
    #[serde(default)]
    down_since: Option<f64>,
    /// The instance's node properties (RFC 20, `+NAME` instance-local
    /// ones included), name → ranks, from its latest R. Saved last, with
    /// a default.
    #[serde(default)]
    properties: BTreeMap<String, IdSet>,
    /// The instance's `[queues]` table as the forwarder last sent it
    /// (`queue-config`); `None`: never sent. Saved last, with a default.
    #[serde(default)]
    queues: Option<QueueConfig>,
    /// The stamp of the newest `queue-config` read (applied or refused):
    /// one no newer is a resend, or stale. Saved last, with a default.
    #[serde(default)]
    queues_at: Option<f64>,
    /// Most ranks this state may hold, as its holder allows (the
    /// pipeline's `operators.max_ranks`, less what other clusters hold);
    /// never above [`MAX_RANKS`]. Not saved: set before each event.
    #[serde(skip)]
    rank_room: Option<usize>,
}

/// Most properties an R may give an instance; more are a feed's mistake.
const MAX_PROPERTIES: usize = 1024;

/// R's `execution.properties` (RFC 20: name → idset), `+NAME` ones
/// included; what is not read is said.
fn read_properties(v: Option<&Value>, anomalies: &mut Vec<Anomaly>) -> BTreeMap<String, IdSet> {
    let mut out = BTreeMap::new();
    let Some(v) = v else {
        return out;
    };
    let bad = |msg: String| Anomaly::new(Stream::Resource, AnomalyKind::InvalidContext, msg);
    let Some(map) = v.as_object().filter(|m| m.len() <= MAX_PROPERTIES) else {
        anomalies.push(bad(format!(
            "R `execution.properties` is not an object of at most {MAX_PROPERTIES} properties"
        )));
        return out;
    };
    for (name, ranks) in map {
        match ranks.as_str().map(bounded_idset) {
            Some(Ok(set)) if name.len() <= super::queues::MAX_NAME => {
                out.insert(name.clone(), set);
            }
            _ => anomalies.push(bad(format!(
                "R property `{name}` has no valid idset: {ranks}"
            ))),
        }
    }
    out
}

/// Per-event scratch: the event plus what applying it produced.
struct Ctx<'a> {
    ev: &'a Event,
    out: Applied,
}

impl Ctx<'_> {
    fn anomaly(&mut self, kind: AnomalyKind, msg: impl Into<String>) {
        let a = Anomaly::new(Stream::Resource, kind, msg).at(&self.ev.name, self.ev.timestamp);
        self.out.anomalies.push(a);
    }

    fn rank_anomaly(&mut self, kind: AnomalyKind, rank: u32, msg: impl Into<String>) {
        let a = Anomaly::new(Stream::Resource, kind, msg)
            .at(&self.ev.name, self.ev.timestamp)
            .on_rank(rank);
        self.out.anomalies.push(a);
    }

    fn context_error(&mut self, e: ContextError) {
        let kind = match e {
            ContextError::Missing(_) => AnomalyKind::MissingContext,
            ContextError::WrongType { .. } => AnomalyKind::InvalidContext,
        };
        self.anomaly(kind, e.to_string());
    }

    /// A REQUIRED idset key; `None` (with an anomaly) if absent or invalid.
    fn idset(&mut self, key: &'static str) -> Option<IdSet> {
        match self.ev.str(key) {
            Ok(s) => match bounded_idset(&s) {
                Ok(set) => Some(set),
                Err(e) => {
                    self.anomaly(
                        AnomalyKind::InvalidContext,
                        format!("`{key}` is not a valid idset ({s:?}): {e}"),
                    );
                    None
                }
            },
            Err(e) => {
                self.context_error(e);
                None
            }
        }
    }

    /// A REQUIRED idset key that must also name at least one rank (flux-core
    /// never posts an empty drain/undrain/online/... set).
    fn nonempty_idset(&mut self, key: &'static str) -> Option<IdSet> {
        let set = self.idset(key)?;
        if set.is_empty() {
            self.anomaly(AnomalyKind::InvalidContext, format!("`{key}` is empty"));
            return None;
        }
        Some(set)
    }

    /// An OPTIONAL hostlist key: `None` if absent; invalid ones are reported
    /// and ignored.
    fn opt_hostlist(&mut self, key: &'static str) -> Option<Hostlist> {
        match self.ev.opt_str(key) {
            Ok(None) => None,
            Ok(Some(s)) => match Hostlist::parse(&s) {
                Ok(h) => Some(h),
                Err(e) => {
                    self.anomaly(
                        AnomalyKind::InvalidContext,
                        format!("`{key}` is not a valid hostlist ({s:?}): {e}"),
                    );
                    None
                }
            },
            Err(e) => {
                self.context_error(e);
                None
            }
        }
    }

    /// An OPTIONAL string key; a wrong type is reported and read as absent.
    fn opt_string(&mut self, key: &'static str) -> Option<String> {
        match self.ev.opt_str(key) {
            Ok(s) => s.map(Cow::into_owned),
            Err(e) => {
                self.context_error(e);
                None
            }
        }
    }
}

/// One entry per rank (ascending): the first `before` and the last
/// `after`, dropping ranks that ended where they started.
fn coalesce(changes: &mut Vec<RankChange>) {
    let mut by_rank: BTreeMap<u32, RankChange> = BTreeMap::new();
    for c in changes.drain(..) {
        match by_rank.get_mut(&c.rank) {
            Some(prev) => prev.after = c.after,
            None => {
                by_rank.insert(c.rank, c);
            }
        }
    }
    changes.extend(by_rank.into_values().filter(|c| c.before != c.after));
}

/// The most ranks one idset of a resource event or R may name. State is
/// kept per rank, so `0-4294967294` in hostile input would take the memory
/// of four billion ranks (the fuzzer found it), and even 2^20 ranks cost a
/// second and hundreds of MB per line. 131072 is ten times the ranks of the
/// largest Flux systems.
const MAX_RANKS: u64 = 1 << 17;

/// An idset that names at most [`MAX_RANKS`] ranks.
pub(crate) fn bounded_idset(s: &str) -> Result<IdSet, String> {
    let set = IdSet::parse(s).map_err(|e| e.to_string())?;
    if set.len() > MAX_RANKS {
        return Err(format!("{} ranks, more than {MAX_RANKS}", set.len()));
    }
    Ok(set)
}

impl ResourceState {
    pub fn new() -> Self {
        Self::default()
    }

    /// All ranks known so far, in ascending order.
    pub fn ranks(&self) -> impl Iterator<Item = &RankState> {
        self.ranks.values()
    }

    pub fn rank(&self, r: u32) -> Option<&RankState> {
        self.ranks.get(&r)
    }

    pub fn hostname(&self, r: u32) -> Option<String> {
        self.ranks.get(&r).and_then(|s| s.hostname.clone())
    }

    /// The instance's ranks, if a `restart` event or R defined them.
    pub fn instance_ranks(&self) -> Option<&IdSet> {
        self.instance_ranks.as_ref()
    }

    /// The instance nodelist from the latest `restart` event or R.
    pub fn nodelist(&self) -> Option<&Hostlist> {
        self.nodelist.as_ref()
    }

    /// `method` of the latest `resource-define`.
    pub fn define_method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    /// Instance expiration (seconds since the epoch) from `resource-update`
    /// or R; `None` when unknown or unlimited (0 in R).
    pub fn expiration(&self) -> Option<f64> {
        self.expiration
    }

    /// Timestamp of the newest event applied.
    pub fn last_timestamp(&self) -> Option<f64> {
        self.last_timestamp
    }

    /// A `truncate` event was seen: history before it is lost.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Number of `restart` (or old `resource-init`) events applied.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// Since when the whole instance is down, if it is.
    pub fn down_since(&self) -> Option<f64> {
        self.down_since
    }

    /// Number of events applied (duplicates not counted).
    pub fn applied_count(&self) -> u64 {
        self.applied
    }

    /// Ranks currently drained.
    pub fn drained(&self) -> IdSet {
        self.ranks
            .values()
            .filter(|s| s.drained)
            .map(|s| s.rank)
            .collect()
    }

    /// Ranks currently online.
    pub fn online(&self) -> IdSet {
        self.ranks
            .values()
            .filter(|s| s.online == Some(true))
            .map(|s| s.rank)
            .collect()
    }

    /// Ranks whose liveness nothing has told (read from a KVS eventlog).
    pub fn unknown(&self) -> IdSet {
        self.ranks
            .values()
            .filter(|s| s.online.is_none())
            .map(|s| s.rank)
            .collect()
    }

    /// The state in the shape of flux-core's `resource.status` response
    /// (without `R`): `drain` maps an idset to `{timestamp, reason}` with the
    /// timestamp rounded to whole seconds and a missing reason as `""`;
    /// `online`, `offline`, `exclude`, `torpid` are idset strings.
    pub fn status_json(&self) -> Value {
        let mut groups: BTreeMap<(i64, String), IdSet> = BTreeMap::new();
        for s in self.ranks.values().filter(|s| s.drained) {
            // flux-core rounds before grouping, so equal seconds merge.
            let ts = s.drain_timestamp.unwrap_or(0.0).round() as i64;
            let reason = s.drain_reason.clone().unwrap_or_default();
            groups.entry((ts, reason)).or_default().insert(s.rank);
        }
        let mut drain = Map::new();
        for ((ts, reason), ids) in groups {
            drain.insert(
                ids.to_string(),
                json!({"timestamp": ts as f64, "reason": reason}),
            );
        }
        let all: IdSet = match &self.instance_ranks {
            Some(r) => r.clone(),
            None => self.ranks.keys().copied().collect(),
        };
        let online = self.online();
        let unknown = self.unknown();
        let mut offline = all;
        offline.subtract(&online);
        offline.subtract(&unknown);
        let exclude: IdSet = self
            .ranks
            .values()
            .filter(|s| s.excluded)
            .map(|s| s.rank)
            .collect();
        let torpid: IdSet = self
            .ranks
            .values()
            .filter(|s| s.torpid)
            .map(|s| s.rank)
            .collect();
        let mut status = json!({
            "drain": drain,
            "online": online.to_string(),
            "offline": offline.to_string(),
            "exclude": exclude.to_string(),
            "torpid": torpid.to_string(),
        });
        // flux-core always knows; a state read from a KVS eventlog alone
        // may not, and says so rather than call those ranks offline.
        if !unknown.is_empty() {
            status["unknown"] = json!(unknown.to_string());
        }
        status
    }

    /// Apply one event. Never panics; rule violations come back as
    /// anomalies and the event is still applied as far as it makes sense
    /// (flux-core's own replay is just as lenient).
    pub fn apply(&mut self, ev: &Event) -> Applied {
        // Not a Flux event and not part of the log's order: the latest
        // table wins, and a resent one changes nothing.
        if ev.name == "queue-config" {
            return self.on_queue_config(ev);
        }
        let key = (ev.timestamp.to_bits(), ev.name.clone());
        let mut cx = Ctx {
            ev,
            out: Applied::default(),
        };
        if let Some(last) = self.last_timestamp
            && ev.timestamp <= last
        {
            let earlier_life = !PERSISTENT_EVENTS.contains(&ev.name.as_str())
                && self.life_horizon.is_some_and(|h| ev.timestamp <= h);
            if earlier_life || self.seen_persistent.contains(&key) || self.seen_life.contains(&key)
            {
                cx.out.skipped_duplicate = true;
                return cx.out;
            }
            // A resent backlog may start with a `truncate` marker that
            // carries the timestamp of an event we already hold.
            if ev.name == "truncate" {
                cx.out.skipped_duplicate = true;
                return cx.out;
            }
            if ev.timestamp < last {
                // The log order is the truth; apply it but say so.
                cx.anomaly(
                    AnomalyKind::OutOfOrder,
                    format!("timestamp {} is older than {last}", ev.timestamp),
                );
            }
        }

        match ev.name.as_str() {
            "restart" => self.on_restart(&mut cx),
            "online" => self.on_flag(&mut cx, Some((false, "already online")), |s| {
                s.online = Some(true)
            }),
            // RFC 44: torpid means "not yet marked offline", so going
            // offline ends torpidity.
            "offline" => self.on_flag(&mut cx, Some((true, "not online")), |s| {
                s.online = Some(false);
                s.torpid = false;
            }),
            "torpid" => self.on_flag(&mut cx, None, |s| s.torpid = true),
            "lively" => self.on_flag(&mut cx, None, |s| s.torpid = false),
            "drain" => self.on_drain(&mut cx),
            "undrain" => self.on_undrain(&mut cx),
            "resource-define" => self.on_define(&mut cx),
            "resource-update" => self.on_update(&mut cx),
            "truncate" => self.on_truncate(&mut cx),
            "resource-init" => self.on_resource_init(&mut cx),
            "instance-down" => self.on_instance_down(&mut cx),
            other => cx.anomaly(
                AnomalyKind::UnknownEvent,
                format!("`{other}` is not an RFC 44 event"),
            ),
        }

        if PERSISTENT_EVENTS.contains(&ev.name.as_str()) {
            self.seen_persistent.insert(key);
        } else {
            self.seen_life.insert(key);
        }
        self.last_timestamp = Some(match self.last_timestamp {
            Some(t) if t > ev.timestamp => t,
            _ => ev.timestamp,
        });
        self.applied += 1;
        coalesce(&mut cx.out.changes);
        cx.out
    }

    /// Apply an R object (RFC 20: from the journal's `R` key next to
    /// `resource-define`, or R.json): its ranks become the instance ranks
    /// and the i-th host of `execution.nodelist` names the i-th rank.
    pub fn apply_r(&mut self, r: &Value) -> Applied {
        let mut out = Applied::default();
        let bad = |kind, msg: String| Anomaly::new(Stream::Resource, kind, msg);
        let Some(exec) = r.get("execution").and_then(Value::as_object) else {
            out.anomalies.push(bad(
                AnomalyKind::Malformed,
                "R has no `execution` object".into(),
            ));
            return out;
        };
        let mut ranks = IdSet::new();
        match exec.get("R_lite").and_then(Value::as_array) {
            None => out.anomalies.push(bad(
                AnomalyKind::Malformed,
                "R has no `execution.R_lite` array".into(),
            )),
            Some(entries) => {
                for entry in entries {
                    match entry.get("rank").and_then(Value::as_str).map(bounded_idset) {
                        Some(Ok(set)) => ranks.union_with(&set),
                        _ => out.anomalies.push(bad(
                            AnomalyKind::InvalidContext,
                            format!("R_lite entry has no valid `rank` idset: {entry}"),
                        )),
                    }
                }
            }
        }
        if ranks.len() > MAX_RANKS {
            out.anomalies.push(bad(
                AnomalyKind::InvalidContext,
                format!("R names {} ranks, more than {MAX_RANKS}", ranks.len()),
            ));
            return out;
        }
        let mut hosts: Option<Hostlist> = None;
        if let Some(list) = exec.get("nodelist") {
            let mut all = Hostlist::default();
            let mut ok = true;
            for item in list.as_array().into_iter().flatten() {
                match item.as_str().map(Hostlist::parse) {
                    // No more hosts than ranks can be: expanding is per host.
                    Some(Ok(h)) if (all.len() + h.len()) as u64 > MAX_RANKS => {
                        ok = false;
                        break;
                    }
                    Some(Ok(h)) => {
                        for name in h.iter() {
                            all.push(&name);
                        }
                    }
                    _ => ok = false,
                }
            }
            if !ok || !list.is_array() {
                out.anomalies.push(bad(
                    AnomalyKind::InvalidContext,
                    "R `execution.nodelist` is not an array of hostlists".into(),
                ));
            } else if all.len() as u64 != ranks.len() {
                out.anomalies.push(bad(
                    AnomalyKind::InvalidContext,
                    format!(
                        "R nodelist has {} hosts for {} ranks",
                        all.len(),
                        ranks.len()
                    ),
                ));
            } else {
                hosts = Some(all);
            }
        }
        if let Some(exp) = exec.get("expiration").and_then(Value::as_f64)
            && exp > 0.0
        {
            self.expiration = Some(exp);
        }
        if ranks.is_empty() {
            return out;
        }
        if ranks.len() > self.room() as u64 {
            out.anomalies.push(bad(
                AnomalyKind::InvalidContext,
                format!(
                    "R names {} ranks, more than the {} allowed (operators.max_ranks): kept as they were",
                    ranks.len(),
                    self.room()
                ),
            ));
            return out;
        }
        self.define_ranks(&ranks, &mut out.changes);
        self.properties = read_properties(exec.get("properties"), &mut out.anomalies);
        if let Some(h) = hosts {
            self.set_hostnames(&ranks, &h, &mut out.changes);
            self.nodelist = Some(h);
        }
        coalesce(&mut out.changes);
        out
    }

    /// Mark `ranks` draining where they are drained and `held` (a job
    /// holds them), and not where not; the changes go to `changes`,
    /// merged per rank with what is there.
    pub fn set_draining(
        &mut self,
        ranks: impl IntoIterator<Item = u32>,
        held: impl Fn(u32) -> bool,
        changes: &mut Vec<RankChange>,
    ) {
        let before = changes.len();
        for r in ranks {
            let Some(s) = self.ranks.get(&r) else {
                continue;
            };
            let want = s.drained && held(r);
            if s.draining != want {
                self.modify(r, changes, |s| s.draining = want);
            }
        }
        if changes.len() != before {
            coalesce(changes);
        }
    }

    // ---- helpers -------------------------------------------------------

    fn known(&self, r: u32) -> bool {
        self.refusal(r).is_none()
    }

    /// Why rank `r` cannot be kept, if it cannot: outside the instance,
    /// or new when the ranks held are at their limit (hostile input
    /// naming ranks of a cluster whose instance is not known).
    fn refusal(&self, r: u32) -> Option<String> {
        if self
            .instance_ranks
            .as_ref()
            .is_some_and(|set| !set.contains(r))
        {
            return Some(format!("rank {r} is not one of the instance ranks"));
        }
        if !self.ranks.contains_key(&r) && self.ranks.len() >= self.room() {
            return Some(format!(
                "rank {r} is new and {} ranks are held, the most allowed (operators.max_ranks)",
                self.ranks.len()
            ));
        }
        None
    }

    /// Most ranks this state may hold now.
    fn room(&self) -> usize {
        self.rank_room
            .unwrap_or(MAX_RANKS as usize)
            .min(MAX_RANKS as usize)
    }

    /// Allow at most `n` ranks (see `rank_room`).
    pub fn set_rank_room(&mut self, n: usize) {
        self.rank_room = Some(n);
    }

    /// Ranks held.
    pub fn rank_count(&self) -> usize {
        self.ranks.len()
    }

    /// Change one rank (creating it if new, room allowing) and record
    /// what changed.
    fn modify(&mut self, rank: u32, changes: &mut Vec<RankChange>, f: impl FnOnce(&mut RankState)) {
        if !self.ranks.contains_key(&rank) && self.ranks.len() >= self.room() {
            return;
        }
        let before = self.ranks.get(&rank).cloned();
        let st = self
            .ranks
            .entry(rank)
            .or_insert_with(|| RankState::new(rank));
        f(st);
        if before.as_ref() != Some(st) {
            changes.push(RankChange {
                rank,
                before,
                after: Some(st.clone()),
            });
        }
    }

    /// Make `ranks` the instance's ranks: forget ranks outside it (flux-core
    /// sizes its drain table to the instance) and add the missing ones.
    fn define_ranks(&mut self, ranks: &IdSet, changes: &mut Vec<RankChange>) {
        let gone: Vec<u32> = self
            .ranks
            .keys()
            .copied()
            .filter(|r| !ranks.contains(*r))
            .collect();
        for r in gone {
            if let Some(st) = self.ranks.remove(&r) {
                changes.push(RankChange {
                    rank: r,
                    before: Some(st),
                    after: None,
                });
            }
        }
        for r in ranks.iter() {
            self.modify(r, changes, |_| {});
        }
        self.instance_ranks = Some(ranks.clone());
    }

    /// The i-th rank of `ranks` runs on the i-th host of `hosts`.
    fn set_hostnames(&mut self, ranks: &IdSet, hosts: &Hostlist, changes: &mut Vec<RankChange>) {
        for (r, h) in ranks.iter().zip(hosts.iter()) {
            self.modify(r, changes, |s| s.hostname = Some(h));
        }
    }

    /// Ranks a drain/undrain targets. As flux-core does on replay, when the
    /// event's nodelist names a different host than the rank has now, the
    /// drain follows the host (its first rank), or is dropped if that host
    /// is gone. Without a known mapping the event's hostnames are learned.
    fn targets(&mut self, set: &IdSet, nodelist: Option<&Hostlist>, cx: &mut Ctx) -> Vec<u32> {
        let mut out = Vec::new();
        let mut hosts = nodelist.map(|nl| nl.iter());
        // flux-core maps hosts with the brokers' hostmap, which the
        // `restart` event gives; without one, with the ranks' hostnames.
        let by_broker = !self.broker_hosts.is_empty();
        for r in set.iter() {
            let host = hosts.as_mut().and_then(|it| it.next());
            let Some(host) = host else {
                out.push(r);
                continue;
            };
            let current = if by_broker {
                self.broker_hosts.get(&r).cloned()
            } else {
                self.hostname(r)
            };
            match current {
                Some(cur) if cur == host => out.push(r),
                Some(_) => {
                    if let Some(nr) = self.rank_of_host(&host, by_broker) {
                        out.push(nr);
                    }
                }
                None if by_broker => {
                    if let Some(nr) = self.rank_of_host(&host, true) {
                        out.push(nr);
                    }
                }
                None => {
                    if self.nodelist.is_none() && self.known(r) {
                        self.modify(r, &mut cx.out.changes, |s| s.hostname = Some(host));
                    }
                    out.push(r);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The first rank on `host` (as flux-core's `flux_get_rankbyhost`).
    fn rank_of_host(&self, host: &str, by_broker: bool) -> Option<u32> {
        if by_broker {
            self.broker_hosts
                .iter()
                .find(|(_, h)| h.as_str() == host)
                .map(|(r, _)| *r)
        } else {
            self.ranks
                .values()
                .find(|s| s.hostname.as_deref() == Some(host))
                .map(|s| s.rank)
        }
    }

    /// Filter out ranks outside the instance, reporting each.
    fn in_instance(&self, ranks: impl IntoIterator<Item = u32>, cx: &mut Ctx) -> Vec<u32> {
        let mut ok = Vec::new();
        // One anomaly per rank refused, the first few: a hostile idset of
        // a hundred thousand ranks gives a summary, not as many records.
        const EACH: usize = 8;
        let mut refused = 0usize;
        // Ranks new to the state are made later, by the caller: room is
        // counted down here.
        let mut room = self.room().saturating_sub(self.ranks.len());
        for r in ranks {
            let why = match self.refusal(r) {
                None if self.ranks.contains_key(&r) => None,
                None if room > 0 => {
                    room -= 1;
                    None
                }
                None => Some(format!(
                    "rank {r} is new and the most ranks allowed are held (operators.max_ranks)"
                )),
                Some(why) => Some(why),
            };
            match why {
                None => ok.push(r),
                Some(why) => {
                    refused += 1;
                    if refused <= EACH {
                        cx.rank_anomaly(AnomalyKind::UnknownRank, r, why);
                    }
                }
            }
        }
        if refused > EACH {
            cx.anomaly(
                AnomalyKind::UnknownRank,
                format!("{} more ranks refused as the ones before", refused - EACH),
            );
        }
        ok
    }

    // ---- event handlers ------------------------------------------------

    /// A new life begins: its volatile events start over.
    fn new_life(&mut self) {
        self.down_since = None;
        self.seen_life.clear();
        self.life_horizon = self.last_timestamp;
        self.restarts += 1;
    }

    fn on_restart(&mut self, cx: &mut Ctx) {
        self.new_life();
        let ranks = cx.idset("ranks");
        let online = cx.idset("online");
        let nodelist = match cx.ev.str("nodelist") {
            Ok(s) => match Hostlist::parse(&s) {
                Ok(h) => Some(h),
                Err(e) => {
                    cx.anomaly(
                        AnomalyKind::InvalidContext,
                        format!("`nodelist` is not a valid hostlist ({s:?}): {e}"),
                    );
                    None
                }
            },
            Err(e) => {
                cx.context_error(e);
                None
            }
        };
        if let Some(ranks) = &ranks {
            if ranks.is_empty() {
                cx.anomaly(AnomalyKind::InvalidContext, "`ranks` is empty");
            } else if ranks.len() > self.room() as u64 {
                cx.anomaly(
                    AnomalyKind::InvalidContext,
                    format!(
                        "`ranks` names {} ranks, more than the {} allowed (operators.max_ranks): kept as they were",
                        ranks.len(),
                        self.room()
                    ),
                );
            } else {
                self.define_ranks(ranks, &mut cx.out.changes);
                if let Some(nl) = &nodelist {
                    if nl.len() as u64 != ranks.len() {
                        cx.anomaly(
                            AnomalyKind::InvalidContext,
                            format!("nodelist has {} hosts for {} ranks", nl.len(), ranks.len()),
                        );
                    }
                    self.set_hostnames(ranks, nl, &mut cx.out.changes);
                    self.broker_hosts = ranks.iter().zip(nl.iter()).collect();
                }
            }
        }
        if let Some(nl) = nodelist {
            self.nodelist = Some(nl);
        }
        // Online and torpid start over; drain state survives.
        let online = online.unwrap_or_default();
        let listed = self.in_instance(online.iter(), cx);
        let all: Vec<u32> = self.ranks.keys().copied().collect();
        for r in all {
            let up = online.contains(r);
            self.modify(r, &mut cx.out.changes, |s| {
                s.online = Some(up);
                s.torpid = false;
            });
        }
        for r in listed {
            self.modify(r, &mut cx.out.changes, |s| s.online = Some(true));
        }
    }

    /// The whole instance went away (fluxpipe's own event, from the
    /// forwarder): nothing can say whether its nodes are up until it
    /// restarts, so every rank's liveness becomes unknown. One event for
    /// the instance, rather than an offline page per node for what a
    /// shutdown leaves behind (some ranks offline, rank 0 never).
    /// The instance's `[queues]` table (fluxpipe's own event, sent by the
    /// forwarder: Flux's eventlogs do not carry it). A table flux-core
    /// would refuse leaves the one before in place.
    fn on_queue_config(&mut self, ev: &Event) -> Applied {
        let mut out = Applied::default();
        if self.queues_at.is_some_and(|at| ev.timestamp <= at) {
            out.skipped_duplicate = true;
            return out;
        }
        self.queues_at = Some(ev.timestamp);
        let bad = |kind, msg: String| {
            Anomaly::new(Stream::Resource, kind, msg).at(&ev.name, ev.timestamp)
        };
        match ev.get("queues") {
            None => out.anomalies.push(bad(
                AnomalyKind::MissingContext,
                "`queues` is missing".into(),
            )),
            Some(table) => match QueueConfig::from_value(&table) {
                Ok(q) => self.queues = Some(q),
                Err(e) => out
                    .anomalies
                    .push(bad(AnomalyKind::InvalidContext, e.to_string())),
            },
        }
        out
    }

    /// The instance's `[queues]` table, once the forwarder has sent it.
    pub fn queue_config(&self) -> Option<&QueueConfig> {
        self.queues.as_ref()
    }

    /// The instance's node properties (name → ranks), from its R.
    pub fn properties(&self) -> &BTreeMap<String, IdSet> {
        &self.properties
    }

    /// The ranks of a configured queue (a virtual queue's are its
    /// parent's), as `flux resource status -q` selects them; `None`: no
    /// such queue, or no table sent.
    pub fn queue_ranks(&self, queue: &str) -> Option<IdSet> {
        let all = self.all_ranks();
        self.queues.as_ref()?.ranks(queue, &all, &self.properties)
    }

    /// Each configured queue that is not virtual with its ranks: the
    /// queues whose nodes `flux resource list` shows by default.
    pub fn queue_slices(&self) -> Vec<(String, IdSet)> {
        let Some(q) = &self.queues else {
            return Vec::new();
        };
        let all = self.all_ranks();
        q.iter()
            .filter(|(_, e)| e.parent.is_none())
            .filter_map(|(n, _)| Some((n.to_string(), q.ranks(n, &all, &self.properties)?)))
            .collect()
    }

    /// The instance's ranks: as R or `restart` said, else those held.
    fn all_ranks(&self) -> IdSet {
        match &self.instance_ranks {
            Some(set) => set.clone(),
            None => {
                let mut set = IdSet::new();
                for r in self.ranks.keys() {
                    set.insert(*r);
                }
                set
            }
        }
    }

    fn on_instance_down(&mut self, cx: &mut Ctx) {
        let _ = cx.opt_string("reason"); // only type-checked
        self.down_since = Some(cx.ev.timestamp);
        let all: Vec<u32> = self.ranks.keys().copied().collect();
        for r in all {
            self.modify(r, &mut cx.out.changes, |s| {
                s.online = None;
                s.torpid = false;
            });
        }
    }

    /// online/offline/torpid/lively. `expect` is the `online` value a rank
    /// must have before the event: flux-core posts only the difference
    /// between successive online sets, so `online` for a rank already
    /// online (or `offline` for one not online) is inconsistent. That is
    /// checked only when the start of the current life was seen and no
    /// history was truncated; otherwise the online state may be stale.
    fn on_flag(&mut self, cx: &mut Ctx, expect: Option<(bool, &str)>, f: impl Fn(&mut RankState)) {
        let Some(set) = cx.nonempty_idset("idset") else {
            return;
        };
        let reliable = self.restarts > 0 && !self.truncated;
        for r in self.in_instance(set.iter(), cx) {
            if let Some((want, what)) = expect
                && reliable
                && self
                    .ranks
                    .get(&r)
                    .is_some_and(|s| s.online.is_some_and(|o| o != want))
            {
                cx.rank_anomaly(
                    AnomalyKind::UnexpectedEvent,
                    r,
                    format!("rank {r} is {what}"),
                );
            }
            self.modify(r, &mut cx.out.changes, &f);
        }
    }

    fn on_drain(&mut self, cx: &mut Ctx) {
        let Some(set) = cx.nonempty_idset("idset") else {
            return;
        };
        let nodelist = cx.opt_hostlist("nodelist");
        let reason = cx.opt_string("reason");
        // Older logs have no `overwrite`; flux-core replays them as 1.
        let overwrite = match cx.ev.opt_int("overwrite") {
            Ok(None) => 1,
            Ok(Some(v)) => {
                if !(0..=2).contains(&v) {
                    cx.anomaly(
                        AnomalyKind::InvalidContext,
                        format!("`overwrite` is {v}, not 0, 1 or 2"),
                    );
                }
                v
            }
            Err(e) => {
                cx.context_error(e);
                1
            }
        };
        let ts = cx.ev.timestamp;
        let targets = self.targets(&set, nodelist.as_ref(), cx);
        for r in self.in_instance(targets, cx) {
            self.modify(r, &mut cx.out.changes, |s| {
                // flux-core: with overwrite 0 a drained rank keeps a reason
                // it has (this is how `drain -u` leaves reasons alone), but
                // one without a reason takes the event's.
                if overwrite == 0 && s.drained && s.drain_reason.is_some() {
                    return;
                }
                s.drain_reason = reason.clone();
                if !s.drained || overwrite == 2 {
                    s.drained = true;
                    s.drain_timestamp = Some(ts);
                }
            });
        }
    }

    fn on_undrain(&mut self, cx: &mut Ctx) {
        let Some(set) = cx.nonempty_idset("idset") else {
            return;
        };
        let nodelist = cx.opt_hostlist("nodelist");
        let _ = cx.opt_string("reason"); // only type-checked
        let targets = self.targets(&set, nodelist.as_ref(), cx);
        // Undraining a rank that is not drained is not reported: flux-core
        // 0.88 does post such events (see the A-incarnation1 journal) and
        // its replay ignores them.
        for r in self.in_instance(targets, cx) {
            self.modify(r, &mut cx.out.changes, |s| {
                s.drained = false;
                s.draining = false;
                s.drain_reason = None;
                s.drain_timestamp = None;
            });
        }
    }

    fn on_define(&mut self, cx: &mut Ctx) {
        match cx.ev.str("method") {
            Ok(m) => {
                if !DEFINE_METHODS.contains(&&*m) {
                    cx.anomaly(
                        AnomalyKind::InvalidContext,
                        format!("`method` {m:?} is not one RFC 44 defines"),
                    );
                }
                self.method = Some(m.to_string());
            }
            Err(e) => cx.context_error(e),
        }
    }

    fn on_update(&mut self, cx: &mut Ctx) {
        match cx.ev.number("expiration") {
            Ok(x) if x.is_finite() && x >= 0.0 => {
                self.expiration = if x > 0.0 { Some(x) } else { None };
            }
            Ok(x) => cx.anomaly(
                AnomalyKind::InvalidContext,
                format!("`expiration` {x} is negative"),
            ),
            Err(e) => cx.context_error(e),
        }
    }

    fn on_truncate(&mut self, cx: &mut Ctx) {
        if cx.ev.context.as_ref().is_some_and(|c| !c.is_empty()) {
            cx.anomaly(
                AnomalyKind::InvalidContext,
                "truncate SHALL NOT have a context",
            );
        }
        if self.applied > 0 {
            cx.anomaly(
                AnomalyKind::UnexpectedEvent,
                "truncate must be the first event of a log",
            );
        }
        self.truncated = true;
    }

    /// Old-format (flux-core < 0.62) `resource-init`: a full snapshot of
    /// drain state (`drain` maps an idset to {timestamp, reason?}), the
    /// online and excluded sets. Like flux-core's upgrade, drains before it
    /// are superseded by its summary.
    fn on_resource_init(&mut self, cx: &mut Ctx) {
        self.new_life();
        if let Err(e) = cx.ev.bool("restart") {
            cx.context_error(e);
        }
        let mut drains: Option<Vec<(IdSet, f64, Option<String>)>> = None;
        match cx.ev.get("drain") {
            None => cx.anomaly(AnomalyKind::MissingContext, "missing context key `drain`"),
            Some(Value::Object(map)) => {
                let mut list = Vec::new();
                for (ids, info) in map {
                    let set = match bounded_idset(&ids) {
                        Ok(s) => s,
                        Err(e) => {
                            cx.anomaly(
                                AnomalyKind::InvalidContext,
                                format!("drain key {ids:?} is not an idset: {e}"),
                            );
                            continue;
                        }
                    };
                    let ts = info.get("timestamp").and_then(Value::as_f64);
                    let reason = info.get("reason");
                    let reason = match reason {
                        None | Some(Value::Null) => Some(None),
                        Some(Value::String(s)) => Some(Some(s.clone())),
                        Some(_) => None,
                    };
                    match (ts, reason) {
                        (Some(ts), Some(reason)) => list.push((set, ts, reason)),
                        _ => cx.anomaly(
                            AnomalyKind::InvalidContext,
                            format!("drain entry {ids:?} needs a numeric timestamp and an optional string reason"),
                        ),
                    }
                }
                drains = Some(list);
            }
            Some(_) => cx.anomaly(AnomalyKind::InvalidContext, "`drain` is not an object"),
        }
        let online = cx.idset("online").unwrap_or_default();
        let exclude = cx.idset("exclude").unwrap_or_default();

        let mut touched: Vec<u32> = online.iter().chain(exclude.iter()).collect();
        if let Some(list) = &drains {
            for (set, _, _) in list {
                touched.extend(set.iter());
            }
        }
        touched.sort_unstable();
        touched.dedup();
        let valid = self.in_instance(touched, cx);
        let mut all: Vec<u32> = self.ranks.keys().copied().chain(valid).collect();
        all.sort_unstable();
        all.dedup();
        for r in all {
            let drain = drains.as_ref().map(|list| {
                list.iter()
                    .find(|(set, _, _)| set.contains(r))
                    .map(|(_, ts, reason)| (*ts, reason.clone()))
            });
            let up = online.contains(r);
            let ex = exclude.contains(r);
            self.modify(r, &mut cx.out.changes, |s| {
                s.online = Some(up);
                s.torpid = false;
                s.excluded = ex;
                match drain {
                    None => {} // no valid summary: keep what we have
                    Some(None) => {
                        s.drained = false;
                        s.draining = false;
                        s.drain_reason = None;
                        s.drain_timestamp = None;
                    }
                    Some(Some((ts, reason))) => {
                        s.drained = true;
                        s.drain_reason = reason;
                        s.drain_timestamp = Some(ts);
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::{Path, PathBuf};

    fn corpus(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/corpus")
            .join(rel)
    }

    fn read(rel: &str) -> String {
        std::fs::read_to_string(corpus(rel)).unwrap()
    }

    /// Replay a resource journal capture (one response per line) into `st`.
    fn replay_journal(st: &mut ResourceState, text: &str) -> Vec<Applied> {
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let msg: Value = serde_json::from_str(line).unwrap();
            for ev in msg["events"].as_array().unwrap() {
                let ev = Event::from_value(ev.clone()).unwrap();
                out.push(st.apply(&ev));
            }
            if let Some(r) = msg.get("R") {
                out.push(st.apply_r(r));
            }
        }
        out
    }

    fn replay_log(st: &mut ResourceState, text: &str) -> Vec<Applied> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| st.apply(&Event::parse(l).unwrap()))
            .collect()
    }

    fn anomalies(applied: &[Applied]) -> Vec<Anomaly> {
        applied.iter().flat_map(|a| a.anomalies.clone()).collect()
    }

    fn ev(ts: f64, name: &str, ctx: Value) -> Event {
        Event::new(ts, name).with_context(ctx)
    }

    /// A 4-rank instance node[0-3], all online.
    fn instance() -> ResourceState {
        let mut st = ResourceState::new();
        let a = st.apply(&ev(
            1.0,
            "restart",
            json!({"ranks": "0-3", "online": "0-3", "nodelist": "node[0-3]"}),
        ));
        assert!(a.anomalies.is_empty(), "{:?}", a.anomalies);
        st
    }

    fn drain(ts: f64, ids: &str, reason: Option<&str>, ow: Option<i64>) -> Event {
        let mut c = json!({"idset": ids});
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        if let Some(o) = ow {
            c["overwrite"] = json!(o);
        }
        ev(ts, "drain", c)
    }

    fn drain_of(st: &ResourceState, r: u32) -> (bool, Option<String>, Option<f64>) {
        let s = st.rank(r).unwrap();
        (s.drained, s.drain_reason.clone(), s.drain_timestamp)
    }

    fn kinds(a: &Applied) -> Vec<AnomalyKind> {
        a.anomalies.iter().map(|a| a.kind).collect()
    }

    // ---- drain semantics -------------------------------------------------

    #[test]
    fn drain_sets_reason_and_timestamp() {
        let mut st = instance();
        let a = st.apply(&drain(2.0, "1-2", Some("bad dimm"), Some(0)));
        assert!(a.anomalies.is_empty());
        assert_eq!(a.changes.len(), 2);
        assert_eq!(
            a.changes[0].changed_fields(),
            ["drained", "drain_reason", "drain_timestamp"]
        );
        assert_eq!(drain_of(&st, 1), (true, Some("bad dimm".into()), Some(2.0)));
        assert_eq!(drain_of(&st, 2), (true, Some("bad dimm".into()), Some(2.0)));
        assert_eq!(drain_of(&st, 0), (false, None, None));
    }

    #[test]
    fn drain_without_reason() {
        let mut st = instance();
        st.apply(&drain(2.0, "1", None, Some(0)));
        assert_eq!(drain_of(&st, 1), (true, None, Some(2.0)));
    }

    #[test]
    fn overwrite_0_keeps_existing_reason() {
        let mut st = instance();
        st.apply(&drain(2.0, "1", Some("first"), Some(0)));
        let a = st.apply(&drain(3.0, "1-2", Some("second"), Some(0)));
        assert!(a.anomalies.is_empty());
        // rank 1 untouched (this is `drain -u`), rank 2 newly drained
        assert_eq!(drain_of(&st, 1), (true, Some("first".into()), Some(2.0)));
        assert_eq!(drain_of(&st, 2), (true, Some("second".into()), Some(3.0)));
        assert_eq!(a.changes.len(), 1);
    }

    #[test]
    fn overwrite_0_fills_a_missing_reason_but_keeps_timestamp() {
        let mut st = instance();
        st.apply(&drain(2.0, "1", None, Some(0)));
        st.apply(&drain(3.0, "1", Some("now with reason"), Some(0)));
        assert_eq!(
            drain_of(&st, 1),
            (true, Some("now with reason".into()), Some(2.0))
        );
    }

    #[test]
    fn overwrite_1_replaces_reason_keeps_timestamp() {
        let mut st = instance();
        st.apply(&drain(2.0, "1", Some("first"), Some(0)));
        st.apply(&drain(3.0, "1", Some("second"), Some(1)));
        assert_eq!(drain_of(&st, 1), (true, Some("second".into()), Some(2.0)));
        // overwrite 1 with no reason clears it
        st.apply(&drain(4.0, "1", None, Some(1)));
        assert_eq!(drain_of(&st, 1), (true, None, Some(2.0)));
    }

    #[test]
    fn overwrite_2_replaces_reason_and_timestamp() {
        let mut st = instance();
        st.apply(&drain(2.0, "1", Some("first"), Some(0)));
        st.apply(&drain(3.0, "1", Some("second"), Some(2)));
        assert_eq!(drain_of(&st, 1), (true, Some("second".into()), Some(3.0)));
    }

    #[test]
    fn missing_overwrite_counts_as_1() {
        let mut st = instance();
        st.apply(&drain(2.0, "1", Some("first"), None));
        st.apply(&drain(3.0, "1", Some("second"), None));
        assert_eq!(drain_of(&st, 1), (true, Some("second".into()), Some(2.0)));
    }

    #[test]
    fn overwrite_on_undrained_rank_drains_it() {
        for ow in 0..=2 {
            let mut st = instance();
            st.apply(&drain(2.0, "3", Some("r"), Some(ow)));
            assert_eq!(
                drain_of(&st, 3),
                (true, Some("r".into()), Some(2.0)),
                "ow={ow}"
            );
        }
    }

    #[test]
    fn bad_overwrite_is_reported_and_acts_as_nonzero() {
        let mut st = instance();
        st.apply(&drain(2.0, "1", Some("first"), Some(0)));
        let a = st.apply(&drain(3.0, "1", Some("second"), Some(7)));
        assert_eq!(kinds(&a), [AnomalyKind::InvalidContext]);
        assert_eq!(drain_of(&st, 1), (true, Some("second".into()), Some(2.0)));
        let a = st.apply(&ev(4.0, "drain", json!({"idset": "1", "overwrite": "x"})));
        assert_eq!(kinds(&a), [AnomalyKind::InvalidContext]);
    }

    #[test]
    fn undrain_clears_everything() {
        let mut st = instance();
        st.apply(&drain(2.0, "1-3", Some("r"), Some(0)));
        let a = st.apply(&ev(
            3.0,
            "undrain",
            json!({"idset": "1-2", "nodelist": "node[1-2]"}),
        ));
        assert!(a.anomalies.is_empty());
        assert_eq!(drain_of(&st, 1), (false, None, None));
        assert_eq!(drain_of(&st, 2), (false, None, None));
        assert_eq!(drain_of(&st, 3), (true, Some("r".into()), Some(2.0)));
        // undraining a rank that is not drained: no anomaly, no change
        let a = st.apply(&ev(4.0, "undrain", json!({"idset": "1"})));
        assert!(a.anomalies.is_empty());
        assert!(a.changes.is_empty());
    }

    #[test]
    fn drain_follows_the_host_when_the_mapping_changed() {
        let mut st = instance();
        // node2 is rank 2 now; the event (from an older life) says rank 0
        st.apply(&drain(2.0, "0", Some("r"), Some(0)).with_context(
            json!({"idset": "0", "nodelist": "node2", "reason": "r", "overwrite": 0}),
        ));
        assert!(!st.rank(0).unwrap().drained);
        assert!(st.rank(2).unwrap().drained);
        // a host that no longer exists: dropped, as flux-core does
        let a = st.apply(&ev(
            3.0,
            "drain",
            json!({"idset": "1", "nodelist": "gone9"}),
        ));
        assert!(a.anomalies.is_empty());
        assert!(!st.rank(1).unwrap().drained);
    }

    #[test]
    fn idsets_of_more_ranks_than_an_instance_can_have_are_refused() {
        // Found by the fuzzer: 166 million ranks drained by one line.
        let mut st = ResourceState::new();
        let a = st.apply(&ev(
            2.0,
            "drain",
            json!({"idset": "5-166688863", "reason": "x", "overwrite": 0}),
        ));
        assert_eq!(a.anomalies.len(), 1, "{:?}", a.anomalies);
        assert!(a.anomalies[0].message.contains("more than 131072"));
        assert!(a.changes.is_empty());
        let a = st.apply(&ev(
            3.0,
            "restart",
            json!({"ranks": "0-4294967294", "online": "", "nodelist": "n[0-3]"}),
        ));
        assert!(!a.anomalies.is_empty());
        assert!(st.instance_ranks().is_none());
        // The cap itself is fine.
        let a = st.apply(&ev(
            4.0,
            "drain",
            json!({"idset": "0-131071", "reason": "x", "overwrite": 0}),
        ));
        assert!(a.anomalies.is_empty(), "{:?}", a.anomalies);
        assert_eq!(st.drained().len(), 1 << 17);
    }

    #[test]
    fn drain_without_instance_learns_ranks_and_hosts() {
        let mut st = ResourceState::new();
        st.apply(&ev(
            2.0,
            "drain",
            json!({"idset": "5,7", "nodelist": "n[5,7]", "reason": "x", "overwrite": 0}),
        ));
        assert_eq!(st.hostname(5).as_deref(), Some("n5"));
        assert_eq!(st.hostname(7).as_deref(), Some("n7"));
        assert_eq!(st.drained().to_string(), "5,7");
        assert!(st.instance_ranks().is_none());
    }

    // ---- online / torpid / restart ----------------------------------------

    #[test]
    fn online_offline_torpid_lively() {
        let mut st = ResourceState::new();
        st.apply(&ev(
            1.0,
            "restart",
            json!({"ranks": "0-3", "online": "", "nodelist": "node[0-3]"}),
        ));
        assert_eq!(st.online().to_string(), "");
        st.apply(&ev(2.0, "online", json!({"idset": "0-3"})));
        st.apply(&ev(3.0, "torpid", json!({"idset": "2-3"})));
        assert!(st.rank(2).unwrap().torpid);
        st.apply(&ev(4.0, "lively", json!({"idset": "2"})));
        assert!(!st.rank(2).unwrap().torpid);
        // offline ends torpidity
        st.apply(&ev(5.0, "offline", json!({"idset": "3"})));
        let s3 = st.rank(3).unwrap();
        assert!(s3.online == Some(false) && !s3.torpid);
        let status = st.status_json();
        assert_eq!(status["online"], "0-2");
        assert_eq!(status["offline"], "3");
        assert_eq!(status["torpid"], "");
    }

    #[test]
    fn redundant_online_offline_are_reported() {
        let mut st = instance();
        let a = st.apply(&ev(2.0, "online", json!({"idset": "1"})));
        assert_eq!(kinds(&a), [AnomalyKind::UnexpectedEvent]);
        assert_eq!(a.anomalies[0].rank, Some(1));
        st.apply(&ev(3.0, "offline", json!({"idset": "1"})));
        let a = st.apply(&ev(4.0, "offline", json!({"idset": "1-2"})));
        assert_eq!(kinds(&a), [AnomalyKind::UnexpectedEvent]);
        // without the start of the life (KVS log, truncated journal): no check
        let mut st = ResourceState::new();
        st.apply(&Event::new(1.0, "truncate"));
        st.apply(&ev(2.0, "offline", json!({"idset": "1"})));
        assert!(
            st.apply(&ev(3.0, "offline", json!({"idset": "1"})))
                .anomalies
                .is_empty()
        );
    }

    #[test]
    fn restart_resets_liveness_but_keeps_drains() {
        let mut st = instance();
        st.apply(&ev(2.0, "torpid", json!({"idset": "1"})));
        st.apply(&drain(3.0, "2", Some("keep me"), Some(0)));
        let a = st.apply(&ev(
            10.0,
            "restart",
            json!({"ranks": "0-3", "online": "", "nodelist": "node[0-3]"}),
        ));
        assert!(a.anomalies.is_empty());
        assert!(st.ranks().all(|s| s.online == Some(false) && !s.torpid));
        assert_eq!(drain_of(&st, 2), (true, Some("keep me".into()), Some(3.0)));
        assert_eq!(st.restarts(), 2);
    }

    #[test]
    fn queues_take_their_nodes_from_the_instance_properties() {
        // Queue membership by an instance-local property (RFC 20 `+NAME`),
        // a virtual queue resolving to its parent's nodes.
        let mut st = instance();
        assert_eq!(st.queue_ranks("batch"), None, "no table sent yet");
        let a = st.apply_r(&json!({"version": 1, "execution": {
            "R_lite": [{"rank": "0-3", "children": {"core": "0-1"}}],
            "nodelist": ["node[0-3]"],
            "properties": {"+debug": "0-1", "gpu": "3", "bad": 7}}}));
        assert_eq!(a.anomalies.len(), 1, "the bad property is said");
        assert_eq!(st.properties().len(), 2);
        let a = st.apply(&ev(
            2.0,
            "queue-config",
            json!({"queues": {"debug": {"requires": ["+debug"]},
                              "batch": {"requires": ["^+debug"]},
                              "fast": {"parent": "batch"}}}),
        ));
        assert!(a.anomalies.is_empty() && a.changes.is_empty(), "{a:?}");
        let set = |s| IdSet::parse(s).unwrap();
        assert_eq!(st.queue_ranks("debug"), Some(set("0-1")));
        assert_eq!(st.queue_ranks("fast"), Some(set("2-3")));
        assert_eq!(
            st.queue_slices(),
            vec![("batch".into(), set("2-3")), ("debug".into(), set("0-1"))]
        );
        // Not part of the log's order: the events after it are not judged
        // by its stamp; one no newer than the table held is a resend.
        let a = st.apply(&ev(1.6, "drain", json!({"idset": "0", "reason": "x"})));
        assert!(a.anomalies.is_empty(), "{a:?}");
        let a = st.apply(&ev(1.5, "queue-config", json!({"queues": {"debug": {}}})));
        assert!(a.skipped_duplicate && a.anomalies.is_empty(), "{a:?}");
        let a = st.apply(&ev(2.5, "queue-config", json!({"queues": {"debug": {}}})));
        assert!(!a.skipped_duplicate && a.anomalies.is_empty(), "{a:?}");
        assert_eq!(st.queue_ranks("debug"), Some(set("0-3")));
        assert_eq!(st.queue_ranks("batch"), None);
        // A table flux-core would refuse leaves the one before.
        let a = st.apply(&ev(
            3.0,
            "queue-config",
            json!({"queues": {"v": {"parent": "p"}}}),
        ));
        assert_eq!(a.anomalies.len(), 1);
        assert!(st.queue_config().is_some_and(|q| q.contains("debug")));
        let a = st.apply(&ev(3.5, "queue-config", json!({})));
        assert_eq!(a.anomalies[0].kind, AnomalyKind::MissingContext);
        // Kept across a save: the checkpoint's encoding.
        let back: ResourceState = rmp_serde::from_slice(&rmp_serde::to_vec(&st).unwrap()).unwrap();
        assert_eq!(back.queue_ranks("debug"), Some(set("0-3")));
        assert_eq!(back.properties(), st.properties());
    }

    #[test]
    fn drains_map_hosts_with_the_brokers_hostmap_not_rs_nodelist() {
        // A test instance: brokers named node[0-3] (`--test-hosts`) on one
        // machine whose R says vm,vm,vm,vm. flux-core drains by rank and
        // checks the event's nodelist against the brokers' names.
        let mut st = instance();
        st.apply(&ev(1.5, "resource-define", json!({"method": "kvs"})));
        st.apply_r(&json!({"version": 1, "execution": {
            "R_lite": [{"rank": "0-3", "children": {"core": "0-1"}}],
            "nodelist": ["vm,vm,vm,vm"], "starttime": 0.0, "expiration": 0.0}}));
        assert_eq!(st.hostname(0).as_deref(), Some("vm"));
        st.apply(&ev(
            2.0,
            "drain",
            json!({"idset": "0", "nodelist": "node0", "reason": "while running", "overwrite": 1}),
        ));
        assert_eq!(
            drain_of(&st, 0),
            (true, Some("while running".into()), Some(2.0))
        );
        // A host that moved follows its host; one that is gone is dropped.
        st.apply(&ev(
            3.0,
            "drain",
            json!({"idset": "1", "nodelist": "node2", "reason": "moved"}),
        ));
        assert!(drain_of(&st, 2).0 && !drain_of(&st, 1).0);
        st.apply(&ev(
            4.0,
            "drain",
            json!({"idset": "3", "nodelist": "gone9", "reason": "x"}),
        ));
        assert!(!drain_of(&st, 3).0);
    }

    #[test]
    fn restart_can_shrink_the_instance() {
        let mut st = instance();
        let a = st.apply(&ev(
            10.0,
            "restart",
            json!({"ranks": "0-1", "online": "0", "nodelist": "node[0-1]"}),
        ));
        assert!(a.changes.iter().any(|c| c.rank == 3 && c.after.is_none()));
        assert_eq!(st.ranks().count(), 2);
        assert_eq!(st.status_json()["offline"], "1");
    }

    #[test]
    fn restart_maps_hostnames() {
        let st = instance();
        assert_eq!(st.hostname(0).as_deref(), Some("node0"));
        assert_eq!(st.hostname(3).as_deref(), Some("node3"));
        assert_eq!(st.hostname(4), None);
        assert_eq!(st.nodelist().map(|h| h.len()), Some(4));
    }

    #[test]
    fn resource_update_and_define() {
        let mut st = instance();
        let a = st.apply(&ev(
            2.0,
            "resource-define",
            json!({"method": "configuration"}),
        ));
        assert!(a.anomalies.is_empty());
        assert_eq!(st.define_method(), Some("configuration"));
        let a = st.apply(&ev(
            3.0,
            "resource-update",
            json!({"expiration": 1738009133.5}),
        ));
        assert!(a.anomalies.is_empty());
        assert_eq!(st.expiration(), Some(1738009133.5));
        let a = st.apply(&ev(
            4.0,
            "resource-update",
            json!({"expiration": 1738009200}),
        ));
        assert!(a.anomalies.is_empty());
        assert_eq!(st.expiration(), Some(1738009200.0));
    }

    #[test]
    fn apply_r_defines_ranks_and_hosts() {
        let mut st = ResourceState::new();
        let r = json!({"version": 1, "execution": {
            "R_lite": [{"rank": "0-1", "children": {"core": "0-3"}},
                       {"rank": "2-3", "children": {"core": "0-3"}}],
            "starttime": 0.0, "expiration": 1800000000.0, "nodelist": ["node[0-1]", "node[2-3]"]}});
        let a = st.apply_r(&r);
        assert!(a.anomalies.is_empty(), "{:?}", a.anomalies);
        assert_eq!(a.changes.len(), 4);
        assert_eq!(
            st.instance_ranks().map(|s| s.to_string()).as_deref(),
            Some("0-3")
        );
        assert_eq!(st.hostname(3).as_deref(), Some("node3"));
        assert_eq!(st.expiration(), Some(1800000000.0));
        // bad R: reported, nothing breaks
        assert_eq!(
            st.apply_r(&json!(3)).anomalies[0].kind,
            AnomalyKind::Malformed
        );
        let a = st.apply_r(&json!({"execution": {"R_lite": [{"rank": "x"}], "nodelist": 3}}));
        assert_eq!(a.anomalies.len(), 2);
        let a = st.apply_r(&json!({"execution": {"R_lite": [{"rank": "0-1"}], "nodelist": ["a"]}}));
        assert_eq!(kinds(&a), [AnomalyKind::InvalidContext]);
    }

    #[test]
    fn resource_init_old_format() {
        let mut st = ResourceState::new();
        st.apply(&drain(1.0, "9", Some("superseded"), None));
        let a = st.apply(&ev(
            2.0,
            "resource-init",
            json!({"restart": true, "online": "0-1", "exclude": "0",
                   "drain": {"2-3": {"timestamp": 1.5, "reason": "old"}, "4": {"timestamp": 1.7}}}),
        ));
        assert!(a.anomalies.is_empty(), "{:?}", a.anomalies);
        assert_eq!(drain_of(&st, 2), (true, Some("old".into()), Some(1.5)));
        assert_eq!(drain_of(&st, 4), (true, None, Some(1.7)));
        assert_eq!(drain_of(&st, 9), (false, None, None));
        assert!(st.rank(0).unwrap().excluded && st.rank(0).unwrap().online == Some(true));
        assert_eq!(st.status_json()["exclude"], "0");
        // broken resource-init: reported
        let a = st.apply(&ev(
            3.0,
            "resource-init",
            json!({"drain": {"x": {}}, "online": 3}),
        ));
        let k = kinds(&a);
        assert!(k.contains(&AnomalyKind::MissingContext)); // restart, exclude
        assert!(k.contains(&AnomalyKind::InvalidContext)); // drain key, online
    }

    #[test]
    fn status_json_groups_drains_like_flux() {
        let mut st = instance();
        st.apply(&drain(100.4, "0-1", Some("a"), Some(0)));
        st.apply(&drain(100.45, "2", Some("a"), Some(0)));
        st.apply(&drain(101.6, "3", None, Some(0)));
        let s = st.status_json();
        assert_eq!(
            s["drain"],
            json!({"0-2": {"timestamp": 100.0, "reason": "a"}, "3": {"timestamp": 102.0, "reason": ""}})
        );
    }

    // ---- anomalies ----------------------------------------------------------

    #[test]
    fn missing_and_invalid_idsets() {
        let mut st = instance();
        for (i, name) in ["online", "offline", "torpid", "lively", "drain", "undrain"]
            .iter()
            .enumerate()
        {
            let t = 10.0 + i as f64 * 4.0;
            assert_eq!(
                kinds(&st.apply(&Event::new(t, *name))),
                [AnomalyKind::MissingContext]
            );
            assert_eq!(
                kinds(&st.apply(&ev(t + 1.0, name, json!({"idset": "1-x"})))),
                [AnomalyKind::InvalidContext]
            );
            assert_eq!(
                kinds(&st.apply(&ev(t + 2.0, name, json!({"idset": 5})))),
                [AnomalyKind::InvalidContext]
            );
            assert_eq!(
                kinds(&st.apply(&ev(t + 3.0, name, json!({"idset": ""})))),
                [AnomalyKind::InvalidContext]
            );
        }
        // nothing changed
        assert_eq!(st.drained().to_string(), "");
        assert_eq!(st.online().to_string(), "0-3");
    }

    #[test]
    fn restart_context_errors() {
        let mut st = ResourceState::new();
        let a = st.apply(&ev(1.0, "restart", json!({})));
        assert_eq!(kinds(&a), [AnomalyKind::MissingContext; 3]);
        let a = st.apply(&ev(
            2.0,
            "restart",
            json!({"ranks": "0-1", "online": "", "nodelist": "a"}),
        ));
        assert_eq!(kinds(&a), [AnomalyKind::InvalidContext]); // 1 host for 2 ranks
        let a = st.apply(&ev(
            3.0,
            "restart",
            json!({"ranks": "", "online": "5", "nodelist": "a[1-"}),
        ));
        assert_eq!(
            kinds(&a),
            [
                AnomalyKind::InvalidContext,
                AnomalyKind::InvalidContext,
                AnomalyKind::UnknownRank
            ]
        );
    }

    #[test]
    fn ranks_outside_the_instance() {
        let mut st = instance();
        let a = st.apply(&ev(2.0, "offline", json!({"idset": "3-5"})));
        assert_eq!(
            kinds(&a),
            [AnomalyKind::UnknownRank, AnomalyKind::UnknownRank]
        );
        assert_eq!(a.anomalies[0].rank, Some(4));
        assert!(st.rank(4).is_none());
        let a = st.apply(&drain(3.0, "7", Some("x"), Some(0)));
        assert_eq!(kinds(&a), [AnomalyKind::UnknownRank]);
        assert!(st.rank(7).is_none());
    }

    #[test]
    fn an_instance_down_makes_every_rank_unknown_until_the_restart() {
        let mut st = instance();
        // a shutdown as flux-core 0.88 posts it: the leaves go offline
        st.apply(&ev(5.0, "offline", json!({"idset": "2-3"})));
        let a = st.apply(&ev(6.0, "instance-down", json!({"reason": "gone"})));
        assert_eq!(anomalies(std::slice::from_ref(&a)), []);
        assert_eq!(a.changes.len(), 4);
        assert!(st.ranks().all(|s| s.online.is_none() && !s.torpid));
        assert_eq!(st.down_since(), Some(6.0));
        assert_eq!(st.status_json()["unknown"], "0-3");
        // drains outlive it, and the next life knows again
        st.apply(&drain(7.0, "1", Some("x"), None));
        let a = st.apply(&ev(
            10.0,
            "restart",
            json!({"ranks": "0-3", "online": "0", "nodelist": "node[0-3]"}),
        ));
        assert_eq!(anomalies(std::slice::from_ref(&a)), []);
        assert_eq!(st.down_since(), None);
        assert_eq!(st.rank(0).unwrap().online, Some(true));
        assert_eq!(st.rank(3).unwrap().online, Some(false));
        assert!(st.rank(1).unwrap().drained);
    }

    #[test]
    fn unknown_event_names() {
        let mut st = instance();
        let a = st.apply(&Event::new(2.0, "frobnicate"));
        assert_eq!(kinds(&a), [AnomalyKind::UnknownEvent]);
    }

    #[test]
    fn define_and_update_errors() {
        let mut st = instance();
        assert_eq!(
            kinds(&st.apply(&Event::new(2.0, "resource-define"))),
            [AnomalyKind::MissingContext]
        );
        assert_eq!(
            kinds(&st.apply(&ev(3.0, "resource-define", json!({"method": "magic"})))),
            [AnomalyKind::InvalidContext]
        );
        assert_eq!(
            kinds(&st.apply(&Event::new(4.0, "resource-update"))),
            [AnomalyKind::MissingContext]
        );
        assert_eq!(
            kinds(&st.apply(&ev(5.0, "resource-update", json!({"expiration": "soon"})))),
            [AnomalyKind::InvalidContext]
        );
        assert_eq!(
            kinds(&st.apply(&ev(6.0, "resource-update", json!({"expiration": -1})))),
            [AnomalyKind::InvalidContext]
        );
    }

    #[test]
    fn truncate_rules() {
        let mut st = ResourceState::new();
        let a = st.apply(&Event::new(5.0, "truncate"));
        assert!(a.anomalies.is_empty());
        assert!(st.truncated());
        // not first, and with a context
        let a = st.apply(&ev(6.0, "truncate", json!({"x": 1})));
        assert_eq!(
            kinds(&a),
            [AnomalyKind::InvalidContext, AnomalyKind::UnexpectedEvent]
        );
        // a resent backlog's truncate marker is silently skipped
        let a = st.apply(&Event::new(5.5, "truncate"));
        assert!(a.skipped_duplicate && a.anomalies.is_empty());
    }

    #[test]
    fn out_of_order_is_reported_and_applied() {
        let mut st = instance();
        st.apply(&ev(5.0, "offline", json!({"idset": "1"})));
        let a = st.apply(&drain(4.0, "2", Some("late"), Some(0)));
        assert_eq!(kinds(&a), [AnomalyKind::OutOfOrder]);
        assert!(st.rank(2).unwrap().drained);
        assert_eq!(st.last_timestamp(), Some(5.0));
    }

    // ---- idempotence -----------------------------------------------------------

    #[test]
    fn restart_life_boundary() {
        let mut st = instance(); // restart at 1.0
        st.apply(&ev(2.0, "offline", json!({"idset": "3"})));
        st.apply(&ev(
            10.0,
            "restart",
            json!({"ranks": "0-3", "online": "", "nodelist": "node[0-3]"}),
        ));
        // a volatile event of the past life resent after the restart: skipped
        let a = st.apply(&ev(2.0, "offline", json!({"idset": "3"})));
        assert!(a.skipped_duplicate && a.anomalies.is_empty());
        // a new event older than the restart but newer than the past life
        let a = st.apply(&ev(5.0, "online", json!({"idset": "3"})));
        assert!(!a.skipped_duplicate);
        assert_eq!(kinds(&a), [AnomalyKind::OutOfOrder]);
        assert_eq!(st.rank(3).unwrap().online, Some(true));
    }

    #[test]
    fn exact_repeat_is_skipped() {
        let mut st = instance();
        let d = drain(2.0, "1", Some("x"), Some(0));
        assert!(!st.apply(&d).skipped_duplicate);
        let a = st.apply(&d);
        assert!(a.skipped_duplicate && a.changes.is_empty() && a.anomalies.is_empty());
        // same timestamp, different name: a different event
        let a = st.apply(&ev(2.0, "offline", json!({"idset": "3"})));
        assert!(!a.skipped_duplicate && a.anomalies.is_empty());
        assert_eq!(st.applied_count(), 3);
    }

    #[test]
    fn journal_after_restart_replays_old_drains_without_effect() {
        // Life 1: drain rank 1. Life 2's journal starts with the KVS drains
        // (older timestamps), then its restart.
        let mut st = instance();
        let d = drain(2.0, "1", Some("x"), Some(0));
        st.apply(&d);
        st.apply(&ev(3.0, "online", json!({"idset": "0"})));
        let before = st.status_json();
        let a = st.apply(&d);
        assert!(a.skipped_duplicate);
        let a = st.apply(&ev(
            10.0,
            "restart",
            json!({"ranks": "0-3", "online": "", "nodelist": "node[0-3]"}),
        ));
        assert!(a.anomalies.is_empty());
        assert_eq!(st.status_json()["drain"], before["drain"]);
        // A fresh consumer of life 2 sees the same drains.
        let mut fresh = ResourceState::new();
        assert!(fresh.apply(&d).anomalies.is_empty());
        fresh.apply(&ev(
            10.0,
            "restart",
            json!({"ranks": "0-3", "online": "", "nodelist": "node[0-3]"}),
        ));
        assert_eq!(fresh.status_json(), st.status_json());
    }

    // ---- corpus -------------------------------------------------------------------

    fn expected_status(rel: &str) -> Value {
        let mut v: Value = serde_json::from_str(&read(rel)).unwrap();
        if let Some(o) = v.as_object_mut() {
            o.remove("R");
        }
        v
    }

    #[test]
    fn corpus_a_journal_matches_resource_status() {
        let mut st = ResourceState::new();
        let applied = replay_journal(
            &mut st,
            &read("instances/A-incarnation1/resource.journal.jsonl"),
        );
        assert_eq!(anomalies(&applied), []);
        assert_eq!(
            st.status_json(),
            expected_status("instances/A-incarnation1/resource.status.rpc.json")
        );
        assert_eq!(st.hostname(2).as_deref(), Some("node2"));
        assert_eq!(st.define_method(), Some("configuration"));
        assert_eq!(
            st.instance_ranks().map(|s| s.to_string()).as_deref(),
            Some("0-3")
        );
    }

    #[test]
    fn corpus_a_journal_every_overwrite_mode_step_by_step() {
        let text = read("instances/A-incarnation1/resource.journal.jsonl");
        let mut st = ResourceState::new();
        let mut snapshots = Vec::new();
        for line in text.lines() {
            let msg: Value = serde_json::from_str(line).unwrap();
            for e in msg["events"].as_array().unwrap() {
                let e = Event::from_value(e.clone()).unwrap();
                st.apply(&e);
                snapshots.push((e.timestamp, drain_of(&st, 1), drain_of(&st, 2)));
            }
        }
        // serde_json's float parsing may differ from rustc's in the last bit
        let at = |ts: f64| {
            snapshots
                .iter()
                .find(|s| (s.0 - ts).abs() < 1e-6)
                .unwrap()
                .clone()
        };
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-6);
        let is = |got: (bool, Option<String>, Option<f64>), reason: &str, ts: f64| {
            got.0 && got.1.as_deref() == Some(reason) && close(got.2, ts)
        };
        let t_maint = 1795321305.2971418;
        assert!(is(at(t_maint).1, "maintenance: replace DIMM", t_maint));
        // overwrite 1: new reason, same timestamp
        assert!(is(at(1795321305.6626723).1, "forced new reason", t_maint));
        // overwrite 2: new reason and timestamp
        let t_forced = 1795321305.8395472;
        assert!(is(at(t_forced).1, "forced reason and timestamp", t_forced));
        // `drain -u` (overwrite 0) on 1-2: rank 1 keeps its reason, rank 2 drains
        let t_update = 1795321305.9843113;
        let s = at(t_update);
        assert!(is(s.1, "forced reason and timestamp", t_forced));
        assert!(is(s.2, "update-only reason", t_update));
        // undrain 1-2
        let s = at(1795321306.2785077);
        assert_eq!((s.1, s.2), ((false, None, None), (false, None, None)));
    }

    #[test]
    fn corpus_a_kvs_eventlog_alone() {
        let mut st = ResourceState::new();
        let applied = replay_log(&mut st, &read("instances/A-incarnation1/resource.eventlog"));
        assert_eq!(anomalies(&applied), []);
        assert_eq!(st.drained().to_string(), "");
        // hosts learned from drain nodelists
        assert_eq!(st.hostname(3).as_deref(), Some("node3"));
        assert_eq!(st.status_json()["drain"], json!({}));
    }

    #[test]
    fn corpus_b_two_lives_match_resource_status() {
        let mut st = ResourceState::new();
        let mut applied = replay_journal(
            &mut st,
            &read("instances/B/journals/incarnation1.resource.journal.jsonl"),
        );
        assert_eq!(st.online().to_string(), "0-3");
        applied.extend(replay_journal(
            &mut st,
            &read("instances/B/journals/incarnation2.resource.journal.jsonl"),
        ));
        assert_eq!(anomalies(&applied), []);
        assert_eq!(st.restarts(), 2);
        assert_eq!(st.define_method(), Some("kvs"));
        assert_eq!(
            st.status_json(),
            expected_status("instances/B/resource.status.raw.json")
        );
        assert!(st.ranks().all(|s| s.hostname.as_deref() == Some("vm")));
    }

    #[test]
    fn corpus_b_kvs_eventlog_alone() {
        let mut st = ResourceState::new();
        let applied = replay_log(&mut st, &read("instances/B/resource.eventlog"));
        assert_eq!(anomalies(&applied), []);
        assert_eq!(st.drained().to_string(), "");
        assert_eq!(st.define_method(), Some("kvs"));
    }

    #[test]
    fn corpus_duplicate_replay_changes_nothing() {
        for rel in [
            "instances/A-incarnation1/resource.journal.jsonl",
            "instances/B/journals/incarnation2.resource.journal.jsonl",
        ] {
            let text = read(rel);
            let mut st = ResourceState::new();
            replay_journal(&mut st, &text);
            let status = st.status_json();
            let ranks: Vec<RankState> = st.ranks().cloned().collect();
            let n = st.applied_count();
            for a in replay_journal(&mut st, &text) {
                assert!(
                    a.changes.is_empty() && a.anomalies.is_empty(),
                    "{rel}: {a:?}"
                );
            }
            assert_eq!(st.status_json(), status);
            assert_eq!(st.ranks().cloned().collect::<Vec<_>>(), ranks);
            assert_eq!(st.applied_count(), n);
        }
    }

    #[test]
    fn corpus_reconnect_mid_stream_resends_backlog() {
        let text = read("instances/A-incarnation1/resource.journal.jsonl");
        let lines: Vec<&str> = text.lines().collect();
        let mut once = ResourceState::new();
        replay_journal(&mut once, &text);
        for cut in 0..lines.len() {
            let mut st = ResourceState::new();
            replay_journal(&mut st, &lines[..cut].join("\n"));
            let applied = replay_journal(&mut st, &text);
            assert_eq!(anomalies(&applied), [], "cut {cut}");
            assert_eq!(st.status_json(), once.status_json(), "cut {cut}");
        }
    }

    /// The upstream thing2 log (old format): summary of what it breaks.
    fn thing2() -> (ResourceState, Vec<Anomaly>) {
        let mut st = ResourceState::new();
        let applied = replay_log(
            &mut st,
            &read("upstream-testdata/resource/resource.eventlog.thing2"),
        );
        (st, anomalies(&applied))
    }

    #[test]
    fn corpus_thing2_replays() {
        let (st, anomalies) = thing2();
        assert_eq!(st.applied_count(), 4611);
        assert_eq!(st.restarts(), 44);
        assert_eq!(anomalies, []);
        eprintln!("thing2 final: {}", st.status_json());
        assert!(st.ranks().all(|s| s.drained == s.drain_timestamp.is_some()));
        // a second replay of the whole log is a no-op
        let mut again = st.clone();
        let applied = replay_log(
            &mut again,
            &read("upstream-testdata/resource/resource.eventlog.thing2"),
        );
        assert!(
            applied
                .iter()
                .all(|a| a.skipped_duplicate && a.anomalies.is_empty())
        );
        assert_eq!(again.status_json(), st.status_json());
    }

    // ---- properties ------------------------------------------------------------------

    fn arb_idset() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u32..6).prop_map(|r| r.to_string()),
            (0u32..6, 0u32..6).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
            Just(String::new()),
            Just("x".to_string()),
            Just("4294967295".to_string()),
        ]
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        let names = prop::sample::select(vec![
            "restart",
            "online",
            "offline",
            "torpid",
            "lively",
            "drain",
            "undrain",
            "resource-define",
            "resource-update",
            "truncate",
            "resource-init",
            "queue-config",
            "bogus",
        ]);
        (
            1.0f64..50.0,
            names,
            arb_idset(),
            prop::option::of(0i64..4),
            prop::option::of("[a-c]{0,2}"),
            prop::option::of(prop::sample::select(vec!["n[0-5]", "n[0-2]", "x,y", "n[", ""])),
            any::<bool>(),
        )
            .prop_map(|(ts, name, ids, ow, reason, nl, noctx)| {
                let ts = (ts * 4.0).round() / 4.0; // make repeats likely
                if noctx {
                    return Event::new(ts, name);
                }
                let ctx = match name {
                    "restart" => json!({"ranks": "0-5", "online": ids, "nodelist": nl.unwrap_or("n[0-5]")}),
                    "resource-init" => json!({"restart": true, "online": ids, "exclude": "",
                                              "drain": {ids.clone(): {"timestamp": ts, "reason": reason}}}),
                    "resource-update" => json!({"expiration": ts}),
                    "resource-define" => json!({"method": reason.unwrap_or_default()}),
                    "queue-config" => json!({"queues": {reason.unwrap_or_default(): {"requires": [ids]}}}),
                    _ => json!({"idset": ids, "overwrite": ow, "reason": reason, "nodelist": nl}),
                };
                Event::new(ts, name).with_context(ctx)
            })
    }

    fn check_invariants(st: &ResourceState) {
        for s in st.ranks() {
            assert_eq!(s.drained, s.drain_timestamp.is_some(), "{s:?}");
            assert!(s.drained || s.drain_reason.is_none(), "{s:?}");
            if let Some(ranks) = st.instance_ranks() {
                assert!(ranks.contains(s.rank), "{s:?}");
            }
        }
        let _ = st.status_json();
    }

    proptest! {
        #[test]
        fn random_sequences_keep_invariants(events in prop::collection::vec(arb_event(), 0..60)) {
            let mut st = ResourceState::new();
            for e in &events {
                st.apply(e);
                check_invariants(&st);
            }
            // replaying everything again is a no-op
            let status = st.status_json();
            for e in &events {
                let a = st.apply(e);
                prop_assert!(a.skipped_duplicate);
            }
            prop_assert_eq!(st.status_json(), status);
        }

        #[test]
        fn random_json_never_panics(v in prop::collection::vec(("[a-z-]{1,10}", any::<Option<i64>>(), ".{0,8}"), 0..20)) {
            let mut st = ResourceState::new();
            for (i, (name, n, s)) in v.iter().enumerate() {
                let e = Event::new(1.0 + i as f64, name.as_str())
                    .with_context(json!({"idset": s, "overwrite": n, "ranks": s, "online": s,
                                         "nodelist": s, "drain": s, "method": n}));
                st.apply(&e);
                st.apply_r(&json!({"execution": {"R_lite": [{"rank": s}], "nodelist": [s]}}));
                check_invariants(&st);
            }
        }
    }
}
