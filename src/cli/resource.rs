//! `fluxpipe resource status` and `fluxpipe resource drain`: the nodes a
//! running fluxpipe holds, printed as `flux resource status` and `flux
//! resource drain` (with no targets) print them when piped, or as JSON.
//! Read-only: fluxpipe watches instances, it does not drain nodes.

use super::ask::{Client, Servers, coverage};
use super::listing::{self, Columns};
use crate::flux::hostlist::Hostlist;
use crate::flux::resource::{RankState, rank_name};
use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ResourceArgs {
    #[command(subcommand)]
    pub command: ResourceCommand,
}

#[derive(Subcommand, Debug)]
pub enum ResourceCommand {
    /// Nodes by state, as `flux resource status`.
    Status(StatusArgs),
    /// Drained and draining nodes with their reasons, as `flux resource
    /// drain` with no targets.
    Drain(DrainArgs),
}

/// What both subcommands take: where to ask, which cluster, how to print.
#[derive(Args, Debug)]
pub struct NodeQuery {
    #[command(flatten)]
    pub servers: Servers,
    /// Only this cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only the nodes of this queue, as the cluster's `[queues]` table and
    /// its nodes' properties say (a virtual queue's are its parent's).
    #[arg(short = 'q', long)]
    pub queue: Option<String>,
    /// No header line.
    #[arg(short = 'n', long = "no-header")]
    pub no_header: bool,
    /// The nodes as JSON (`{"nodes": [...]}`: drain lists the drained
    /// ones), not a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub query: NodeQuery,
    /// States to show, comma-separated: all, online, offline, avail,
    /// exclude, drain, draining, drained, torpid.
    #[arg(short = 's', long = "states", value_name = "STATES")]
    pub states: Option<String>,
}

#[derive(Args, Debug)]
pub struct DrainArgs {
    #[command(flatten)]
    pub query: NodeQuery,
}

pub fn run(args: ResourceArgs) -> Result<ExitCode> {
    match args.command {
        ResourceCommand::Status(a) => status(a),
        ResourceCommand::Drain(a) => drain(a),
    }
}

/// One rank as the API gives it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Node {
    pub cluster: String,
    pub rank: u32,
    pub hostname: Option<String>,
    pub online: Option<bool>,
    #[serde(default)]
    pub torpid: bool,
    #[serde(default)]
    pub drained: bool,
    #[serde(default)]
    pub draining: bool,
    pub drain_reason: Option<String>,
    pub drain_timestamp: Option<f64>,
    #[serde(default)]
    pub states: Vec<String>,
}

impl Node {
    /// A rank of the model's state, as the query API gives it.
    pub fn of_rank(cluster: &str, r: &RankState) -> Node {
        Node {
            cluster: cluster.to_string(),
            rank: r.rank,
            hostname: r.hostname.clone(),
            online: r.online,
            torpid: r.torpid,
            drained: r.drained,
            draining: r.draining,
            drain_reason: r.drain_reason.clone(),
            drain_timestamp: r.drain_timestamp,
            states: if r.excluded {
                vec!["excluded".to_string()]
            } else {
                Vec::new()
            },
        }
    }

    fn excluded(&self) -> bool {
        self.states.iter().any(|s| s == "excluded")
    }
    fn host(&self) -> String {
        rank_name(self.rank, self.hostname.as_deref()).into_owned()
    }
    /// flux has no "unknown": a rank not known to be up shows as down.
    fn up(&self) -> bool {
        self.online == Some(true)
    }
}

/// Nodes by cluster, each cluster's in rank order.
pub type ByCluster = BTreeMap<String, Vec<Node>>;

/// A state's name and which nodes are in it.
type StateOf<'a> = (&'static str, &'a dyn Fn(&Node) -> bool);

/// Every server's nodes (as they came, and by cluster).
fn nodes(q: &NodeQuery) -> Result<(Vec<Value>, ByCluster)> {
    let client = Client::new(&q.servers)?;
    let query: Vec<(&str, String)> = [("cluster", &q.cluster), ("queue", &q.queue)]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.clone()?)))
        .collect();
    let mut raw = Vec::new();
    let mut by_cluster: BTreeMap<String, Vec<Node>> = BTreeMap::new();
    let answers = client.get_all("/api/v1/nodes", &query)?;
    let reports: Vec<Option<&Value>> = answers.iter().map(|a| a.get("partitions")).collect();
    for warning in coverage(&reports) {
        eprintln!("fluxpipe resource: warning: {warning}");
    }
    for answer in &answers {
        for v in answer["nodes"].as_array().into_iter().flatten() {
            let node: Node = serde_json::from_value(v.clone())?;
            by_cluster
                .entry(node.cluster.clone())
                .or_default()
                .push(node);
            raw.push(v.clone());
        }
    }
    for list in by_cluster.values_mut() {
        list.sort_by_key(|n| n.rank);
        list.dedup_by_key(|n| n.rank);
    }
    Ok((raw, by_cluster))
}

const STATES: &[&str] = &[
    "all", "online", "offline", "avail", "exclude", "drain", "draining", "drained", "torpid",
];
const DEFAULT_STATES: &[&str] = &["avail", "exclude", "draining", "drained", "torpid"];

/// What `-s` asks for: the states, and whether online and offline rows.
#[derive(Debug, PartialEq)]
pub struct Selection {
    states: Vec<&'static str>,
    online: bool,
    offline: bool,
    /// Rows with no nodes are shown (not when no `-s` was given)...
    empty: bool,
    /// ...but offline ones only when `offline` was asked for.
    offline_named: bool,
}

impl Selection {
    /// What no `-s` shows.
    fn default_states() -> Self {
        Selection {
            states: DEFAULT_STATES.to_vec(),
            online: true,
            offline: true,
            empty: false,
            offline_named: false,
        }
    }

    pub fn parse(text: Option<&str>) -> Result<Self> {
        let Some(text) = text else {
            return Ok(Self::default_states());
        };
        let mut states: Vec<&'static str> = Vec::new();
        let (mut online, mut offline) = (false, false);
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let Some(&s) = STATES.iter().find(|s| **s == word) else {
                if ["allocated", "housekeeping"].contains(&word) {
                    bail!(
                        "state {word}: fluxpipe does not keep it (flux resource status shows it from the live instance)"
                    );
                }
                bail!(
                    "invalid resource state {word}; valid states: {}",
                    STATES.join(", ")
                );
            };
            match s {
                "online" => online = true,
                "offline" => offline = true,
                "all" => states.extend(DEFAULT_STATES),
                "drain" => states.extend(["draining", "drained"]),
                s => states.push(s),
            }
        }
        if states.is_empty() {
            states = DEFAULT_STATES.to_vec();
        }
        let offline_named = offline;
        if !online && !offline {
            (online, offline) = (true, true);
        }
        Ok(Selection {
            states,
            online,
            offline,
            empty: true,
            offline_named,
        })
    }

    fn wants(&self, state: &str) -> bool {
        self.states.contains(&state)
    }
}

/// A row of `flux resource status`: a state, up or down, its nodes.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    state: &'static str,
    up: bool,
    hosts: Vec<String>,
    /// Hosts sorted (a row merged from several).
    sorted: bool,
}

fn status_rows(nodes: &[Node], sel: &Selection) -> Vec<Row> {
    let shown_drained = sel.wants("draining") || sel.wants("drained");
    let is_draining = |n: &Node| n.drained && n.draining;
    let is_drained = |n: &Node| n.drained && !n.draining;
    let is_torpid = |n: &Node| n.torpid && !(shown_drained && n.drained);
    let is_avail = |n: &Node| !(n.excluded() || n.drained || n.torpid);
    let mut rows: Vec<Row> = Vec::new();
    let sets: [StateOf; 3] = [
        ("avail", &is_avail),
        ("exclude", &|n: &Node| n.excluded()),
        ("torpid", &is_torpid),
    ];
    for (state, takes) in sets {
        if !sel.wants(state) {
            continue;
        }
        for up in [true, false] {
            let hosts = nodes
                .iter()
                .filter(|n| takes(n) && n.up() == up)
                .map(Node::host)
                .collect();
            rows.push(Row {
                state,
                up,
                hosts,
                sorted: false,
            });
        }
    }
    let drains: [StateOf; 2] = [("draining", &is_draining), ("drained", &is_drained)];
    for (state, takes) in drains {
        if !sel.wants(state) {
            continue;
        }
        let mut any = false;
        for n in nodes.iter().filter(|n| takes(n)) {
            any = true;
            match rows.iter_mut().find(|r| r.state == state && r.up == n.up()) {
                Some(r) => {
                    r.hosts.push(n.host());
                    r.sorted = true;
                }
                None => rows.push(Row {
                    state,
                    up: n.up(),
                    hosts: vec![n.host()],
                    sorted: false,
                }),
            }
        }
        if !any {
            rows.push(Row {
                state,
                up: true,
                hosts: Vec::new(),
                sorted: false,
            });
        }
    }
    rows.retain(|r| {
        let side = if r.up { sel.online } else { sel.offline };
        let shown_empty = sel.empty && (r.up || sel.offline_named);
        side && (!r.hosts.is_empty() || shown_empty)
    });
    rows
}

fn hostlist(hosts: &[String], sorted: bool) -> String {
    let mut list = Hostlist::default();
    for h in hosts {
        list.push(h);
    }
    if sorted {
        list.sorted().to_string()
    } else {
        list.to_string()
    }
}

/// The lines of `flux resource status` (piped: no colour, and so its
/// header runs `STATE` and `UP` together, as flux-core 0.88's does).
fn status_lines(
    clusters: &BTreeMap<String, Vec<Node>>,
    sel: &Selection,
    header: bool,
) -> Vec<String> {
    let several = clusters.len() > 1;
    let width = clusters
        .keys()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(0)
        .max(8);
    let mut lines = Vec::new();
    let prefix = |c: &str| {
        if several {
            format!("{c:<width$} ")
        } else {
            String::new()
        }
    };
    if header {
        lines.push(format!(
            "{}{:>12}{:>2} {:>6} NODELIST",
            prefix("CLUSTER"),
            "STATE",
            "UP",
            "NNODES"
        ));
    }
    for (cluster, nodes) in clusters {
        for row in status_rows(nodes, sel) {
            let state = if row.up {
                row.state.to_string()
            } else {
                format!("{}*", row.state)
            };
            let up = if row.up { "✔" } else { "✗" };
            lines.push(format!(
                "{}{state:>12}{up:>2} {:>6} {}",
                prefix(cluster),
                row.hosts.len(),
                hostlist(&row.hosts, row.sorted)
            ));
        }
    }
    lines
}

fn status(args: StatusArgs) -> Result<ExitCode> {
    let sel = Selection::parse(args.states.as_deref())?;
    let q = &args.query;
    let (raw, clusters) = nodes(q)?;
    let mut out = std::io::stdout().lock();
    if q.json {
        writeln!(out, "{}", json!({ "nodes": raw }))?;
        return Ok(ExitCode::SUCCESS);
    }
    for line in status_lines(&clusters, &sel, !q.no_header) {
        writeln!(out, "{line}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The table of `flux resource drain`: one row per drain time (to the
/// minute), state and reason, draining ranks first.
fn drain_table(clusters: &BTreeMap<String, Vec<Node>>) -> Columns {
    let several = clusters.len() > 1;
    let mut t = Columns::new();
    if several {
        t.left_grow("CLUSTER", 8);
    }
    t.left("TIME", 12);
    t.left_cut("STATE", 8, false);
    t.left_cut("REASON", 30, true);
    t.last("NODELIST");
    for (cluster, nodes) in clusters {
        let mut rows: Vec<(String, String, String, Vec<String>)> = Vec::new();
        let draining = nodes.iter().filter(|n| n.drained && n.draining);
        let drained = nodes.iter().filter(|n| n.drained && !n.draining);
        for n in draining.chain(drained) {
            let time = listing::drain_time(n.drain_timestamp.unwrap_or(0.0));
            let mut state = if n.draining { "draining" } else { "drained" }.to_string();
            if !n.up() {
                state.push('*');
            }
            let reason = n.drain_reason.clone().unwrap_or_default();
            match rows
                .iter_mut()
                .find(|r| r.0 == time && r.1 == state && r.2 == reason)
            {
                Some(r) => r.3.push(n.host()),
                None => rows.push((time, state, reason, vec![n.host()])),
            }
        }
        for (time, state, reason, hosts) in rows {
            let mut row = Vec::new();
            if several {
                row.push(cluster.clone());
            }
            row.extend([time, state, reason, hostlist(&hosts, true)]);
            t.row(row);
        }
    }
    t
}

/// The ranks as `fluxpipe replay` prints them: grouped as `flux resource
/// status` groups them, then the drained ones with their reasons as `flux
/// resource drain` lists them, then those nothing said were up or down (a
/// `flux dump` keeps no liveness): flux shows them down, so the table
/// does, and this line says which they really are.
pub fn print_rank_tables(out: &mut impl Write, clusters: &ByCluster) -> std::io::Result<()> {
    for line in status_lines(clusters, &Selection::default_states(), true) {
        writeln!(out, "{line}")?;
    }
    let drains = drain_table(clusters);
    if !drains.is_empty() {
        writeln!(out)?;
        listing::print(out, &drains, true)?;
    }
    for (cluster, nodes) in clusters {
        let unknown: Vec<String> = nodes
            .iter()
            .filter(|n| n.online.is_none())
            .map(Node::host)
            .collect();
        if !unknown.is_empty() {
            writeln!(out)?;
            writeln!(
                out,
                "{cluster}: liveness unknown (shown down above, as flux shows them): {} {}",
                listing::counted(unknown.len(), "node", "nodes"),
                hostlist(&unknown, false)
            )?;
        }
    }
    Ok(())
}

fn drain(args: DrainArgs) -> Result<ExitCode> {
    let q = &args.query;
    let (raw, clusters) = nodes(q)?;
    let mut out = std::io::stdout().lock();
    if q.json {
        let drained: Vec<&Value> = raw.iter().filter(|n| n["drained"] == true).collect();
        writeln!(out, "{}", json!({ "nodes": drained }))?;
        return Ok(ExitCode::SUCCESS);
    }
    listing::print(&mut out, &drain_table(&clusters), !q.no_header)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(rank: u32, up: bool) -> Node {
        Node {
            cluster: "c".into(),
            rank,
            hostname: Some(format!("node{rank}")),
            online: Some(up),
            torpid: false,
            drained: false,
            draining: false,
            drain_reason: None,
            drain_timestamp: None,
            states: Vec::new(),
        }
    }

    /// flux-core 0.88's own example: node[0-7], 5 and 7 offline, 3 torpid,
    /// 1-2 drained (A), 5 drained (""), 6 drained (maint).
    fn sample() -> BTreeMap<String, Vec<Node>> {
        let mut nodes: Vec<Node> = (0..8).map(|r| node(r, r != 5 && r != 7)).collect();
        nodes[3].torpid = true;
        for (r, why) in [(1, "A"), (2, "A"), (5, ""), (6, "maint")] {
            nodes[r].drained = true;
            nodes[r].drain_reason = Some(why.into());
            nodes[r].drain_timestamp = Some(0.0);
        }
        BTreeMap::from([("c".to_string(), nodes)])
    }

    #[test]
    fn status_as_flux_resource_status_prints_it() {
        let lines = status_lines(&sample(), &Selection::parse(None).unwrap(), true);
        assert_eq!(
            lines.join("\n"),
            "       STATEUP NNODES NODELIST\n\
             \x20      avail ✔      2 node[0,4]\n\
             \x20     avail* ✗      1 node7\n\
             \x20     torpid ✔      1 node3\n\
             \x20    drained ✔      3 node[1-2,6]\n\
             \x20   drained* ✗      1 node5"
        );
    }

    #[test]
    fn asked_for_states_show_their_empty_rows() {
        let lines = status_lines(
            &sample(),
            &Selection::parse(Some("offline")).unwrap(),
            false,
        );
        assert_eq!(
            lines.join("\n"),
            "      avail* ✗      1 node7\n    exclude* ✗      0 \n     torpid* ✗      0 \n    drained* ✗      1 node5"
        );
        assert!(Selection::parse(Some("bogus")).is_err());
        assert!(Selection::parse(Some("allocated")).is_err());
    }

    #[test]
    fn replay_says_which_ranks_have_unknown_liveness() {
        let mut clusters = sample();
        let nodes = clusters.get_mut("c").unwrap();
        for r in [5, 7] {
            nodes[r].online = None;
        }
        let mut out = Vec::new();
        print_rank_tables(&mut out, &clusters).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("      avail* ✗      1 node7\n"), "{text}");
        assert!(text.contains("\nTIME "), "{text}");
        assert!(
            text.ends_with(
                "\nc: liveness unknown (shown down above, as flux shows them): 2 nodes node[5,7]\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn drains_group_by_time_state_and_reason() {
        let t = drain_table(&sample());
        let mut out = Vec::new();
        listing::print(&mut out, &t, true).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "TIME         STATE    REASON                         NODELIST\n\
             \x20            drained  A                              node[1-2]\n\
             \x20            drained*                                node5\n\
             \x20            drained  maint                          node6\n"
        );
    }
}
