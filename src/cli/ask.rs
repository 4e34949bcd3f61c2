//! The client side of the query API, for `fluxpipe jobs` and `fluxpipe
//! resource`: ask one or several running pipelines (`--url`, repeated; the
//! members of a Kafka consumer group each answer for their part) and hand
//! back every member's answer.

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::Value;
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
    /// items of the list `key` are in hand or there are no more. Returns
    /// the items and whether more were left.
    pub fn get_pages(
        &self,
        base: &str,
        path: &str,
        key: &str,
        query: &[(&str, String)],
        want: usize,
    ) -> Result<(Vec<Value>, bool)> {
        self.runtime.block_on(async {
            let mut items = Vec::new();
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
                match page["next"].as_str() {
                    Some(next) if items.len() < want => after = Some(next.to_string()),
                    Some(_) => return Ok((items, true)),
                    None => return Ok((items, false)),
                }
            }
        })
    }
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
    let response = request
        .send()
        .await
        .with_context(|| format!("{base}: no answer"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .with_context(|| format!("{base}: answer cut off"))?;
    let value: Value = serde_json::from_str(&body)
        .with_context(|| format!("{url}: not JSON (is this a fluxpipe API?)"))?;
    if !status.is_success() {
        let why = value["error"].as_str().unwrap_or("(no reason given)");
        bail!("{url}: {status}: {why}");
    }
    Ok(value)
}
