//! The alert engine: which conditions hold for which job or node, since
//! when, and a timer per condition that fires the alert when the
//! condition has held for the rule's duration.
//!
//! Timers sit in a queue per cluster (each cluster may have its own
//! clock), earliest deadline first; a condition that clears cancels its
//! timer, so nothing is ever scanned but the timers that are due.
//!
//! A job's conditions live in its entry in the job table ([`Conditions`],
//! reached through [`JobConditions`]): the engine keeps no table of jobs of
//! its own, and a state change looks up its job once. Nodes are few; the
//! engine keeps theirs.
//!
//! All times are event times (seconds since the epoch): a condition begins
//! at the event that started it. The caller owns the clock and passes
//! "now" to [`Engine::advance`]. A condition that clears after its deadline
//! but before the clock reached it (a backlog read faster than real time)
//! still fires, and resolves at once: the job was stuck, whenever we
//! learned of it.

pub use super::event::{
    AlertEvent, Detail, Drain, NodeKey, Queued, SharedDetails, Status, Subject,
};
use super::few::Few;
use super::firing::{AlertPosition, FiringIndex};
use super::rule::Rule;
pub use super::saved::{SavedCondition, SavedConditions};
use super::timers::{TimerId, TimerQueue};
use crate::flux::job::JobState;
use crate::flux::jobid::JobId;
use crate::keyed::JobKey;
use crate::keyed::key::JobKeyRef;
use foldhash::HashMap;
use smallvec::SmallVec;
use std::borrow::Borrow;
use std::sync::Arc;

/// One rule's condition holding for one subject, as observed.
pub type Holds = Option<(f64, Detail)>;

/// The same with the detail lent (one detail shared by a job's rules).
pub type HoldsRef<'a> = Option<(f64, &'a Detail)>;

/// A condition that holds for a subject.
#[derive(Debug, Clone)]
pub(super) struct Active {
    pub(super) rule: u16,
    pub(super) since: f64,
    /// When it fires: [`Active::starts`], later if the subject's records
    /// came late.
    pub(super) deadline: f64,
    /// Its timer, until it fires.
    pub(super) timer: Option<TimerId>,
    pub(super) fired: bool,
    pub(super) detail: Detail,
}

impl Active {
    /// The condition's start plus its rule's duration: when its alert
    /// starts. Worked out, not kept: every job's condition would carry it.
    pub(super) fn starts(&self, rules: &[Rule]) -> f64 {
        self.since + rules.get(self.rule as usize).map_or(0.0, |r| r.hold_secs)
    }
}

/// A subject's conditions: most hold none or one at a time, and one is
/// kept inline (no allocation per condition, none freed when it clears).
pub(super) type List = Few<Active>;

/// A job's alert conditions, kept in its entry in the job table: one
/// inline, more (rare) beside it.
#[derive(Debug, Clone, Default)]
pub struct Conditions(pub(super) List);

impl Conditions {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn edit<R>(&mut self, f: impl FnOnce(&mut List) -> R) -> R {
        f(&mut self.0)
    }
}

/// Where jobs' conditions are kept: the job table, one [`Conditions`] in
/// each job's entry.
pub trait JobConditions {
    /// A held job's conditions.
    fn conditions_of(&self, key: &JobKey) -> Option<&Conditions>;
    /// The same, to change.
    fn conditions_mut(&mut self, key: &JobKey) -> Option<&mut Conditions>;
    /// Every held job's conditions.
    fn conditions(&self) -> impl Iterator<Item = (JobKeyRef<'_>, &Conditions)>;
    /// The same, to change.
    fn conditions_all_mut(&mut self) -> impl Iterator<Item = (JobKeyRef<'_>, &mut Conditions)>;
}

/// One cluster's timers. A timer names its subject without the cluster
/// (the queue's own name serves), and its rule.
#[derive(Debug)]
pub(super) struct ClusterTimers {
    cluster: Arc<str>,
    queue: TimerQueue<Fire>,
}

/// The subject of a timer, within its cluster.
#[derive(Debug, Clone, Copy)]
pub(super) enum Due {
    Job(JobId),
    Node(u32),
}

/// A timer's payload: its subject within the cluster and its rule, 4-aligned
/// in 12 bytes so that a timer's slot takes 16, not 32 (a million pending
/// jobs hold about a million timers).
#[derive(Debug, Clone, Copy)]
pub(super) struct Fire {
    /// The job's id or the node's rank, in halves: a `u64` would align the
    /// payload to 8.
    subject: [u32; 2],
    rule: u16,
    kind: FireKind,
}

#[derive(Debug, Clone, Copy)]
enum FireKind {
    Job,
    Node,
}

impl Fire {
    fn new(due: Due, rule: u16) -> Fire {
        let (kind, id) = match due {
            Due::Job(id) => (FireKind::Job, id.0),
            Due::Node(rank) => (FireKind::Node, u64::from(rank)),
        };
        Fire {
            subject: [id as u32, (id >> 32) as u32],
            rule,
            kind,
        }
    }

    fn due(self) -> Due {
        let [lo, hi] = self.subject;
        match self.kind {
            FireKind::Job => Due::Job(JobId(u64::from(lo) | (u64::from(hi) << 32))),
            FireKind::Node => Due::Node(lo),
        }
    }
}

/// The bytes of a timer's slot, for the README's memory table.
#[cfg(test)]
pub(crate) const TIMER_SLOT_BYTES: usize = super::timers::slot_bytes::<Fire>();

impl ClusterTimers {
    fn subject(&self, due: Due) -> Subject {
        match due {
            Due::Job(id) => Subject::Job(JobKey {
                cluster: self.cluster.clone(),
                id,
            }),
            Due::Node(rank) => Subject::Node(NodeKey {
                cluster: self.cluster.to_string(),
                rank,
            }),
        }
    }
}

/// What a timer needs of its subject's key: its cluster and who it is
/// within it.
pub(super) trait TimerSubject {
    fn cluster(&self) -> &str;
    fn due(&self) -> Due;
    /// The cluster's name, for a cluster's first timer.
    fn cluster_name(&self) -> Arc<str> {
        Arc::from(self.cluster())
    }
}

impl TimerSubject for JobKey {
    fn cluster(&self) -> &str {
        &self.cluster
    }
    fn due(&self) -> Due {
        Due::Job(self.id)
    }
    fn cluster_name(&self) -> Arc<str> {
        self.cluster.clone()
    }
}

impl TimerSubject for NodeKey {
    fn cluster(&self) -> &str {
        &self.cluster
    }
    fn due(&self) -> Due {
        Due::Node(self.rank)
    }
}

impl TimerSubject for Subject {
    fn cluster(&self) -> &str {
        Subject::cluster(self)
    }
    fn due(&self) -> Due {
        match self {
            Subject::Job(k) => k.due(),
            Subject::Node(n) => n.due(),
        }
    }
    fn cluster_name(&self) -> Arc<str> {
        match self {
            Subject::Job(k) => k.cluster_name(),
            Subject::Node(n) => n.cluster_name(),
        }
    }
}

/// Every cluster's timers, and a bound on their earliest deadline: a look
/// for due timers (made for every record on the event clock) returns at
/// once when no clock has reached it.
#[derive(Debug)]
pub(super) struct Timers {
    by_cluster: HashMap<String, ClusterTimers>,
    /// At or before every deadline that can fire: lowered as timers are
    /// set, raised to the queues' true earliest after each round of
    /// firing. A cancel leaves it low, which costs one look.
    earliest: f64,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            by_cluster: HashMap::default(),
            earliest: f64::INFINITY,
        }
    }
}

impl Timers {
    fn get(&self, cluster: &str) -> Option<&ClusterTimers> {
        self.by_cluster.get(cluster)
    }

    fn get_mut(&mut self, cluster: &str) -> Option<&mut ClusterTimers> {
        self.by_cluster.get_mut(cluster)
    }

    fn values(&self) -> impl Iterator<Item = &ClusterTimers> {
        self.by_cluster.values()
    }

    /// The earliest deadline of any queue, taken again.
    fn measure(&mut self) {
        self.earliest = self
            .values()
            .filter_map(|t| t.queue.next_deadline())
            .fold(f64::INFINITY, f64::min);
    }
}

/// Set a timer in the subject's cluster.
pub(super) fn set_timer(
    timers: &mut Timers,
    subject: &impl TimerSubject,
    deadline: f64,
    rule: u16,
) -> TimerId {
    let payload = Fire::new(subject.due(), rule);
    // A deadline that is not a number never fires: no bound needed.
    timers.earliest = timers.earliest.min(deadline);
    // Looked up before inserted: the cluster's name is copied once, not
    // for every timer.
    if let Some(t) = timers.get_mut(subject.cluster()) {
        return t.queue.insert(deadline, payload);
    }
    timers
        .by_cluster
        .entry(subject.cluster().to_string())
        .or_insert_with(|| ClusterTimers {
            cluster: subject.cluster_name(),
            queue: TimerQueue::default(),
        })
        .queue
        .insert(deadline, payload)
}

pub(super) fn cancel_timer(timers: &mut Timers, cluster: &str, timer: Option<TimerId>) {
    if let (Some(id), Some(t)) = (timer, timers.get_mut(cluster)) {
        t.queue.cancel(id);
    }
}

/// Alert state for every subject.
#[derive(Debug, Default)]
pub struct Engine {
    pub(super) rules: Vec<Rule>,
    /// Per job state (by [`JobState::index`]), the job rules that can hold
    /// for a job in it, in rule order: a job's rules are looked at on
    /// every change of its state, most of them about other states.
    job_rules: [Vec<usize>; JobState::ALL.len()],
    pub(super) nodes: HashMap<NodeKey, List>,
    pub(super) timers: Timers,
    /// The fired conditions, in the order they are listed.
    pub(super) firing: FiringIndex,
    /// The details jobs' conditions share.
    pub(super) details: SharedDetails,
}

impl Engine {
    pub fn new(rules: Vec<Rule>) -> Self {
        let rules: Vec<Rule> = rules.into_iter().take(u16::MAX as usize).collect();
        let job_rules = JobState::ALL.map(|state| {
            (0..rules.len())
                .filter(|&i| rules[i].kind.can_hold_in(state))
                .collect()
        });
        Engine {
            rules,
            job_rules,
            ..Engine::default()
        }
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The job rules that can hold in `state` (as [`Engine::job_rules_in`]),
    /// and the details the conditions of jobs share, to make one from
    /// while the rules are read.
    pub fn job_rules_and_details(
        &mut self,
        state: JobState,
    ) -> (impl Iterator<Item = (usize, &Rule)>, &mut SharedDetails) {
        let rules = &self.rules;
        let indices = self.job_rules[state.index()].iter();
        (
            indices.filter_map(|&i| Some((i, rules.get(i)?))),
            &mut self.details,
        )
    }

    /// Indices of the job rules and of the node rules.
    pub fn rules_for(&self, jobs: bool) -> impl Iterator<Item = (usize, &Rule)> {
        self.rules
            .iter()
            .enumerate()
            .filter(move |(_, r)| r.kind.is_job() == jobs)
    }

    /// Indices of the job rules that can hold for a job in `state`.
    pub fn job_rules_in(&self, state: JobState) -> impl Iterator<Item = (usize, &Rule)> {
        self.job_rules[state.index()]
            .iter()
            .filter_map(|&i| Some((i, self.rules.get(i)?)))
    }

    /// Alerts firing now.
    pub fn firing(&self) -> usize {
        self.firing.len()
    }

    /// Conditions holding now (firing or waiting for their duration).
    pub fn pending_timers(&self) -> usize {
        self.timers.values().map(|t| t.queue.len()).sum()
    }

    fn ledger(&mut self) -> (Ledger<'_>, &mut HashMap<NodeKey, List>) {
        let ledger = Ledger {
            rules: &self.rules,
            timers: &mut self.timers,
            firing: &mut self.firing,
        };
        (ledger, &mut self.nodes)
    }

    /// Record which of a job's rules hold, given as (rule index, holds);
    /// a condition of a rule not listed, or listed as not holding, clears.
    /// `conditions` are the job's, from its entry. `at` is the time of the
    /// event that prompted the observation: a condition that no longer
    /// holds cleared then.
    ///
    /// `lag` is how far this subject's records run behind the clock (0 when
    /// live). A new condition's timer is pushed back by it, so a job read
    /// late (a dump folder read file by file) is judged by its own time,
    /// not by the newest time of the other jobs.
    pub fn observe_job<D: Borrow<Detail>>(
        &mut self,
        conditions: &mut Conditions,
        key: &JobKey,
        holds: &[(usize, Option<(f64, D)>)],
        at: f64,
        lag: f64,
        out: &mut Vec<AlertEvent>,
    ) {
        if conditions.is_empty() && holds.iter().all(|(_, h)| h.is_none()) {
            return;
        }
        let (mut ledger, _) = self.ledger();
        let subject = || Subject::Job(key.clone());
        conditions.edit(|list| ledger.observe(list, key, subject, holds, (at, lag), out));
    }

    /// The same for a node.
    pub fn observe_node<D: Borrow<Detail>>(
        &mut self,
        key: &NodeKey,
        holds: &[(usize, Option<(f64, D)>)],
        at: f64,
        lag: f64,
        out: &mut Vec<AlertEvent>,
    ) {
        let (mut ledger, nodes) = self.ledger();
        let subject = || Subject::Node(key.clone());
        match nodes.get_mut(key) {
            Some(list) => {
                ledger.observe(list, key, subject, holds, (at, lag), out);
                if list.is_empty() {
                    nodes.remove(key);
                }
            }
            None => {
                let mut list = List::new();
                ledger.observe(&mut list, key, subject, holds, (at, lag), out);
                if !list.is_empty() {
                    nodes.insert(key.clone(), list);
                }
            }
        }
    }

    /// Every condition of a job clears (the job is gone): `conditions`,
    /// taken from its entry.
    pub fn forget_job(
        &mut self,
        conditions: Conditions,
        key: &JobKey,
        at: f64,
        out: &mut Vec<AlertEvent>,
    ) {
        if conditions.is_empty() {
            return;
        }
        let (mut ledger, _) = self.ledger();
        let subject = Subject::Job(key.clone());
        for a in conditions.0 {
            ledger.clear(&subject, a, at, out);
        }
    }

    /// Every condition of a node clears (the node is gone).
    pub fn forget_node(&mut self, key: &NodeKey, at: f64, out: &mut Vec<AlertEvent>) {
        let (mut ledger, nodes) = self.ledger();
        let Some(list) = nodes.remove(key) else {
            return;
        };
        let subject = Subject::Node(key.clone());
        for a in list {
            ledger.clear(&subject, a, at, out);
        }
    }

    /// The earliest deadline still to come in a cluster.
    pub fn next_deadline(&self, cluster: &str) -> Option<f64> {
        self.timers
            .get(cluster)
            .and_then(|t| t.queue.next_deadline())
    }

    /// Fire the alerts whose deadline is at or before their cluster's
    /// clock (`None`: the cluster has no clock yet). At most `limit` fire
    /// in one call, so a million due timers cannot stall the caller;
    /// returns whether more are due.
    pub fn advance(
        &mut self,
        clock: impl Fn(&str) -> Option<f64>,
        limit: usize,
        jobs: &mut impl JobConditions,
        out: &mut Vec<AlertEvent>,
    ) -> bool {
        let more = self.fire(clock, limit, jobs, out);
        self.timers.measure();
        more
    }

    /// The earliest deadline of any timer, or a time before it: no alert
    /// fires while every clock is short of it.
    pub fn earliest_deadline(&self) -> f64 {
        self.timers.earliest
    }

    fn fire(
        &mut self,
        clock: impl Fn(&str) -> Option<f64>,
        limit: usize,
        jobs: &mut impl JobConditions,
        out: &mut Vec<AlertEvent>,
    ) -> bool {
        let mut fired = 0;
        for timers in self.timers.by_cluster.values_mut() {
            // The name the timers share with the jobs' keys (compared by
            // address where the clock holds it too).
            let Some(now) = clock(&timers.cluster) else {
                continue;
            };
            while timers.queue.next_deadline().is_some_and(|d| d <= now) {
                if fired >= limit {
                    return true;
                }
                let Some((id, _, fire)) = timers.queue.pop_due(now) else {
                    break;
                };
                let (due, rule) = (fire.due(), fire.rule);
                let subject = timers.subject(due);
                let actives = match &subject {
                    Subject::Job(k) => jobs.conditions_mut(k).map(|c| &mut c.0[..]),
                    Subject::Node(n) => self.nodes.get_mut(n).map(|l| &mut l[..]),
                };
                let Some(a) = actives.and_then(|list| {
                    list.iter_mut()
                        .find(|a| a.rule == rule && a.timer == Some(id))
                }) else {
                    continue;
                };
                a.timer = None;
                a.fired = true;
                self.firing.insert(&timers.cluster, due, rule, a.since);
                fired += 1;
                out.push(AlertEvent {
                    rule: rule as usize,
                    status: Status::Firing,
                    since: a.since,
                    starts_at: a.starts(&self.rules),
                    ends_at: None,
                    detail: a.detail.clone(),
                    subject,
                });
            }
        }
        false
    }
}

impl Engine {
    /// The first `limit` alerts firing now after `after`, as the alerts
    /// stream announced them, in one cluster or all, with their places;
    /// and how many fire there in all. The work is the page's.
    pub fn firing_page<J: JobConditions>(
        &self,
        jobs: &J,
        cluster: Option<&str>,
        after: Option<&AlertPosition>,
        limit: usize,
    ) -> (Vec<(AlertPosition, AlertEvent)>, usize) {
        let page = self
            .firing
            .page(cluster, after, limit)
            .into_iter()
            .filter_map(|p| {
                let event = self.fired(jobs, &p)?;
                Some((p, event))
            })
            .collect();
        (page, self.firing.count(cluster))
    }

    /// The alert fired at a place of the index, from its subject's
    /// conditions.
    fn fired<J: JobConditions>(&self, jobs: &J, p: &AlertPosition) -> Option<AlertEvent> {
        let (subject, list) = if p.kind == 0 {
            let key = JobKey {
                cluster: p.cluster.clone(),
                id: JobId(p.id),
            };
            let list = &jobs.conditions_of(&key)?.0[..];
            (Subject::Job(key), list)
        } else {
            let key = NodeKey {
                cluster: p.cluster.to_string(),
                rank: u32::try_from(p.id).ok()?,
            };
            let list = &self.nodes.get(&key)?[..];
            (Subject::Node(key), list)
        };
        let a = list
            .iter()
            .find(|a| usize::from(a.rule) == p.rule && a.fired)?;
        self.events_of(subject, std::slice::from_ref(a))
            .next()
            .map(|(event, _)| event)
    }

    /// A job's conditions, fired or not, as alert events, each with whether
    /// it has fired: a fired one as announced, the others with the time
    /// they are due to fire as `starts_at`.
    pub fn job_conditions(&self, key: &JobKey, conditions: &Conditions) -> Vec<(AlertEvent, bool)> {
        self.events_of(Subject::Job(key.clone()), &conditions.0)
            .collect()
    }

    fn events_of<'a>(
        &'a self,
        subject: Subject,
        list: &'a [Active],
    ) -> impl Iterator<Item = (AlertEvent, bool)> + 'a {
        list.iter()
            .filter(|a| self.rules.get(a.rule as usize).is_some())
            .map(move |a| {
                let event = AlertEvent {
                    rule: a.rule as usize,
                    subject: subject.clone(),
                    status: Status::Firing,
                    since: a.since,
                    starts_at: a.starts(&self.rules),
                    ends_at: None,
                    detail: a.detail.clone(),
                };
                (event, a.fired)
            })
    }

    /// Drop a job's conditions (taken from its entry) without resolving
    /// them: its state moved to another member of the group, which carries
    /// them on. Returns the rules of those that had fired.
    pub fn release_job(&mut self, conditions: Conditions, key: &JobKey) -> Vec<usize> {
        self.release_list(conditions.0, &key.cluster, key.due())
    }

    /// The same for a node.
    pub fn release_node(&mut self, key: &NodeKey) -> Vec<usize> {
        let list = self.nodes.remove(key).unwrap_or_default();
        self.release_list(list, &key.cluster, key.due())
    }

    fn release_list(&mut self, list: List, cluster: &str, due: Due) -> Vec<usize> {
        let mut fired = Vec::new();
        for a in list {
            if a.fired {
                self.firing.remove(cluster, due, a.rule, a.since);
                fired.push(a.rule as usize);
            } else {
                cancel_timer(&mut self.timers, cluster, a.timer);
            }
        }
        fired
    }

    /// Every node subject of a cluster with conditions.
    pub fn node_subjects(&self, cluster: &str) -> Vec<NodeKey> {
        self.nodes
            .keys()
            .filter(|k| k.cluster == cluster)
            .cloned()
            .collect()
    }
}

impl Engine {
    /// At the end of a finite input (a replay): fire every alert whose
    /// condition had held for its duration by its cluster's clock,
    /// ignoring the delay given to subjects read late: their logs end
    /// while the condition holds.
    pub fn flush(
        &mut self,
        clock: impl Fn(&str) -> Option<f64>,
        jobs: &mut impl JobConditions,
        out: &mut Vec<AlertEvent>,
    ) {
        let firing = &mut self.firing;
        let rules = &self.rules;
        for (subject, list) in jobs
            .conditions_all_mut()
            .filter(|(_, c)| !c.is_empty())
            .map(|(k, c)| (Subject::Job(k.to_key()), &mut c.0[..]))
            .chain(
                self.nodes
                    .iter_mut()
                    .map(|(k, l)| (Subject::Node(k.clone()), &mut l[..])),
            )
        {
            let Some(now) = clock(subject.cluster()) else {
                continue;
            };
            for a in list
                .iter_mut()
                .filter(|a| !a.fired && a.starts(rules) <= now)
            {
                cancel_timer(&mut self.timers, subject.cluster(), a.timer.take());
                a.fired = true;
                firing.insert(subject.cluster(), subject.due(), a.rule, a.since);
                out.push(AlertEvent {
                    rule: a.rule as usize,
                    subject: subject.clone(),
                    status: Status::Firing,
                    since: a.since,
                    starts_at: a.starts(rules),
                    ends_at: None,
                    detail: a.detail.clone(),
                });
            }
        }
    }
}

/// What observing a subject updates besides its conditions: the timers
/// and what fires (with the rules, read).
struct Ledger<'a> {
    rules: &'a [Rule],
    timers: &'a mut Timers,
    firing: &'a mut FiringIndex,
}

impl Ledger<'_> {
    /// Observe a subject whose conditions are `list` (empty for a subject
    /// with none yet); `list` is left at its exact size.
    fn observe<D: Borrow<Detail>>(
        &mut self,
        list: &mut List,
        key: &impl TimerSubject,
        subject: impl FnOnce() -> Subject,
        holds: &[(usize, Option<(f64, D)>)],
        (at, lag): (f64, f64),
        out: &mut Vec<AlertEvent>,
    ) {
        let lag = if lag.is_finite() { lag.max(0.0) } else { 0.0 };
        // What held and is not said to hold now clears.
        let mut cleared: SmallVec<[Active; 2]> = SmallVec::new();
        let mut i = 0;
        while i < list.len() {
            let rule = list[i].rule as usize;
            if holds.iter().any(|(r, h)| *r == rule && h.is_some()) {
                i += 1;
            } else {
                cleared.push(list.swap_remove(i));
            }
        }
        // In rule order, as the rules are listed.
        cleared.sort_by_key(|a: &Active| a.rule);
        for (rule, h) in holds {
            let Some((since, detail)) = h else { continue };
            let detail = detail.borrow();
            match list.iter_mut().find(|a| a.rule as usize == *rule) {
                Some(a) => {
                    if !a.fired && a.detail != *detail {
                        a.detail = detail.clone();
                    }
                }
                None => {
                    let a = self.activate(*rule, *since, lag, detail.clone(), key);
                    list.push(a);
                }
            }
        }
        if !cleared.is_empty() {
            if list.spilled() && list.len() <= 1 {
                list.shrink_to_fit();
            }
            let subject = subject();
            for a in cleared {
                self.clear(&subject, a, at, out);
            }
        }
    }

    fn activate(
        &mut self,
        rule: usize,
        since: f64,
        lag: f64,
        detail: Detail,
        subject: &impl TimerSubject,
    ) -> Active {
        let hold = self.rules.get(rule).map_or(0.0, |r| r.hold_secs);
        let starts = since + hold;
        let deadline = starts + lag;
        let timer = set_timer(self.timers, subject, deadline, rule as u16);
        Active {
            rule: rule as u16,
            since,
            deadline,
            timer: Some(timer),
            fired: false,
            detail,
        }
    }

    /// A condition cleared at `at`: resolve its alert, or, if it was due
    /// but never fired, fire and resolve it.
    fn clear(&mut self, subject: &Subject, a: Active, at: f64, out: &mut Vec<AlertEvent>) {
        let deadline = a.starts(self.rules);
        let event = |status, ends_at| AlertEvent {
            rule: a.rule as usize,
            subject: subject.clone(),
            status,
            since: a.since,
            starts_at: deadline,
            ends_at,
            detail: a.detail.clone(),
        };
        let ends = at.max(deadline);
        if a.fired {
            self.firing
                .remove(subject.cluster(), subject.due(), a.rule, a.since);
            out.push(event(Status::Resolved, Some(ends)));
            return;
        }
        cancel_timer(self.timers, subject.cluster(), a.timer);
        if deadline <= at {
            out.push(event(Status::Firing, None));
            out.push(event(Status::Resolved, Some(ends)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::jobid::JobId;
    use crate::keyed::alerts::rule::RuleKind;
    use proptest::prelude::*;

    #[test]
    fn a_timer_slot_takes_16_bytes() {
        assert_eq!(TIMER_SLOT_BYTES, 16);
    }

    proptest! {
        /// A timer's payload gives back the subject and rule it was set with.
        #[test]
        fn a_timer_payload_round_trips(id in any::<u64>(), rank in any::<u32>(), rule in any::<u16>()) {
            let job = Fire::new(Due::Job(JobId(id)), rule);
            prop_assert!(matches!(job.due(), Due::Job(JobId(i)) if i == id));
            prop_assert_eq!(job.rule, rule);
            let node = Fire::new(Due::Node(rank), rule);
            prop_assert!(matches!(node.due(), Due::Node(r) if r == rank));
            prop_assert_eq!(node.rule, rule);
        }
    }

    /// A job table as the engine sees it: each job's conditions by key.
    #[derive(Default)]
    struct Jobs(HashMap<JobKey, Conditions>);

    impl JobConditions for Jobs {
        fn conditions_of(&self, key: &JobKey) -> Option<&Conditions> {
            self.0.get(key)
        }
        fn conditions_mut(&mut self, key: &JobKey) -> Option<&mut Conditions> {
            self.0.get_mut(key)
        }
        fn conditions(&self) -> impl Iterator<Item = (JobKeyRef<'_>, &Conditions)> {
            self.0.iter().map(|(k, c)| (k.lend(), c))
        }
        fn conditions_all_mut(&mut self) -> impl Iterator<Item = (JobKeyRef<'_>, &mut Conditions)> {
            self.0.iter_mut().map(|(k, c)| (k.lend(), c))
        }
    }

    /// The engine with the job table a shard would hand it, and calls by
    /// subject as the shard makes them.
    struct E {
        e: Engine,
        jobs: Jobs,
    }

    impl std::ops::Deref for E {
        type Target = Engine;
        fn deref(&self) -> &Engine {
            &self.e
        }
    }

    impl std::ops::DerefMut for E {
        fn deref_mut(&mut self) -> &mut Engine {
            &mut self.e
        }
    }

    impl E {
        fn observe_job(
            &mut self,
            key: &JobKey,
            holds: &[(usize, Holds)],
            at: f64,
            lag: f64,
            out: &mut Vec<AlertEvent>,
        ) {
            let c = self.jobs.0.entry(key.clone()).or_default();
            self.e.observe_job(c, key, holds, at, lag, out);
        }
        fn advance(
            &mut self,
            clock: impl Fn(&str) -> Option<f64>,
            limit: usize,
            out: &mut Vec<AlertEvent>,
        ) -> bool {
            self.e.advance(clock, limit, &mut self.jobs, out)
        }
        fn flush(&mut self, clock: impl Fn(&str) -> Option<f64>, out: &mut Vec<AlertEvent>) {
            self.e.flush(clock, &mut self.jobs, out);
        }
        fn forget(&mut self, subject: &Subject, at: f64, out: &mut Vec<AlertEvent>) {
            match subject {
                Subject::Job(k) => {
                    let c = self.jobs.0.remove(k).unwrap_or_default();
                    self.e.forget_job(c, k, at, out);
                }
                Subject::Node(n) => self.e.forget_node(n, at, out),
            }
        }
        fn saved_for(&self, subject: &Subject) -> Vec<SavedCondition> {
            match subject {
                Subject::Job(k) => self
                    .jobs
                    .0
                    .get(k)
                    .map(|c| self.e.saved_job(k, c))
                    .unwrap_or_default(),
                Subject::Node(n) => self
                    .e
                    .saved_for_nodes(&n.cluster)
                    .into_iter()
                    .filter(|c| c.subject == *subject)
                    .collect(),
            }
        }
        fn saved(&self) -> SavedConditions<'_, Jobs> {
            self.e.saved(&self.jobs)
        }
        /// The jobs named are held (their entries restored first).
        fn restore(&mut self, saved: Vec<SavedCondition>) -> Vec<AlertEvent> {
            for c in &saved {
                if let Subject::Job(k) = &c.subject {
                    self.jobs.0.entry(k.clone()).or_default();
                }
            }
            self.e.restore(saved, &mut self.jobs)
        }
    }

    fn engine() -> E {
        E {
            e: engine_alone(),
            jobs: Jobs::default(),
        }
    }

    fn engine_alone() -> Engine {
        Engine::new(vec![
            Rule::new(
                "sched",
                RuleKind::JobState(JobState::Sched),
                "100s",
                "warning",
            )
            .unwrap(),
            Rule::new("drained", RuleKind::NodeDrained, "10s", "info").unwrap(),
        ])
    }

    fn job(id: u64) -> JobKey {
        JobKey {
            cluster: "c".into(),
            id: JobId(id),
        }
    }

    const SCHED: Detail = Detail::State(JobState::Sched);

    fn statuses(out: &[AlertEvent]) -> Vec<(Status, f64, Option<f64>)> {
        out.iter()
            .map(|e| (e.status, e.starts_at, e.ends_at))
            .collect()
    }

    #[test]
    fn fires_when_due_and_resolves_when_the_condition_clears() {
        let mut e = engine();
        let mut out = Vec::new();
        e.observe_job(
            &job(1),
            &[(0, Some((1000.0, SCHED)))],
            1000.0,
            0.0,
            &mut out,
        );
        assert!(!e.advance(|_| Some(1099.0), 10, &mut out));
        assert!(out.is_empty());
        assert_eq!(e.next_deadline("c"), Some(1100.0));
        e.advance(|_| Some(1100.0), 10, &mut out);
        assert_eq!(statuses(&out), vec![(Status::Firing, 1100.0, None)]);
        assert_eq!(e.firing(), 1);
        // still holding: nothing new, however often it is observed
        out.clear();
        e.observe_job(
            &job(1),
            &[(0, Some((1000.0, SCHED)))],
            1200.0,
            0.0,
            &mut out,
        );
        e.advance(|_| Some(5000.0), 10, &mut out);
        assert!(out.is_empty());
        e.observe_job(&job(1), &[(0, Holds::None)], 1300.0, 0.0, &mut out);
        assert_eq!(
            statuses(&out),
            vec![(Status::Resolved, 1100.0, Some(1300.0))]
        );
        assert_eq!(e.firing(), 0);
        assert_eq!(e.pending_timers(), 0);
    }

    #[test]
    fn what_fires_now_is_what_was_announced() {
        let mut e = engine();
        let mut out = Vec::new();
        e.observe_job(
            &job(1),
            &[(0, Some((1000.0, SCHED)))],
            1000.0,
            0.0,
            &mut out,
        );
        e.observe_job(
            &job(2),
            &[(0, Some((1050.0, SCHED)))],
            1050.0,
            0.0,
            &mut out,
        );
        e.advance(|_| Some(1120.0), 10, &mut out);
        assert_eq!(out.len(), 1, "job 1 fired, job 2 not yet");
        let (now, total) = e.firing_page(&e.jobs, None, None, 10);
        assert_eq!(now.into_iter().map(|(_, a)| a).collect::<Vec<_>>(), out);
        assert_eq!(total, 1);
        assert_eq!(
            e.firing_page(&e.jobs, Some("elsewhere"), None, 10),
            (vec![], 0)
        );
        let c = &e.jobs.0[&job(2)];
        let pending = e.job_conditions(&job(2), c);
        assert_eq!(pending.len(), 1);
        assert!(!pending[0].1, "not fired");
        assert_eq!(pending[0].0.starts_at, 1150.0, "when it would fire");
        let c = &e.jobs.0[&job(1)];
        assert!(e.job_conditions(&job(1), c)[0].1);
    }

    /// A subject's conditions take the room they need, no more: a million
    /// active jobs hold one each, inline ([`Few`]); more go on the heap,
    /// and back inline when one is left.
    #[test]
    fn condition_lists_are_sized_exactly() {
        let mut e = engine();
        let mut out = Vec::new();
        let node = NodeKey {
            cluster: "d".into(),
            rank: 3,
        };
        let host = |h: &str| Some((0.0, Detail::Host(Some(Box::new(h.into())))));
        e.observe_node(&node, &[(1, host("a"))], 0.0, 0.0, &mut out);
        assert_eq!(e.e.nodes[&node].capacity(), 1);
        let mut again = engine();
        again.restore(e.saved_for(&Subject::Node(node.clone())));
        assert_eq!(again.e.nodes[&node].capacity(), 1);
        // two rules hold, then one clears: room for one again
        let mut two = Engine::new(vec![
            Rule::new("drained", RuleKind::NodeDrained, "10s", "info").unwrap(),
            Rule::new("offline", RuleKind::NodeOffline, "10s", "info").unwrap(),
        ]);
        two.observe_node(&node, &[(0, host("a")), (1, host("a"))], 0.0, 0.0, &mut out);
        assert_eq!(two.nodes[&node].capacity(), 2);
        two.observe_node(&node, &[(0, host("a"))], 1.0, 0.0, &mut out);
        assert_eq!(two.nodes[&node].capacity(), 1);
    }

    /// The borrowed conditions decode as owned ones, and restore.
    #[test]
    fn saved_conditions_encode_as_a_list_of_owned_ones() {
        let mut e = engine();
        let mut out = Vec::new();
        e.observe_job(&job(1), &[(0, Some((0.0, SCHED)))], 0.0, 0.0, &mut out);
        e.observe_job(&job(2), &[(0, Some((50.0, SCHED)))], 50.0, 7.0, &mut out);
        let node = NodeKey {
            cluster: "d".into(),
            rank: 3,
        };
        let drained = Detail::Drained(Box::new(Drain {
            host: Some("n3".into()),
            reason: Some("bad dimm".into()),
            draining: false,
        }));
        e.observe_node(&node, &[(1, Some((0.0, drained)))], 0.0, 0.0, &mut out);
        e.advance(|_| Some(120.0), 10, &mut out);
        let mut expected: Vec<SavedCondition> = [
            Subject::Job(job(1)),
            Subject::Job(job(2)),
            Subject::Node(node),
        ]
        .iter()
        .flat_map(|s| e.saved_for(s))
        .collect();
        let order = |a: &SavedCondition, b: &SavedCondition| {
            format!("{:?}", a.subject).cmp(&format!("{:?}", b.subject))
        };
        expected.sort_by(order);
        assert_eq!(expected.len(), 3);
        assert!(expected.iter().any(|c| c.fired) && expected.iter().any(|c| c.delay == 7.0));

        let bytes = rmp_serde::to_vec(&e.saved()).unwrap();
        let mut back: Vec<SavedCondition> = rmp_serde::from_slice(&bytes).unwrap();
        back.sort_by(order);
        assert_eq!(back, expected);

        let mut again = engine();
        assert_eq!(again.restore(back).len(), 2, "the fired ones announced");
        let mut restored: Vec<SavedCondition> =
            rmp_serde::from_slice(&rmp_serde::to_vec(&again.saved()).unwrap()).unwrap();
        restored.sort_by(order);
        assert_eq!(restored, expected);
    }

    #[test]
    fn a_condition_shorter_than_the_duration_never_fires() {
        let mut e = engine();
        let mut out = Vec::new();
        e.observe_job(
            &job(1),
            &[(0, Some((1000.0, SCHED)))],
            1000.0,
            0.0,
            &mut out,
        );
        e.observe_job(&job(1), &[(0, Holds::None)], 1050.0, 0.0, &mut out);
        e.advance(|_| Some(1e9), 10, &mut out);
        assert!(out.is_empty());
        assert_eq!(e.pending_timers(), 0);
    }

    #[test]
    fn an_overdue_condition_seen_only_in_a_backlog_fires_and_resolves() {
        let mut e = engine();
        let mut out = Vec::new();
        // the clock never moved while the whole episode was read
        e.observe_job(
            &job(1),
            &[(0, Some((1000.0, SCHED)))],
            1000.0,
            0.0,
            &mut out,
        );
        e.observe_job(&job(1), &[(0, Holds::None)], 1500.0, 0.0, &mut out);
        assert_eq!(
            statuses(&out),
            vec![
                (Status::Firing, 1100.0, None),
                (Status::Resolved, 1100.0, Some(1500.0))
            ]
        );
        assert_eq!(e.firing(), 0);
    }

    #[test]
    fn clusters_keep_their_own_clocks_and_the_limit_holds() {
        let mut e = engine();
        let mut out = Vec::new();
        for i in 0..5 {
            e.observe_job(&job(i), &[(0, Some((0.0, SCHED)))], 0.0, 0.0, &mut out);
        }
        let other = NodeKey {
            cluster: "d".into(),
            rank: 3,
        };
        e.observe_node(
            &other,
            &[(1, Some((0.0, Detail::Host(None))))],
            0.0,
            0.0,
            &mut out,
        );
        let clock = |c: &str| (c == "c").then_some(1000.0);
        assert!(e.advance(clock, 3, &mut out));
        assert_eq!(out.len(), 3);
        assert!(!e.advance(clock, 3, &mut out));
        assert_eq!(out.len(), 5);
        assert!(out.iter().all(|a| a.subject.cluster() == "c"));
        e.advance(|_| Some(10.0), 3, &mut out);
        assert_eq!(out.len(), 6);
        out.clear();
        e.forget(&Subject::Node(other), 20.0, &mut out);
        assert_eq!(statuses(&out), vec![(Status::Resolved, 10.0, Some(20.0))]);
    }

    #[test]
    fn a_subject_read_late_is_judged_by_its_own_time() {
        let mut e = engine();
        let mut out = Vec::new();
        // the cluster clock is at 5000 when job 1's records (from 1000) arrive
        e.observe_job(
            &job(1),
            &[(0, Some((1000.0, SCHED)))],
            1000.0,
            4000.0,
            &mut out,
        );
        e.advance(|_| Some(5000.0), 10, &mut out);
        assert!(out.is_empty(), "not due by its own time");
        e.observe_job(&job(1), &[(0, Holds::None)], 1050.0, 4000.0, &mut out);
        assert!(out.is_empty());
        // a job whose log ends while it waits fires at the end of a replay
        e.observe_job(
            &job(2),
            &[(0, Some((1000.0, SCHED)))],
            1000.0,
            4000.0,
            &mut out,
        );
        e.advance(|_| Some(5000.0), 10, &mut out);
        assert!(out.is_empty());
        e.flush(|_| Some(5000.0), &mut out);
        assert_eq!(statuses(&out), vec![(Status::Firing, 1100.0, None)]);
        assert_eq!(e.pending_timers(), 0);
    }

    /// What fires, by a pass over every condition: the index's oracle.
    fn fired_by_scan(e: &E) -> Vec<(AlertPosition, AlertEvent)> {
        let jobs = e
            .jobs
            .0
            .iter()
            .map(|(k, c)| (Subject::Job(k.clone()), &c.0[..]));
        let nodes = e
            .nodes
            .iter()
            .map(|(k, l)| (Subject::Node(k.clone()), &l[..]));
        let mut all: Vec<(AlertPosition, AlertEvent)> = jobs
            .chain(nodes)
            .flat_map(|(subject, list)| e.events_of(subject, list))
            .filter_map(|(event, fired)| fired.then_some(event))
            .map(|a| {
                let (kind, id, cluster): (u8, u64, Arc<str>) = match &a.subject {
                    Subject::Job(k) => (0, k.id.0, k.cluster.clone()),
                    Subject::Node(n) => (1, u64::from(n.rank), n.cluster.as_str().into()),
                };
                let p = AlertPosition {
                    since: a.since,
                    rule: a.rule,
                    kind,
                    id,
                    cluster,
                };
                (p, a)
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// A step of [`the_index_lists_what_fires`].
    #[derive(Debug, Clone)]
    enum Step {
        Job {
            cluster: bool,
            id: u64,
            holds: bool,
        },
        Node {
            cluster: bool,
            rank: u32,
            holds: bool,
        },
        Advance(f64),
        Release {
            cluster: bool,
            id: u64,
        },
        ReleaseNode {
            cluster: bool,
            rank: u32,
        },
        Forget {
            cluster: bool,
            id: u64,
        },
        Flush,
        Restore,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (any::<bool>(), 0u64..4, any::<bool>()).prop_map(|(cluster, id, holds)| Step::Job {
                cluster,
                id,
                holds
            }),
            (any::<bool>(), 0u32..3, any::<bool>()).prop_map(|(cluster, rank, holds)| Step::Node {
                cluster,
                rank,
                holds
            }),
            (0.0f64..300.0).prop_map(Step::Advance),
            (any::<bool>(), 0u64..4).prop_map(|(cluster, id)| Step::Release { cluster, id }),
            (any::<bool>(), 0u32..3)
                .prop_map(|(cluster, rank)| Step::ReleaseNode { cluster, rank }),
            (any::<bool>(), 0u64..4).prop_map(|(cluster, id)| Step::Forget { cluster, id }),
            Just(Step::Flush),
            Just(Step::Restore),
        ]
    }

    proptest! {
        /// Whatever fires, resolves, is released, flushed or restored, the
        /// index lists exactly the fired conditions, in order, and its
        /// pages of any size join up to them.
        #[test]
        fn the_index_lists_what_fires(steps in proptest::collection::vec(step(), 0..50), limit in 1usize..4) {
            let mut e = engine();
            let mut out = Vec::new();
            let mut now = 0.0f64;
            let name = |c: bool| if c { "c" } else { "d" };
            for s in steps {
                match s {
                    Step::Job { cluster, id, holds } => {
                        let key = JobKey { cluster: name(cluster).into(), id: JobId(id) };
                        e.observe_job(&key, &[(0, holds.then_some((now, SCHED)))], now, 0.0, &mut out);
                    }
                    Step::Node { cluster, rank, holds } => {
                        let key = NodeKey { cluster: name(cluster).into(), rank };
                        let h = holds.then(|| (now, Detail::Host(None)));
                        e.e.observe_node(&key, &[(1, h)], now, 0.0, &mut out);
                    }
                    Step::Advance(dt) => {
                        now += dt;
                        e.advance(|_| Some(now), 2, &mut out);
                    }
                    Step::Release { cluster, id } => {
                        let key = JobKey { cluster: name(cluster).into(), id: JobId(id) };
                        let c = e.jobs.0.remove(&key).unwrap_or_default();
                        e.e.release_job(c, &key);
                    }
                    Step::ReleaseNode { cluster, rank } => {
                        e.e.release_node(&NodeKey { cluster: name(cluster).into(), rank });
                    }
                    Step::Forget { cluster, id } => {
                        let key = JobKey { cluster: name(cluster).into(), id: JobId(id) };
                        e.forget(&Subject::Job(key), now, &mut out);
                    }
                    Step::Flush => e.flush(|_| Some(now), &mut out),
                    Step::Restore => {
                        let saved: Vec<SavedCondition> =
                            rmp_serde::from_slice(&rmp_serde::to_vec(&e.saved()).unwrap()).unwrap();
                        let mut again = engine();
                        again.jobs.0 = e.jobs.0.keys().map(|k| (k.clone(), Conditions::default())).collect();
                        let mut jobs = std::mem::take(&mut again.jobs);
                        again.e.restore(saved, &mut jobs);
                        again.jobs = jobs;
                        e = again;
                    }
                }
                // No timer comes due before the bound the look for due
                // timers trusts.
                let bound = e.e.earliest_deadline();
                for t in e.e.timers.values() {
                    if let Some(d) = t.queue.next_deadline() {
                        prop_assert!(d >= bound, "{} before {}", d, bound);
                    }
                }
                let want = fired_by_scan(&e);
                prop_assert_eq!(e.firing(), want.len());
                let mut got = Vec::new();
                let mut after = None;
                loop {
                    let (page, total) = e.firing_page(&e.jobs, None, after.as_ref(), limit);
                    prop_assert_eq!(total, want.len());
                    let Some((last, _)) = page.last() else { break };
                    after = Some(last.clone());
                    got.extend(page);
                }
                prop_assert_eq!(&got, &want);
                let (in_d, total) = e.firing_page(&e.jobs, Some("d"), None, usize::MAX);
                let want_d: Vec<_> = want.iter().filter(|(p, _)| &*p.cluster == "d").cloned().collect();
                prop_assert_eq!(total, want_d.len());
                prop_assert_eq!(in_d, want_d);
            }
        }

        /// Any sequence of observations and clock moves keeps the books
        /// straight: every firing is resolved once its condition clears,
        /// and nothing is left behind.
        #[test]
        fn books_balance(steps in proptest::collection::vec((0u64..4, any::<bool>(), 0.0f64..500.0), 0..60)) {
            let mut e = engine();
            let mut out = Vec::new();
            let mut now = 0.0f64;
            for (id, holds, dt) in steps {
                now += dt;
                let h = holds.then_some((now, SCHED));
                e.observe_job(&job(id), &[(0, h)], now, 0.0, &mut out);
                e.advance(|_| Some(now), 2, &mut out);
            }
            for id in 0..4 {
                e.forget(&Subject::Job(job(id)), now, &mut out);
            }
            let fired = out.iter().filter(|a| a.status == Status::Firing).count();
            let resolved = out.iter().filter(|a| a.status == Status::Resolved).count();
            prop_assert_eq!(fired, resolved);
            prop_assert_eq!(e.firing(), 0);
            prop_assert_eq!(e.pending_timers(), 0);
            for a in &out {
                if let Some(end) = a.ends_at { prop_assert!(end >= a.starts_at); }
            }
        }
    }
}
