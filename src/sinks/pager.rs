//! No paging for the past: which alert records of the `alerts` stream a
//! sink that pages people (`alertmanager`, a webhook through `http`)
//! sends, holds or leaves out.
//!
//! A forwarder's first start sends a journal's whole backlog, and a
//! restart may read hours again: conditions that held past `for` and
//! cleared long ago fire and resolve in seconds. An alert that began (or,
//! resolved, ended) more than `past_after_secs` before it reached the sink
//! is late. Its firing is held for `settle_secs`, longer while more late
//! alerts of its cluster keep coming; if its resolution comes meanwhile
//! both are left out. What still fires once they stop coming is sent,
//! once. A late resolution of an alert never sent is left out too, unless
//! its firing was announced again at a restart (`"restored": true`): that
//! firing may have gone out before the restart, so its resolution goes,
//! and no receiver keeps an alert open for ever.
//!
//! Pure bookkeeping: the sink owns the records, the clocks and the
//! sending.

use crate::component::Problem;
use crate::output::{AlertRecord, AlertStatus};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::time::Instant;

/// Late firings held at most; past that a late firing is sent as it
/// comes (a backlog of that many open alerts is no past to hide).
pub const HELD_MAX: usize = 10_000;

pub fn default_past_after() -> f64 {
    300.0
}

pub fn default_settle() -> f64 {
    30.0
}

/// What is wrong with a sink's `past_after_secs` and `settle_secs`.
pub fn problems(past_after_secs: f64, settle_secs: f64) -> Vec<Problem> {
    [
        ("past_after_secs", past_after_secs),
        ("settle_secs", settle_secs),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_finite() || *v < 0.0)
    .map(|(key, _)| Problem::new(key, ": must be a number of seconds, at least 0"))
    .collect()
}

/// When an alert is from the past, and what becomes of it.
#[derive(Debug, Clone, Copy)]
pub struct Past {
    /// Seconds behind the wall clock from which an alert is late.
    pub after: f64,
    /// How long a late firing waits for its resolution.
    pub settle: Duration,
    /// Send late alerts as they come.
    pub page: bool,
}

impl Past {
    /// From a sink's keys (checked by [`problems`]).
    pub fn new(past_after_secs: f64, settle_secs: f64, page_past: bool) -> Self {
        Past {
            after: past_after_secs.max(0.0),
            settle: Duration::from_secs_f64(settle_secs.clamp(0.0, 1e7)),
            page: page_past,
        }
    }
}

impl Default for Past {
    fn default() -> Self {
        Past::new(default_past_after(), default_settle(), false)
    }
}

/// An alert record, read as much as paging needs.
#[derive(Debug, Clone)]
pub struct Alert {
    /// What Alertmanager knows it by: its labels, printed (sorted, so
    /// equal label sets print equal).
    pub identity: String,
    pub cluster: String,
    pub resolved: bool,
    /// When it began (firing) or ended (resolved), seconds since the
    /// epoch, if the record says.
    pub when: Option<f64>,
    /// Announced again at a restart from the restored state.
    pub restored: bool,
}

/// An RFC 3339 time as seconds since the epoch.
pub fn seconds(text: &str) -> Option<f64> {
    let t: jiff::Timestamp = text.parse().ok()?;
    Some(t.as_millisecond() as f64 / 1000.0)
}

impl Alert {
    pub fn of(record: &AlertRecord) -> Alert {
        Alert {
            identity: serde_json::to_string(&record.labels).unwrap_or_default(),
            cluster: record.flux_cluster().to_string(),
            resolved: record.status == AlertStatus::Resolved,
            when: record.when_text().and_then(seconds),
            restored: record.restored,
        }
    }
}

/// What becomes of one alert record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it now. A resolution sent replaces its firing if that was
    /// held (the firing is then left out).
    Send,
    /// A late firing: hold it until its cluster settles.
    Hold,
    /// From the past, not paged (and its held firing, if any, with it).
    NotPaged,
}

/// Which alerts went out, which are held, and which clusters are still
/// catching up.
#[derive(Debug, Default)]
pub struct Pager {
    past: Past,
    /// Alerts some version of which went out, or may have (announced
    /// again at a restart): their resolution must go too.
    sent: HashSet<String>,
    /// Late firings held, by identity, with their cluster.
    held: HashMap<String, String>,
    /// Clusters whose late alerts are held, and until when: pushed on by
    /// each late alert of the cluster (one entry a cluster, not a walk
    /// over its alerts per record).
    settling: HashMap<String, Instant>,
}

impl Pager {
    pub fn new(past: Past) -> Self {
        Pager {
            past,
            ..Pager::default()
        }
    }

    /// Take one alert at `now` (wall clock, seconds) and `at` (the sink's
    /// clock).
    pub fn take(&mut self, alert: &Alert, now: f64, at: Instant) -> Verdict {
        let late = !self.past.page && alert.when.is_some_and(|t| t < now - self.past.after);
        if late {
            // A backlog is still coming for this cluster: what it holds
            // waits for the rest.
            self.settling
                .insert(alert.cluster.clone(), at + self.past.settle);
        }
        if alert.resolved {
            self.held.remove(&alert.identity);
            // Its life is over: nothing more of it is remembered.
            let sent = self.sent.remove(&alert.identity);
            return if late && !sent {
                Verdict::NotPaged
            } else {
                Verdict::Send
            };
        }
        let sent = self.sent.contains(&alert.identity);
        if alert.restored {
            self.sent.insert(alert.identity.clone());
        }
        if late && !sent && self.held.len() < HELD_MAX {
            self.held
                .insert(alert.identity.clone(), alert.cluster.clone());
            Verdict::Hold
        } else {
            self.held.remove(&alert.identity);
            self.sent.insert(alert.identity.clone());
            Verdict::Send
        }
    }

    /// Let go of the late firings held long enough, as of `at`: the
    /// identities of those to send now.
    pub fn release(&mut self, at: Instant) -> Vec<String> {
        let settled: Vec<String> = self
            .settling
            .iter()
            .filter(|(_, until)| at >= **until)
            .map(|(c, _)| c.clone())
            .collect();
        if settled.is_empty() {
            return Vec::new();
        }
        for c in &settled {
            self.settling.remove(c);
        }
        let released: Vec<String> = self
            .held
            .iter()
            .filter(|(_, cluster)| settled.contains(cluster))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &released {
            self.held.remove(id);
            self.sent.insert(id.clone());
        }
        released
    }

    /// When the next held firing may be let go.
    pub fn next_release(&self) -> Option<Instant> {
        self.settling.values().min().copied()
    }

    /// Late firings held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(status: &str, job: &str, starts: f64, ends: Option<f64>) -> Alert {
        Alert::of(&AlertRecord::of_job(status, job, starts, ends))
    }

    fn restored(mut a: Alert) -> Alert {
        a.restored = true;
        a
    }

    #[test]
    fn an_alert_is_known_by_its_labels_and_read_for_its_time() {
        let resolved =
            AlertRecord::of_job("resolved", "f1", 1_704_067_200.0, Some(1_704_070_800.0));
        let mut firing = AlertRecord::of_job("firing", "f1", 1_704_067_200.0, None);
        firing.restored = true;
        firing.labels.insert("state".into(), "SCHED".into());
        let (a, b) = (Alert::of(&resolved), Alert::of(&firing));
        assert_ne!(a.identity, b.identity, "another label");
        firing.labels.remove("state");
        let b = Alert::of(&firing);
        assert_eq!(a.identity, b.identity);
        assert_eq!(
            a.identity,
            r#"{"alertname":"sched_too_long","flux_cluster":"c","jobid":"f1"}"#
        );
        assert_eq!((a.resolved, a.when), (true, Some(1_704_070_800.0)));
        assert_eq!(
            (b.resolved, b.when, b.restored),
            (false, Some(1_704_067_200.0), true)
        );
        assert_eq!(a.cluster, "c");
    }

    /// A backlog two hours old: a job that sat in SCHED and then ran, and
    /// one still in SCHED. Only the one still stuck is paged, once the
    /// backlog's alerts stop coming.
    #[test]
    fn the_past_is_held_and_what_still_fires_is_sent_once() {
        let mut pager = Pager::default();
        let now = 1.8e9;
        let t0 = Instant::now();
        let (old, ran) = (now - 7200.0, now - 5400.0);
        assert_eq!(
            pager.take(&alert("firing", "fA", old, None), now, t0),
            Verdict::Hold
        );
        assert_eq!(
            pager.take(&alert("firing", "fB", old, None), now, t0),
            Verdict::Hold
        );
        let t1 = t0 + Duration::from_secs(5);
        let res_a = alert("resolved", "fA", old, Some(ran));
        assert_eq!(pager.take(&res_a, now + 5.0, t1), Verdict::NotPaged);
        assert_eq!(pager.held(), 1);
        // A's resolution pushed B's hold on (the backlog still comes).
        assert!(pager.release(t0 + Duration::from_secs(31)).is_empty());
        assert_eq!(pager.next_release(), Some(t1 + Duration::from_secs(30)));
        let released = pager.release(t1 + Duration::from_secs(30));
        assert_eq!(released.len(), 1);
        assert!(released[0].contains("fB"));
        assert_eq!(pager.next_release(), None);
        // Sent once; a repeat of it goes as it comes, and so does its
        // resolution, late or not.
        let t2 = t1 + Duration::from_secs(31);
        assert_eq!(
            pager.take(&alert("firing", "fB", old, None), now, t2),
            Verdict::Send
        );
        let res_b = alert("resolved", "fB", old, Some(now - 3600.0));
        assert_eq!(pager.take(&res_b, now + 60.0, t2), Verdict::Send);
        // A fresh alert goes out at once, its resolution too.
        assert_eq!(
            pager.take(&alert("firing", "fC", now - 10.0, None), now, t2),
            Verdict::Send
        );
        let res_c = alert("resolved", "fC", now - 10.0, Some(now - 1.0));
        assert_eq!(pager.take(&res_c, now, t2), Verdict::Send);
        assert!(
            pager.sent.is_empty() && pager.held.is_empty(),
            "nothing kept"
        );
    }

    #[test]
    fn a_resolution_after_a_restart_closes_what_may_have_been_sent() {
        let mut pager = Pager::default();
        let now = 1.8e9;
        let t0 = Instant::now();
        let old = now - 7200.0;
        // Announced again from the restored state: late, so held…
        let again = restored(alert("firing", "fA", old, None));
        assert_eq!(pager.take(&again, now, t0), Verdict::Hold);
        // …and its late resolution goes: the firing may be open out there.
        let res = alert("resolved", "fA", old, Some(now - 600.0));
        assert_eq!(pager.take(&res, now, t0), Verdict::Send);
        assert_eq!(pager.held(), 0, "the held firing is left out");
    }

    #[test]
    fn page_past_sends_everything_and_the_hold_is_capped() {
        let now = 1.8e9;
        let t0 = Instant::now();
        let mut pager = Pager::new(Past {
            page: true,
            ..Past::default()
        });
        assert_eq!(
            pager.take(&alert("firing", "fA", 1.0, None), now, t0),
            Verdict::Send
        );
        assert_eq!(
            pager.take(&alert("resolved", "fA", 1.0, Some(2.0)), now, t0),
            Verdict::Send
        );
        let mut pager = Pager::default();
        for i in 0..HELD_MAX {
            let a = alert("firing", &format!("f{i}"), 1.0, None);
            assert_eq!(pager.take(&a, now, t0), Verdict::Hold);
        }
        assert_eq!(
            pager.take(&alert("firing", "over", 1.0, None), now, t0),
            Verdict::Send
        );
        assert_eq!(pager.held(), HELD_MAX);
        // A record with no time is not late.
        let mut none = alert("firing", "fN", 1.0, None);
        none.when = None;
        assert_eq!(Pager::default().take(&none, now, t0), Verdict::Send);
    }

    #[test]
    fn problems_name_the_key() {
        assert!(problems(300.0, 30.0).is_empty());
        let p = problems(-1.0, f64::NAN);
        assert_eq!(p.len(), 2);
    }
}
