//! The client side of the query API, for `fluxpipe jobs` and `fluxpipe
//! resource`: ask one or several running pipelines (`--url`, repeated; the
//! members of a Kafka consumer group each answer for their part) and hand
//! back every member's answer.

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

/// Where to ask, and with what.
#[derive(Args, Debug, Clone)]
pub struct Servers {
    /// A running fluxpipe's API (its `[api] address`); repeat it for the
    /// members of a group: their answers are merged.
    #[arg(
        long = "url",
        value_name = "URL",
        default_value = "http://127.0.0.1:9464"
    )]
    pub urls: Vec<String>,
    /// A file holding the API's token (`[api] token_file`); or set
    /// FLUXPIPE_TOKEN.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to every server given.
pub struct Client {
    http: reqwest::Client,
    urls: Vec<String>,
    token: Option<String>,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    pub fn new(servers: &Servers) -> Result<Self> {
        let token = match &servers.token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var("FLUXPIPE_TOKEN").ok(),
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .context("cannot build the HTTP client")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime")?;
        let urls = servers
            .urls
            .iter()
            .map(|u| {
                let u = u.trim_end_matches('/');
                if u.contains("://") {
                    u.to_string()
                } else {
                    format!("http://{u}")
                }
            })
            .collect();
        Ok(Client {
            http,
            urls,
            token,
            runtime,
        })
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// `GET path` of every server, at once; each answer in `urls` order.
    /// A server that does not answer, or answers with an error, fails the
    /// whole question: a merged answer with a member missing would be
    /// wrong without saying so.
    pub fn get_all(&self, path: &str, query: &[(&str, String)]) -> Result<Vec<Value>> {
        self.runtime.block_on(async {
            let mut asks = tokio::task::JoinSet::new();
            for (i, base) in self.urls.iter().enumerate() {
                let (http, token) = (self.http.clone(), self.token.clone());
                let (base, path) = (base.clone(), path.to_string());
                let query: Vec<(String, String)> = query
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect();
                asks.spawn(
                    async move { (i, get(&http, token.as_deref(), &base, &path, &query).await) },
                );
            }
            let mut answers: Vec<Option<Result<Value>>> = self.urls.iter().map(|_| None).collect();
            while let Some(done) = asks.join_next().await {
                let (i, answer) = done.context("a request failed")?;
                answers[i] = Some(answer);
            }
            answers.into_iter().flatten().collect()
        })
    }

    /// `GET path` of one server, following its pages (`next`) until `want`
    /// items of the list `key` are in hand or there are no more.
    pub fn get_pages(
        &self,
        base: &str,
        path: &str,
        key: &str,
        query: &[(&str, String)],
        want: usize,
    ) -> Result<Paged> {
        self.runtime.block_on(async {
            let mut items = Vec::new();
            let mut partitions = None;
            let mut after: Option<String> = None;
            loop {
                let mut q = query.to_vec();
                q.push(("limit", (want - items.len()).clamp(1, 10_000).to_string()));
                if let Some(a) = &after {
                    q.push(("after", a.clone()));
                }
                let page = get(&self.http, self.token.as_deref(), base, path, &q).await?;
                if let Some(list) = page[key].as_array() {
                    items.extend(list.iter().cloned());
                }
                if partitions.is_none() {
                    partitions = page.get("partitions").cloned();
                }
                let more = match page["next"].as_str() {
                    Some(next) if items.len() < want => {
                        after = Some(next.to_string());
                        continue;
                    }
                    Some(_) => true,
                    None => false,
                };
                return Ok(Paged {
                    items,
                    more,
                    partitions,
                });
            }
        })
    }
}

impl Client {
    /// `GET path` of every server at once, each answer's text (or why
    /// there is none) in `urls` order; one server failing fails only its
    /// own answer.
    pub fn get_text_each(&self, path: &str) -> Vec<Result<String>> {
        self.runtime.block_on(async {
            let mut asks = tokio::task::JoinSet::new();
            for (i, base) in self.urls.iter().enumerate() {
                let url = format!("{base}{path}");
                let mut request = self.http.get(&url);
                if let Some(t) = &self.token {
                    request = request.bearer_auth(t);
                }
                asks.spawn(async move {
                    let answer = match fetch(request, &url).await {
                        Ok((status, _)) if !status.is_success() => Err(anyhow!("{url}: {status}")),
                        Ok((_, body)) => Ok(body),
                        Err(e) => Err(e),
                    };
                    (i, answer)
                });
            }
            let mut answers: Vec<Result<String>> = self
                .urls
                .iter()
                .map(|u| Err(anyhow::anyhow!("{u}: not asked")))
                .collect();
            while let Some(Ok((i, answer))) = asks.join_next().await {
                answers[i] = answer;
            }
            answers
        })
    }

    /// `GET path` of every server as one long answer of lines (a tap),
    /// each line handed to `each` as it comes, from whichever server sent
    /// it, until `each` says stop or every answer has ended. A server that
    /// refuses fails the whole.
    pub fn stream_lines(
        &self,
        path: &str,
        query: &[(&str, String)],
        mut each: impl FnMut(&str) -> bool,
    ) -> Result<()> {
        // No overall timeout: the answer lasts as long as the tap.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .context("cannot build the HTTP client")?;
        self.runtime.block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<String>>(64);
            let mut readers = tokio::task::JoinSet::new();
            for base in &self.urls {
                let url = format!("{base}{path}");
                let mut request = http.get(&url).query(query);
                if let Some(t) = &self.token {
                    request = request.bearer_auth(t);
                }
                let tx = tx.clone();
                readers.spawn(async move {
                    let read = async {
                        let mut response = request
                            .send()
                            .await
                            .with_context(|| format!("{url}: no answer"))?;
                        let status = response.status();
                        if !status.is_success() {
                            let body = response.text().await.unwrap_or_default();
                            let why = serde_json::from_str::<Value>(&body)
                                .ok()
                                .and_then(|v| v["error"].as_str().map(str::to_string))
                                .unwrap_or(body);
                            bail!("{url}: {status}: {why}");
                        }
                        let mut pending = Vec::new();
                        while let Some(chunk) = response
                            .chunk()
                            .await
                            .with_context(|| format!("{url}: answer cut off"))?
                        {
                            pending.extend_from_slice(&chunk);
                            while let Some(at) = pending.iter().position(|b| *b == b'\n') {
                                let line: Vec<u8> = pending.drain(..=at).collect();
                                let text = String::from_utf8_lossy(&line[..at]).into_owned();
                                if tx.send(Ok(text)).await.is_err() {
                                    return Ok(());
                                }
                            }
                        }
                        Ok(())
                    };
                    if let Err(e) = read.await {
                        let _ = tx.send(Err(e)).await;
                    }
                });
            }
            drop(tx);
            while let Some(line) = rx.recv().await {
                if !each(&line?) {
                    break;
                }
            }
            readers.abort_all();
            Ok(())
        })
    }
}

/// One server's pages of a list.
pub struct Paged {
    pub items: Vec<Value>,
    /// More were left.
    pub more: bool,
    /// The input partitions its answer covers (a consumer group's member).
    pub partitions: Option<Value>,
}

/// What the members' answers did not cover, said plainly: partitions of a
/// topic that no member given owns (their jobs and nodes are missing from
/// the merged answer), or that two members both claim (a rebalance under
/// way). Each member's `partitions` report, or `None` from a pipeline
/// that reads no partitions.
pub fn coverage(reports: &[Option<&Value>]) -> Vec<String> {
    let mut topics: BTreeMap<(String, String), (Vec<i64>, Option<i64>)> = BTreeMap::new();
    for report in reports.iter().flatten() {
        for t in report.as_array().into_iter().flatten() {
            let key = (
                t["source"].as_str().unwrap_or("").to_string(),
                t["topic"].as_str().unwrap_or("").to_string(),
            );
            let entry = topics.entry(key).or_default();
            entry.0.extend(
                t["owned"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_i64),
            );
            entry.1 = entry.1.max(t["partitions"].as_i64());
        }
    }
    let mut said = Vec::new();
    for ((source, topic), (mut owned, count)) in topics {
        owned.sort_unstable();
        let twice: BTreeSet<i64> = owned
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        owned.dedup();
        if !twice.is_empty() {
            said.push(format!(
                "source {source}, topic {topic}: partitions {} answered by more than one member (a rebalance under way?)",
                list(&twice)
            ));
        }
        match count {
            Some(n) => {
                let missing: BTreeSet<i64> = (0..n).filter(|p| owned.binary_search(p).is_err()).collect();
                if !missing.is_empty() {
                    said.push(format!(
                        "source {source}, topic {topic}: partitions {} of {n} had no answer (no member given owns them): what they carry is missing",
                        list(&missing)
                    ));
                }
            }
            None => said.push(format!(
                "source {source}, topic {topic}: its partition count is not known yet: whether every partition answered cannot be told"
            )),
        }
    }
    said
}

fn list(set: &BTreeSet<i64>) -> String {
    set.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// `GET base/path?query`, as JSON; an error answer says its reason.
async fn get<K: serde::Serialize, V: serde::Serialize>(
    http: &reqwest::Client,
    token: Option<&str>,
    base: &str,
    path: &str,
    query: &[(K, V)],
) -> Result<Value> {
    let url = format!("{base}{path}");
    let mut request = http.get(&url).query(query);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let (status, body) = fetch(request, base).await?;
    let value: Value = serde_json::from_str(&body)
        .with_context(|| format!("{url}: not JSON (is this a fluxpipe API?)"))?;
    if !status.is_success() {
        let why = value["error"].as_str().unwrap_or("(no reason given)");
        bail!("{url}: {status}: {why}");
    }
    Ok(value)
}

/// Send a request and read its whole answer: status and text. `who`
/// names the server in errors.
async fn fetch(
    request: reqwest::RequestBuilder,
    who: &str,
) -> Result<(reqwest::StatusCode, String)> {
    let response = request
        .send()
        .await
        .with_context(|| format!("{who}: no answer"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .with_context(|| format!("{who}: answer cut off"))?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn partitions_nobody_answered_for_are_said() {
        let a = json!([{"source": "k", "topic": "t", "owned": [0, 1], "partitions": 4}]);
        let b = json!([{"source": "k", "topic": "t", "owned": [3], "partitions": 4}]);
        let said = coverage(&[Some(&a), Some(&b)]);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("partitions 2 of 4 had no answer"),
            "{said:?}"
        );
        let c = json!([{"source": "k", "topic": "t", "owned": [1, 2], "partitions": 4}]);
        let said = coverage(&[Some(&a), Some(&b), Some(&c)]);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("partitions 1 answered by more than one"),
            "{said:?}"
        );
        assert!(coverage(&[None, None]).is_empty());
        let d = json!([{"source": "k", "topic": "t", "owned": [0, 1, 2, 3], "partitions": 4}]);
        assert!(coverage(&[Some(&d)]).is_empty());
    }
}
