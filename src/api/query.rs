//! `/api/v1/...`: what the pipeline holds now, asked of the shards'
//! own state ([`crate::channels::query`]) and merged here. JSON; a list
//! comes as an object with the list under the resource's name.
//!
//! - `GET /api/v1/jobs`: jobs held (active, and inactive ones within
//!   their grace), in `flux jobs` order; filters `cluster`, `state` (names
//!   and `pending`, `running`, `active`, `inactive`, comma-separated),
//!   `user` (a name as Flux's side sent it, else this host's accounts
//!   give its uid; or a uid), `userid`, `since` (epoch seconds), `id`
//!   (any encoding); `limit`
//!   (default 1000, at most 10000) and `after` (the `next` of the page
//!   before). A narrow filter over many jobs may give a short page (even
//!   an empty one) with a `next`: each shard looks at a bounded number of
//!   jobs per answer, so that a question never holds up ingest; the
//!   listing ends where `next` is null.
//! - `GET /api/v1/jobs/{id}`: one job (`cluster` when the id is in several).
//! - `GET /api/v1/nodes`: every rank, filters `cluster` and `state`.
//! - `GET /api/v1/clusters`: each cluster's jobs per state, ranks per
//!   state, newest event, event clock.
//! - `GET /api/v1/alerts`: what fires now, as the alerts stream has it,
//!   oldest first, and how many fire in all; filter `cluster`, `limit` and
//!   `after` as for jobs.

use crate::channels::query::{Answer, ClusterQueues, JobNow, Query, Questions};
use crate::flux::jobid::JobId;
use crate::flux::resource::RankState;
use crate::flux::user::UserMatch;
use crate::keyed::query::{AlertPosition, ClusterCounts, JobFilter, Position, QueueFilter};
use crate::output::AlertRecord;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query as Params, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

const DEFAULT_LIMIT: usize = 1000;
const MAX_LIMIT: usize = 10_000;
/// Longest a question waits for the shards (behind their queued records).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The `/api/v1` routes.
pub fn routes(questions: Questions) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/jobs", get(jobs))
        .route("/api/v1/jobs/{id}", get(job))
        .route("/api/v1/nodes", get(nodes))
        .route("/api/v1/clusters", get(clusters))
        .route("/api/v1/queues", get(queues))
        .route("/api/v1/alerts", get(alerts))
        .with_state(questions)
}

/// An answer that is not a 200: `{"error": why}`.
#[derive(Debug)]
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn problem(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError(status, message.into())
}

fn bad_query(e: QueryRejection, keys: &str) -> ApiError {
    problem(
        StatusCode::BAD_REQUEST,
        format!("{} (the keys are {keys})", e.body_text()),
    )
}

/// A list answer, with the input partitions it covers when the pipeline
/// reads partitions (a member of a Kafka consumer group answers for those
/// it owns): `"partitions": [{"source", "topic", "owned", "partitions"}]`.
fn answer(questions: &Questions, mut body: Value) -> Response {
    if let Some(owned) = questions.ownership.report() {
        body["partitions"] = json!(owned);
    }
    Json(body).into_response()
}

async fn ask(questions: &Questions, query: Query) -> Result<Vec<Answer>, ApiError> {
    match tokio::time::timeout(ANSWER_TIMEOUT, questions.ask(&query)).await {
        Ok(Ok(answers)) => Ok(answers),
        Ok(Err(e)) => Err(problem(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
        Err(_) => Err(problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the shards did not answer in time (busy)",
        )),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobParams {
    cluster: Option<String>,
    state: Option<String>,
    userid: Option<i64>,
    /// A name (as Flux's side resolved it) or a uid.
    user: Option<String>,
    since: Option<f64>,
    id: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
    /// Queue names, comma-separated (a parent takes its virtual queues).
    queue: Option<String>,
}

fn parse_id(text: &str) -> Result<JobId, ApiError> {
    JobId::parse(text).map_err(|e| problem(StatusCode::BAD_REQUEST, format!("id `{text}`: {e}")))
}

/// The shards' pages (each asked for one more than `limit`), merged: the
/// first `limit` items in order, and the position the next page starts
/// after when there is more.
fn first_page<P: Ord, T>(
    mut all: Vec<(P, T)>,
    limit: usize,
    encode: impl Fn(&P) -> String,
) -> (Vec<T>, Option<String>) {
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let more = all.len() > limit;
    all.truncate(limit);
    let next = more.then(|| all.last().map(|(p, _)| encode(p))).flatten();
    (all.into_iter().map(|(_, t)| t).collect(), next)
}

/// Every shard's page, merged into one page of `limit` and the position
/// the next one starts after (if there is more).
async fn jobs_page(
    questions: &Questions,
    filter: JobFilter,
    after: Option<Position>,
    limit: usize,
) -> Result<(Vec<JobNow>, Option<String>), ApiError> {
    // One more than asked: whether there is a next page.
    let query = Query::Jobs {
        filter,
        after,
        limit: limit + 1,
    };
    let pages = ask(questions, query)
        .await?
        .into_iter()
        .filter_map(|a| match a {
            Answer::Jobs(page, stopped_at) => Some((page, stopped_at)),
            _ => None,
        });
    Ok(merge_job_pages(pages, limit))
}

/// The shards' pages of jobs merged into one of `limit`, and the position
/// the next starts after. A shard that stopped short (its work per answer
/// is bounded) looked at nothing past where it stopped: the page ends
/// there, short perhaps, with a `next`.
fn merge_job_pages<T>(
    pages: impl IntoIterator<Item = (Vec<(Position, T)>, Option<Position>)>,
    limit: usize,
) -> (Vec<T>, Option<String>) {
    let mut all: Vec<(Position, T)> = Vec::new();
    let mut cut: Option<Position> = None;
    for (page, stopped_at) in pages {
        all.extend(page);
        cut = match (cut, stopped_at) {
            (Some(c), Some(s)) => Some(c.min(s)),
            (c, s) => c.or(s),
        };
    }
    if let Some(c) = &cut {
        all.retain(|(p, _)| p <= c);
    }
    let (jobs, next) = first_page(all, limit, Position::encode);
    (jobs, next.or_else(|| cut.map(|c| c.encode())))
}

async fn jobs(
    State(questions): State<Questions>,
    params: Result<Params<JobParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = match params {
        Ok(Params(p)) => p,
        Err(e) => {
            return Err(bad_query(
                e,
                "cluster, state, user, userid, since, id, limit, after, queue",
            ));
        }
    };
    let states = match p.state.as_deref().map(JobFilter::parse_states).transpose() {
        Ok(s) => s,
        Err(e) => return Err(problem(StatusCode::BAD_REQUEST, e.to_string())),
    };
    let id = p.id.as_deref().map(parse_id).transpose()?;
    let after = match p.after.as_deref().map(Position::decode).transpose() {
        Ok(a) => a,
        Err(e) => return Err(problem(StatusCode::BAD_REQUEST, e.to_string())),
    };
    let user = match (p.user, p.userid) {
        (Some(_), Some(_)) => {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                "give `user` or `userid`, not both",
            ));
        }
        (Some(text), None) => Some(user_match(text).await),
        (None, uid) => uid.map(UserMatch::Id),
    };
    let queue = match p.queue {
        Some(asked) => Some(queue_filter(&questions, &asked, p.cluster.clone()).await?),
        None => None,
    };
    let filter = JobFilter {
        cluster: p.cluster,
        states,
        user,
        since: p.since,
        id,
        queue,
    };
    let limit = p.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let (jobs, next) = jobs_page(&questions, filter, after, limit).await?;
    Ok(answer(&questions, json!({ "jobs": jobs, "next": next })))
}

/// Queues asked for, resolved against the `[queues]` tables the shards
/// keep (a parent takes its virtual queues there).
async fn queue_filter(
    questions: &Questions,
    asked: &str,
    cluster: Option<String>,
) -> Result<QueueFilter, ApiError> {
    let tables = cluster_queues(questions, cluster).await?;
    Ok(QueueFilter::new(
        asked,
        tables.iter().map(|t| (t.cluster.as_str(), &t.config)),
    ))
}

/// Every shard's `[queues]` tables.
async fn cluster_queues(
    questions: &Questions,
    cluster: Option<String>,
) -> Result<Vec<ClusterQueues>, ApiError> {
    let mut tables: Vec<ClusterQueues> = ask(questions, Query::Queues { cluster })
        .await?
        .into_iter()
        .flat_map(|a| match a {
            Answer::Queues(t) => t,
            _ => Vec::new(),
        })
        .collect();
    tables.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    Ok(tables)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueParams {
    cluster: Option<String>,
}

/// Each cluster's queues as its `[queues]` table configures them, with
/// the nodes of each queue that is not virtual.
async fn queues(
    State(questions): State<Questions>,
    params: Result<Params<QueueParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = match params {
        Ok(Params(p)) => p,
        Err(e) => return Err(bad_query(e, "cluster")),
    };
    let mut out = Vec::new();
    for t in cluster_queues(&questions, p.cluster).await? {
        for (name, entry) in t.config.iter() {
            let slice = t
                .slices
                .iter()
                .find(|(n, _)| n == entry.parent.as_deref().unwrap_or(name));
            out.push(json!({
                "cluster": t.cluster,
                "queue": name,
                "parent": entry.parent,
                "requires": entry.requires,
                "ranks": slice.map(|(_, r)| r.to_string()),
                "nnodes": slice.map_or(0, |(_, r)| r.len()),
            }));
        }
    }
    Ok(answer(&questions, json!({ "queues": out })))
}

/// A `user` asked for: a name's uid in this host's accounts is the
/// fallback for jobs that came with no name (NSS may block: off the
/// runtime's threads).
async fn user_match(text: String) -> UserMatch {
    let asked = text.clone();
    tokio::task::spawn_blocking(move || UserMatch::parse(&asked, crate::accounts::uid_of_name))
        .await
        .unwrap_or_else(|_| UserMatch::parse(&text, |_| None))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OneJobParams {
    cluster: Option<String>,
}

async fn job(
    State(questions): State<Questions>,
    Path(id): Path<String>,
    params: Result<Params<OneJobParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = match params {
        Ok(Params(p)) => p,
        Err(e) => return Err(bad_query(e, "cluster")),
    };
    let id = parse_id(&id)?;
    let filter = JobFilter {
        cluster: p.cluster,
        id: Some(id),
        ..JobFilter::default()
    };
    let (mut found, _) = jobs_page(&questions, filter, None, MAX_LIMIT).await?;
    match found.len() {
        0 => Err(problem(
            StatusCode::NOT_FOUND,
            format!("no job {id} is held"),
        )),
        1 => Ok(Json(found.remove(0)).into_response()),
        _ => {
            let clusters: Vec<Value> = found
                .iter()
                .map(|j| serde_json::to_value(&j.record).unwrap_or(Value::Null)["cluster"].clone())
                .collect();
            Ok((
                    StatusCode::CONFLICT,
                    Json(json!({
                        "error": format!("job {id} is held in several clusters: say which with ?cluster="),
                        "clusters": clusters,
                    })),
                )
                    .into_response())
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeParams {
    cluster: Option<String>,
    state: Option<String>,
    /// Only the nodes of this queue (a virtual queue's are its parent's).
    queue: Option<String>,
}

/// The states a rank is in, as `flux resource status` names them.
fn rank_states(r: &RankState) -> Vec<&'static str> {
    let mut out = vec![match r.online {
        Some(true) => "online",
        Some(false) => "offline",
        None => "unknown",
    }];
    if r.draining {
        out.push("draining");
    } else if r.drained {
        out.push("drained");
    }
    if r.torpid {
        out.push("torpid");
    }
    if r.excluded {
        out.push("excluded");
    }
    out
}

const NODE_STATES: &[&str] = &[
    "online", "offline", "unknown", "drained", "draining", "torpid", "excluded",
];

async fn nodes(
    State(questions): State<Questions>,
    params: Result<Params<NodeParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = match params {
        Ok(Params(p)) => p,
        Err(e) => return Err(bad_query(e, "cluster, state, queue")),
    };
    let wanted: Option<Vec<String>> = p.state.map(|s| {
        s.split(',')
            .map(|w| w.trim().to_ascii_lowercase())
            .filter(|w| !w.is_empty())
            .collect()
    });
    if let Some(bad) = wanted
        .iter()
        .flatten()
        .find(|w| !NODE_STATES.contains(&w.as_str()))
    {
        return Err(problem(
            StatusCode::BAD_REQUEST,
            format!(
                "unknown node state `{bad}`; expected one of {}",
                NODE_STATES.join(", ")
            ),
        ));
    }
    let query = Query::Nodes {
        cluster: p.cluster,
        queue: p.queue,
    };
    let answers = ask(&questions, query).await?;
    let mut ranks: Vec<(String, RankState)> = answers
        .into_iter()
        .flat_map(|a| match a {
            Answer::Nodes(n) => n,
            _ => Vec::new(),
        })
        .collect();
    ranks.sort_by(|a, b| (&a.0, a.1.rank).cmp(&(&b.0, b.1.rank)));
    let nodes: Vec<Value> = ranks
        .iter()
        .filter_map(|(cluster, r)| {
            let states = rank_states(r);
            if let Some(w) = &wanted
                && !w.iter().any(|w| states.contains(&w.as_str()))
            {
                return None;
            }
            Some(json!({
                "cluster": cluster,
                "rank": r.rank,
                "hostname": r.hostname,
                "states": states,
                "online": r.online,
                "torpid": r.torpid,
                "drained": r.drained,
                "draining": r.draining,
                "drain_reason": r.drain_reason,
                "drain_timestamp": r.drain_timestamp,
            }))
        })
        .collect();
    Ok(answer(&questions, json!({ "nodes": nodes })))
}

async fn clusters(State(questions): State<Questions>) -> Result<Response, ApiError> {
    let answers = ask(&questions, Query::Clusters).await?;
    let mut merged: BTreeMap<String, ClusterCounts> = BTreeMap::new();
    for answer in answers {
        if let Answer::Clusters(counts) = answer {
            for (cluster, c) in counts {
                merged.entry(cluster).or_default().merge(&c);
            }
        }
    }
    let clusters: Vec<Value> = merged
        .into_iter()
        .map(|(cluster, c)| {
            json!({
                "cluster": cluster,
                "jobs": c.jobs,
                "nodes": c.nodes,
                "newest_event": c.newest_event,
                "clock": c.clock,
            })
        })
        .collect();
    Ok(answer(&questions, json!({ "clusters": clusters })))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertParams {
    cluster: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

async fn alerts(
    State(questions): State<Questions>,
    params: Result<Params<AlertParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = match params {
        Ok(Params(p)) => p,
        Err(e) => return Err(bad_query(e, "cluster, limit, after")),
    };
    let limit = p.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let after = match p.after.as_deref().map(AlertPosition::decode).transpose() {
        Ok(a) => a,
        Err(e) => return Err(problem(StatusCode::BAD_REQUEST, e.to_string())),
    };
    // One more than asked: whether there is a next page.
    let query = Query::Alerts {
        cluster: p.cluster,
        after,
        limit: limit + 1,
    };
    let mut all: Vec<(AlertPosition, AlertRecord)> = Vec::new();
    let mut total = 0;
    for answer in ask(&questions, query).await? {
        if let Answer::Alerts(page, n) = answer {
            all.extend(page);
            total += n;
        }
    }
    let (alerts, next) = first_page(all, limit, AlertPosition::encode);
    Ok(answer(
        &questions,
        json!({ "alerts": alerts, "next": next, "firing": total }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::listing::Place;
    use std::sync::Arc;

    fn pos(id: u64) -> Position {
        let c: Arc<str> = "c".into();
        Position::at(&c, &Place::new(1, -(id as f64), id))
    }

    fn page(ids: &[u64], stopped: Option<u64>) -> (Vec<(Position, u64)>, Option<Position>) {
        (ids.iter().map(|&i| (pos(i), i)).collect(), stopped.map(pos))
    }

    /// Places run from high ids to low (newest start first).
    #[test]
    fn a_shard_that_stopped_short_ends_the_page() {
        // Shard one looked at everything; shard two stopped at 7: what
        // shard one has past 7 waits for the next page.
        let (jobs, next) = merge_job_pages([page(&[9, 6, 2], None), page(&[8], Some(7))], 10);
        assert_eq!(jobs, [9, 8]);
        assert_eq!(next, Some(pos(7).encode()));
        // Full before the cut: the page ends at its last job.
        let (jobs, next) = merge_job_pages([page(&[9, 6, 2], None), page(&[8], Some(1))], 2);
        assert_eq!(jobs, [9, 8]);
        assert_eq!(next, Some(pos(8).encode()));
        // Nobody stopped, nothing more: no next.
        let (jobs, next) = merge_job_pages([page(&[9, 6], None), page(&[8], None)], 10);
        assert_eq!(jobs, [9, 8, 6]);
        assert_eq!(next, None);
    }
}
