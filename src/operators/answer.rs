//! A shard's part of an answer to the query API: read from its processor's
//! state between records ([`crate::channels::query`] asks, the API merges).

use crate::channels::query::{Answer, ClusterQueues, JobNow, Query};
use crate::flux::exec::ExecLog;
use crate::flux::job::Job;
use crate::keyed::JobKey;
use crate::keyed::processor::Processor;
use crate::keyed::query;
use crate::keyed::state::JobEntry;
use crate::output::{self, JobRecord};
use serde_json::{Value, json};

/// This processor's part of the answer to `query`.
pub fn answer(processor: &Processor, query: &Query) -> Answer {
    let state = &processor.state();
    match query {
        Query::Jobs {
            filter,
            after,
            limit,
        } => {
            // Asked about one job: its conditions and progress too.
            let one = filter.id.is_some();
            let page =
                query::select_jobs(state, filter, after.as_ref(), *limit, query::SCAN_BUDGET);
            let jobs = page
                .jobs
                .into_iter()
                .filter_map(|(pos, key)| {
                    let entry = state.jobs.get(&key)?;
                    Some((pos, job_now(processor, &key, entry, one)))
                })
                .collect();
            Answer::Jobs(jobs, page.stopped_at)
        }
        Query::Nodes { cluster, queue } => Answer::Nodes(
            state
                .resources
                .iter()
                .filter(|(c, _)| cluster.as_ref().is_none_or(|want| want == *c))
                .flat_map(|(c, res)| {
                    // A queue a cluster does not configure takes none of it.
                    let ranks = queue.as_deref().map(|q| res.queue_ranks(q));
                    res.ranks()
                        .filter(move |r| {
                            ranks
                                .as_ref()
                                .is_none_or(|set| set.as_ref().is_some_and(|s| s.contains(r.rank)))
                        })
                        .map(|r| (c.clone(), r.clone()))
                })
                .collect(),
        ),
        Query::Queues { cluster } => Answer::Queues(
            state
                .resources
                .iter()
                .filter(|(c, _)| cluster.as_ref().is_none_or(|want| want == *c))
                .filter_map(|(c, res)| {
                    Some(ClusterQueues {
                        cluster: c.clone(),
                        config: res.queue_config()?.clone(),
                        slices: res.queue_slices(),
                    })
                })
                .collect(),
        ),
        Query::Clusters => {
            let mut counts = query::cluster_counts(state);
            for (cluster, now) in processor.event_clock().clusters() {
                counts.entry(cluster.to_string()).or_default().clock = Some(now);
            }
            Answer::Clusters(counts)
        }
        Query::Alerts {
            cluster,
            after,
            limit,
        } => {
            let rules = processor.alerts().rules();
            let (page, total) = processor.alerts().firing_page(
                &state.jobs,
                cluster.as_deref(),
                after.as_ref(),
                *limit,
            );
            let rendered = page
                .into_iter()
                .filter_map(|(pos, a)| Some((pos, output::alert(rules.get(a.rule)?, &a))))
                .collect();
            Answer::Alerts(rendered, total)
        }
    }
}

fn job_now(processor: &Processor, key: &JobKey, entry: &JobEntry, detail: bool) -> JobNow {
    let job = &entry.job;
    let (alerts, exec) = if detail {
        let rules = processor.alerts().rules();
        let alerts = processor
            .alerts()
            .job_conditions(key, &entry.alerts)
            .into_iter()
            .filter_map(|(event, fired)| {
                let mut record = output::alert(rules.get(event.rule)?, &event);
                if !fired {
                    record.status = output::AlertStatus::Pending;
                }
                Some(record)
            })
            .collect();
        (Some(alerts), Some(progress(job, entry.exec_log())))
    } else {
        (None, None)
    };
    JobNow {
        record: JobRecord::new(key, entry),
        state_since: job.t_state(),
        alerts,
        exec,
    }
}

/// How far a job's execution has come: its prolog and epilog actions and
/// its exec eventlog (RFC 21, RFC 50).
fn progress(job: &Job, exec: Option<&ExecLog>) -> Value {
    let mut out = json!({
        "prologs_running": job.prologs_active(),
        "prolog_since": job.prolog_since(),
        "epilogs_running": job.epilogs_active(),
        "epilog_since": job.epilog_since(),
        "started": job.started,
        "freed": job.freed,
    });
    if let Some(x) = exec {
        out["eventlog"] = json!({
            "events": x.event_count(),
            "initialized": x.initialized(),
            "started": x.started(),
            "recoverable": x.recoverable(),
            "reattached": x.reattached(),
            "reattaches": x.reattach_count(),
            "complete_status": x.complete_status(),
            "shell_events": x.shell_event_count(),
            "last_shell_event": x.last_shell_event(),
            "done": x.done(),
        });
    }
    out
}
