//! The watchman's rules: a feed that went silent (`feed_silent`) and an
//! instance that went down (`instance_down`). Unlike job and node rules
//! they are measured on the wall clock from when fluxpipe learned of the
//! condition, never on event time: a backlog that says an instance was
//! down two hours ago and back an hour later, read in seconds, pages
//! nobody; an instance still down once the backlog is read pages after
//! `for`. Pure: the caller reads the feeds and instances and owns the
//! clock.

use super::event::Status;
use super::rule::{Rule, RuleKind};
use std::collections::BTreeMap;

/// What a watch alert is about: a cluster, and for `feed_silent` the
/// source whose feed it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WatchSubject {
    pub cluster: String,
    pub source: Option<String>,
}

/// A watch alert firing or resolving.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchAlert {
    /// Index into the watch's rules.
    pub rule: usize,
    pub subject: WatchSubject,
    pub status: Status,
    /// When the condition began (wall clock).
    pub since: f64,
    /// When the alert began: the condition's start plus the rule's hold.
    pub starts_at: f64,
    /// When the condition cleared (resolved alerts only).
    pub ends_at: Option<f64>,
}

/// A feed as read at a tick.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedState<'a> {
    pub source: &'a str,
    pub cluster: &'a str,
    /// Whether its source type carries heartbeats.
    pub heartbeats: bool,
    /// When it was last heard (wall clock, seconds).
    pub last_heard: f64,
    /// Whether this pipeline answers for it now (else its silence is
    /// nobody's page here: a Kafka member that owns no partition).
    pub watched: bool,
}

/// A watch alert that had fired, as a checkpoint keeps it: by its rule's
/// name (a new config may number its rules otherwise).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SavedWatchAlert {
    pub rule: String,
    pub cluster: String,
    pub source: Option<String>,
    /// When its condition began (wall clock).
    pub since: f64,
}

#[derive(Debug, Clone)]
struct Held {
    since: f64,
    fired: bool,
}

/// The watch's rules and what holds now.
#[derive(Debug, Default)]
pub struct Watch {
    rules: Vec<Rule>,
    /// Conditions that hold, by rule and subject.
    holding: BTreeMap<(usize, WatchSubject), Held>,
    /// Since when (wall clock) each cluster's instance has been seen down.
    down_since: BTreeMap<String, f64>,
}

impl Watch {
    /// A watch of `rules` (those of other kinds are ignored).
    pub fn new(rules: Vec<Rule>) -> Self {
        Watch {
            rules: rules.into_iter().filter(|r| r.kind.is_cluster()).collect(),
            ..Watch::default()
        }
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether any rule watches feeds, instances.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether `rule` watches this feed: the sources it names, else every
    /// feed whose source carries heartbeats (a file on an idle cluster is
    /// silent and well).
    fn watches(rule: &Rule, feed: &FeedState) -> bool {
        if !feed.watched {
            false
        } else if rule.sources.is_empty() {
            feed.heartbeats
        } else {
            rule.sources.iter().any(|s| s == feed.source)
        }
    }

    /// Look at the feeds and the instances as of `now` (wall clock): the
    /// alerts that fire and resolve. `down` lists the clusters whose
    /// instance is down now; a cluster not listed is up.
    pub fn evaluate<'a>(
        &mut self,
        now: f64,
        feeds: &[FeedState<'a>],
        down: impl IntoIterator<Item = &'a str>,
    ) -> Vec<WatchAlert> {
        let down: Vec<&str> = down.into_iter().collect();
        self.down_since.retain(|c, _| down.contains(&c.as_str()));
        for c in &down {
            self.down_since.entry((*c).to_string()).or_insert(now);
        }
        // What holds now, and since when.
        let mut now_holding: BTreeMap<(usize, WatchSubject), f64> = BTreeMap::new();
        for (i, rule) in self.rules.iter().enumerate() {
            match rule.kind {
                RuleKind::FeedSilent => {
                    for feed in feeds.iter().filter(|f| Self::watches(rule, f)) {
                        if now - feed.last_heard >= rule.hold_secs {
                            let subject = WatchSubject {
                                cluster: feed.cluster.to_string(),
                                source: Some(feed.source.to_string()),
                            };
                            now_holding.insert((i, subject), feed.last_heard);
                        }
                    }
                }
                RuleKind::InstanceDown => {
                    for (cluster, since) in &self.down_since {
                        if now - since >= rule.hold_secs {
                            let subject = WatchSubject {
                                cluster: cluster.clone(),
                                source: None,
                            };
                            now_holding.insert((i, subject), *since);
                        }
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        // Resolved: held before, not now (or held again from a later
        // start: the feed spoke in between).
        let gone: Vec<(usize, WatchSubject)> = self
            .holding
            .iter()
            .filter(|(k, held)| now_holding.get(*k).is_none_or(|since| *since != held.since))
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            if let Some(held) = self.holding.remove(&key)
                && held.fired
            {
                let hold = self.rules[key.0].hold_secs;
                out.push(WatchAlert {
                    rule: key.0,
                    subject: key.1,
                    status: Status::Resolved,
                    since: held.since,
                    starts_at: held.since + hold,
                    ends_at: Some(now),
                });
            }
        }
        for (key, since) in now_holding {
            if self.holding.contains_key(&key) {
                continue;
            }
            let hold = self.rules[key.0].hold_secs;
            out.push(WatchAlert {
                rule: key.0,
                subject: key.1.clone(),
                status: Status::Firing,
                since,
                starts_at: since + hold,
                ends_at: None,
            });
            self.holding.insert(key, Held { since, fired: true });
        }
        out
    }

    /// What has fired, for a checkpoint.
    pub fn saved(&self) -> Vec<SavedWatchAlert> {
        self.firing()
            .map(|a| SavedWatchAlert {
                rule: self.rules[a.rule].name.clone(),
                cluster: a.subject.cluster,
                source: a.subject.source,
                since: a.since,
            })
            .collect()
    }

    /// Take over what had fired before a restart (before the first
    /// look): it stays fired, from the same start, until its condition
    /// clears; a rule no longer in the config is dropped. Returns the
    /// alerts to announce again. The caller sets a silent feed's last
    /// word back to `since`: it has not been heard since.
    pub fn restore(&mut self, saved: &[SavedWatchAlert]) -> Vec<WatchAlert> {
        for s in saved {
            let Some(i) = self.rules.iter().position(|r| r.name == s.rule) else {
                continue;
            };
            if self.rules[i].kind == RuleKind::InstanceDown {
                self.down_since.insert(s.cluster.clone(), s.since);
            }
            let subject = WatchSubject {
                cluster: s.cluster.clone(),
                source: s.source.clone(),
            };
            self.holding.insert(
                (i, subject),
                Held {
                    since: s.since,
                    fired: true,
                },
            );
        }
        self.firing().collect()
    }

    /// The alerts firing now, as they fired.
    pub fn firing(&self) -> impl Iterator<Item = WatchAlert> + '_ {
        self.holding
            .iter()
            .filter(|(_, h)| h.fired)
            .map(|((rule, subject), h)| WatchAlert {
                rule: *rule,
                subject: subject.clone(),
                status: Status::Firing,
                since: h.since,
                starts_at: h.since + self.rules[*rule].hold_secs,
                ends_at: None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::alerts::rule::default_cluster_rules;

    fn feed(source: &str, last_heard: f64) -> FeedState<'_> {
        FeedState {
            source,
            cluster: "picl",
            heartbeats: true,
            last_heard,
            watched: true,
        }
    }

    fn names(w: &Watch, alerts: &[WatchAlert]) -> Vec<(String, &'static str)> {
        alerts
            .iter()
            .map(|a| (w.rules()[a.rule].name.clone(), a.status.as_str()))
            .collect()
    }

    #[test]
    fn what_fired_stays_fired_across_a_restart() {
        let mut w = Watch::new(default_cluster_rules());
        let hold = 600.0;
        w.evaluate(1000.0, &[feed("http", 1000.0)], ["picl"]);
        let fired = w.evaluate(1000.0 + hold + 60.0, &[feed("http", 1000.0)], ["picl"]);
        assert_eq!(fired.len(), 2, "{fired:?}");
        let saved = w.saved();
        assert_eq!(saved.len(), 2);
        // A new run: what fired is announced again, as it was.
        let mut again = Watch::new(default_cluster_rules());
        let announced = again.restore(&saved);
        assert_eq!(announced, fired);
        // Nothing changed: nothing new fires or resolves.
        let t = 1000.0 + hold + 120.0;
        assert!(
            again
                .evaluate(t, &[feed("http", 1000.0)], ["picl"])
                .is_empty()
        );
        // The instance is up again and the feed speaks: both resolve.
        let done = again.evaluate(t + 1.0, &[feed("http", t)], []);
        assert!(done.iter().all(|a| a.status == Status::Resolved));
        assert_eq!(done.len(), 2);
        // A rule gone from the config is not restored.
        let mut other = Watch::new(Vec::new());
        assert!(other.restore(&saved).is_empty());
    }

    #[test]
    fn a_silent_feed_fires_after_its_hold_and_resolves_when_heard() {
        let mut w = Watch::new(default_cluster_rules());
        let hold = 600.0;
        assert!(w.evaluate(1000.0, &[feed("http", 1000.0)], []).is_empty());
        assert!(
            w.evaluate(1000.0 + hold - 1.0, &[feed("http", 1000.0)], [])
                .is_empty()
        );
        let fired = w.evaluate(1000.0 + hold, &[feed("http", 1000.0)], []);
        assert_eq!(names(&w, &fired), [("feed_silent".into(), "firing")]);
        assert_eq!(fired[0].since, 1000.0);
        assert_eq!(fired[0].starts_at, 1000.0 + hold);
        assert_eq!(fired[0].subject.source.as_deref(), Some("http"));
        // Fired once, not at every tick.
        assert!(w.evaluate(2000.0, &[feed("http", 1000.0)], []).is_empty());
        assert_eq!(w.firing().count(), 1);
        let resolved = w.evaluate(2001.0, &[feed("http", 2001.0)], []);
        assert_eq!(names(&w, &resolved), [("feed_silent".into(), "resolved")]);
        assert_eq!(resolved[0].ends_at, Some(2001.0));
        assert_eq!(w.firing().count(), 0);
    }

    #[test]
    fn a_feed_that_cannot_heartbeat_is_watched_only_when_named() {
        let mut w = Watch::new(default_cluster_rules());
        let file = FeedState {
            heartbeats: false,
            ..feed("files", 0.0)
        };
        assert!(w.evaluate(1e6, std::slice::from_ref(&file), []).is_empty());
        let named = Rule::new("quiet", RuleKind::FeedSilent, "1m", "warning")
            .and_then(|r| r.for_sources(vec!["files".into()]))
            .unwrap();
        let mut w = Watch::new(vec![named]);
        assert_eq!(w.evaluate(1e6, &[file], []).len(), 1);
    }

    #[test]
    fn a_feed_nobody_here_answers_for_pages_nobody() {
        let mut w = Watch::new(default_cluster_rules());
        let idle = FeedState {
            watched: false,
            ..feed("kafka", 0.0)
        };
        assert!(w.evaluate(1e6, std::slice::from_ref(&idle), []).is_empty());
        // Watched: it fires; no longer watched (its partitions went to
        // another member): it resolves here.
        assert_eq!(w.evaluate(1e6, &[feed("kafka", 0.0)], []).len(), 1);
        let resolved = w.evaluate(1e6 + 1.0, &[idle], []);
        assert_eq!(names(&w, &resolved), [("feed_silent".into(), "resolved")]);
    }

    #[test]
    fn an_instance_down_fires_after_its_hold_on_the_wall_clock() {
        let mut w = Watch::new(default_cluster_rules());
        // Down and up again between two looks (a backlog read in
        // seconds): nothing.
        assert!(w.evaluate(100.0, &[], ["picl"]).is_empty());
        assert!(w.evaluate(101.0, &[], []).is_empty());
        // Down for the hold (1m): one alert, however long it stays down.
        assert!(w.evaluate(200.0, &[], ["picl"]).is_empty());
        let fired = w.evaluate(260.0, &[], ["picl"]);
        assert_eq!(names(&w, &fired), [("instance_down".into(), "firing")]);
        assert_eq!(fired[0].subject.cluster, "picl");
        assert_eq!(fired[0].subject.source, None);
        assert!(w.evaluate(900.0, &[], ["picl"]).is_empty());
        let resolved = w.evaluate(901.0, &[], []);
        assert_eq!(names(&w, &resolved), [("instance_down".into(), "resolved")]);
        assert_eq!(resolved[0].starts_at, 260.0);
    }

    #[test]
    fn only_the_watch_rules_are_kept() {
        let job = Rule::new(
            "sched",
            RuleKind::JobState(crate::flux::job::JobState::Sched),
            "1m",
            "warning",
        )
        .unwrap();
        let w = Watch::new(vec![job]);
        assert!(w.is_empty());
    }
}
