//! The alert engine's conditions as a checkpoint keeps them, and taken
//! back from one: each names its rule by name, so a changed rule list
//! still restores the rules that remain.

use super::engine::{Active, Conditions, Engine, JobConditions, List, TimerSubject, set_timer};
use super::event::{AlertEvent, Detail, NodeKey, Status, Subject};
use crate::keyed::JobKey;
use crate::keyed::key::JobKeyRef;

/// A condition as a checkpoint keeps it: its rule by name, so a changed
/// rule list still restores the rules that remain.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SavedCondition {
    pub subject: Subject,
    /// Inline (rule names are short): a million restored conditions
    /// allocate nothing for them.
    pub rule: compact_str::CompactString,
    pub since: f64,
    /// How far its timer was pushed back (the subject's lag).
    pub delay: f64,
    pub fired: bool,
    pub detail: Detail,
}

/// A [`SavedCondition`] borrowed from the engine; encodes the same.
#[derive(serde::Serialize)]
#[serde(rename = "SavedCondition")]
struct SavedConditionRef<'a> {
    subject: SubjectRef<'a>,
    rule: &'a str,
    since: f64,
    delay: f64,
    fired: bool,
    detail: &'a Detail,
}

/// A [`Subject`] borrowed; encodes the same.
#[derive(Clone, Copy, serde::Serialize)]
#[serde(rename = "Subject")]
enum SubjectRef<'a> {
    Job(JobKeyRef<'a>),
    Node(&'a NodeKey),
}

/// Every condition holding now, borrowed for a checkpoint: encodes as a
/// `Vec<SavedCondition>` does, without building one (a copy of every
/// condition would cost ~100 bytes per active job while it is written).
/// Or those of a part of it ([`Engine::saved_part`]).
pub struct SavedConditions<'a, J> {
    engine: &'a Engine,
    jobs: &'a J,
    /// The jobs, as a range of the job table's order.
    skip: usize,
    take: usize,
    nodes: bool,
}

impl<J: JobConditions> SavedConditions<'_, J> {
    /// How many there are.
    pub fn len(&self) -> usize {
        self.each().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn each(&self) -> impl Iterator<Item = SavedConditionRef<'_>> {
        let engine = self.engine;
        let jobs = self
            .jobs
            .conditions()
            .skip(self.skip)
            .take(self.take)
            .filter(|(_, c)| !c.is_empty())
            .map(|(k, c)| (SubjectRef::Job(k), &c.0[..]));
        let nodes = engine
            .nodes
            .iter()
            .filter(|_| self.nodes)
            .map(|(k, l)| (SubjectRef::Node(k), &l[..]));
        jobs.chain(nodes).flat_map(move |(subject, list)| {
            list.iter().filter_map(move |a| {
                let rule = engine.rules.get(a.rule as usize)?;
                Some(SavedConditionRef {
                    subject,
                    rule: &rule.name,
                    since: a.since,
                    delay: a.deadline - a.starts(&engine.rules),
                    fired: a.fired,
                    detail: &a.detail,
                })
            })
        })
    }
}

impl<J: JobConditions> serde::Serialize for SavedConditions<'_, J> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        // MessagePack writes a sequence's length first.
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for c in self.each() {
            seq.serialize_element(&c)?;
        }
        seq.end()
    }
}

impl Engine {
    /// Every condition holding now, for a checkpoint: the nodes' and those
    /// of the jobs in `jobs`.
    pub fn saved<'a, J: JobConditions>(&'a self, jobs: &'a J) -> SavedConditions<'a, J> {
        self.saved_part(jobs, 0..usize::MAX, true)
    }

    /// The conditions of the jobs `jobs` (a range of the order `jobs`
    /// lists its conditions in), and the nodes' if `nodes`.
    pub fn saved_part<'a, J: JobConditions>(
        &'a self,
        jobs: &'a J,
        range: std::ops::Range<usize>,
        nodes: bool,
    ) -> SavedConditions<'a, J> {
        SavedConditions {
            engine: self,
            jobs,
            skip: range.start,
            take: range.end.saturating_sub(range.start),
            nodes,
        }
    }

    /// A job's conditions, as saved.
    pub fn saved_job(&self, key: &JobKey, conditions: &Conditions) -> Vec<SavedCondition> {
        let mut out = Vec::new();
        if !conditions.is_empty() {
            self.save_list(&Subject::Job(key.clone()), &conditions.0, &mut out);
        }
        out
    }

    /// The conditions holding for every node of a cluster.
    pub fn saved_for_nodes(&self, cluster: &str) -> Vec<SavedCondition> {
        let mut out = Vec::new();
        for (key, list) in self.nodes.iter().filter(|(k, _)| k.cluster == cluster) {
            self.save_list(&Subject::Node(key.clone()), list, &mut out);
        }
        out
    }

    fn save_list(&self, subject: &Subject, list: &[Active], out: &mut Vec<SavedCondition>) {
        for a in list {
            let Some(rule) = self.rules.get(a.rule as usize) else {
                continue;
            };
            out.push(SavedCondition {
                subject: subject.clone(),
                rule: rule.name.as_str().into(),
                since: a.since,
                delay: a.deadline - a.starts(&self.rules),
                fired: a.fired,
                detail: a.detail.clone(),
            });
        }
    }

    /// Take back conditions from a checkpoint. Those whose rule is gone are
    /// dropped; a rule whose duration changed times from the same start.
    /// A job's go into its entry in `jobs`; those of a job not held go with
    /// it. Returns the alerts that were firing, to announce again (same
    /// identity, same start: receivers see a repeat, not a new alert).
    pub fn restore(
        &mut self,
        saved: Vec<SavedCondition>,
        jobs: &mut impl JobConditions,
    ) -> Vec<AlertEvent> {
        let mut firing = Vec::new();
        for c in saved {
            let announced = match &c.subject {
                Subject::Job(k) => match jobs.conditions_mut(k) {
                    Some(conditions) => conditions.edit(|list| self.restore_one(c, list)),
                    None => None,
                },
                Subject::Node(n) => {
                    let mut list = self.nodes.remove(n).unwrap_or_default();
                    let key = n.clone();
                    let announced = self.restore_one(c, &mut list);
                    if !list.is_empty() {
                        self.nodes.insert(key, list);
                    }
                    announced
                }
            };
            firing.extend(announced);
        }
        firing
    }

    /// [`Engine::restore`] for one job whose entry is at hand (not yet in
    /// the job table): its saved conditions go into `conditions`, and the
    /// alerts that were firing onto `firing`.
    pub fn restore_job(
        &mut self,
        saved: impl IntoIterator<Item = SavedCondition>,
        conditions: &mut Conditions,
        firing: &mut Vec<AlertEvent>,
    ) {
        conditions.edit(|list| {
            for c in saved {
                firing.extend(self.restore_one(c, list));
            }
        });
    }

    /// One saved condition into its subject's list; the alert to announce
    /// again if it had fired.
    fn restore_one(&mut self, c: SavedCondition, list: &mut List) -> Option<AlertEvent> {
        let rule = self.rules.iter().position(|r| r.name == c.rule)?;
        if list.iter().any(|a| a.rule as usize == rule) {
            return None;
        }
        let hold = self.rules[rule].hold_secs;
        let starts = c.since + hold;
        let deadline = starts + c.delay.max(0.0);
        let timer =
            (!c.fired).then(|| set_timer(&mut self.timers, &c.subject, deadline, rule as u16));
        // Copied only for the alert a firing condition announces again.
        let announced = c.fired.then(|| c.detail.clone());
        list.push(Active {
            rule: rule as u16,
            since: c.since,
            deadline,
            timer,
            fired: c.fired,
            detail: self.details.share(c.detail),
        });
        let detail = announced?;
        self.firing
            .insert(c.subject.cluster(), c.subject.due(), rule as u16, c.since);
        Some(AlertEvent {
            rule,
            subject: c.subject,
            status: Status::Firing,
            since: c.since,
            starts_at: starts,
            ends_at: None,
            detail,
        })
    }
}
