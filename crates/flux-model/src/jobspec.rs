//! What a job asked for and was given, as `flux jobs` shows it: read from
//! its jobspec (RFC 14, version 1 as RFC 25 restricts it) and its R the way
//! flux-core's job-list reads them (its job name, queue, project, bank,
//! duration, and the task, core and node counts of `jj_get_counts`).
//!
//! Only these few values are kept, never the jobspec: no environment, no
//! command line beyond the job's name, no working directory.
//!
//! What cannot be read is left unknown, in stages as job-list leaves it: a
//! bad `resources` tree loses the counts, not the name.

use crate::packed::Stamp;
use crate::texts::Texts;
use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use thiserror::Error;

/// A job's values from its jobspec and its R. Counts are unknown (`None`)
/// where job-list leaves them unset (-1).
///
/// Saved as the struct it was before its texts were packed ([`Saved`]):
/// checkpoints read and write the same bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobSpec {
    /// The job's name (`attributes.system.job.name`, else the base name of
    /// the first task's `command[0]`), queue, project, bank, R's hosts as
    /// a hostlist (`node[0-3]`), and who submitted it, by name, as
    /// resolved where Flux runs (the forwarder sends it with `submit`):
    /// by [`Text`], in one allocation (8 bytes, where six
    /// `Option<CompactString>` took 144).
    texts: Texts<{ Text::COUNT }>,
    /// The requested time limit in seconds (0: none). A [`Stamp`], 8
    /// bytes where `Option<f64>` takes 16.
    duration: Stamp,
    /// From the jobspec alone.
    spec_ntasks: Option<u32>,
    spec_ncores: Option<u32>,
    spec_nnodes: Option<u32>,
    /// `per-resource` tasks per node (per core) whose count waits for R.
    tasks_per_node: u32,
    tasks_per_core: u32,
    /// From R: what it allocated, which wins over what was asked.
    r_nnodes: Option<u32>,
    r_ncores: Option<u32>,
    /// When the job's `free` gave R back (a job restored after its end
    /// tells a drain applied later that it held the ranks until then).
    freed_at: Stamp,
    /// The values a `jobspec-update` set (bits of [`Updated`]): a copy of
    /// the jobspec read after it (a KVS `jobspec` is as submitted) keeps them.
    updated: u8,
    /// R's GPUs plus one; 0 before R. Not an `Option`: this fits where one
    /// would add 8 bytes to every job.
    r_ngpus_1: u32,
}

/// The texts of a [`JobSpec`], by index: the queue first, as it is read
/// most (for every change of a job's state, by its alert rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Text {
    Queue,
    Name,
    Nodelist,
    Username,
    Project,
    Bank,
}

impl Text {
    const COUNT: usize = 6;
}

/// A [`JobSpec`]'s texts, each by its name: read in one walk.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Named<'a> {
    pub name: Option<&'a str>,
    pub queue: Option<&'a str>,
    pub project: Option<&'a str>,
    pub bank: Option<&'a str>,
    pub nodelist: Option<&'a str>,
    pub username: Option<&'a str>,
}

impl<'a> Named<'a> {
    fn of(texts: &'a Texts<{ Text::COUNT }>) -> Self {
        let all = texts.all();
        let at = |t: Text| all[t as usize];
        Named {
            name: at(Text::Name),
            queue: at(Text::Queue),
            project: at(Text::Project),
            bank: at(Text::Bank),
            nodelist: at(Text::Nodelist),
            username: at(Text::Username),
        }
    }

    fn pack(self) -> Texts<{ Text::COUNT }> {
        let mut all = [None; Text::COUNT];
        all[Text::Name as usize] = self.name;
        all[Text::Queue as usize] = self.queue;
        all[Text::Project as usize] = self.project;
        all[Text::Bank as usize] = self.bank;
        all[Text::Nodelist as usize] = self.nodelist;
        all[Text::Username as usize] = self.username;
        Texts::new(all)
    }
}

/// A [`JobSpec`] as checkpoints hold it: the fields of the struct it was,
/// in its order. Fields added later are last and defaulted, so older
/// checkpoints still read.
#[derive(Serialize, Deserialize)]
struct Saved<S> {
    name: Option<S>,
    queue: Option<S>,
    project: Option<S>,
    bank: Option<S>,
    duration: Stamp,
    spec_ntasks: Option<u32>,
    spec_ncores: Option<u32>,
    spec_nnodes: Option<u32>,
    tasks_per_node: u32,
    tasks_per_core: u32,
    r_nnodes: Option<u32>,
    r_ncores: Option<u32>,
    nodelist: Option<S>,
    freed_at: Stamp,
    #[serde(default)]
    updated: u8,
    #[serde(default)]
    r_ngpus_1: u32,
    #[serde(default = "none")]
    username: Option<S>,
}

fn none<S>() -> Option<S> {
    None
}

impl Serialize for JobSpec {
    fn serialize<Se: serde::Serializer>(&self, serializer: Se) -> Result<Se::Ok, Se::Error> {
        let Named {
            name,
            queue,
            project,
            bank,
            nodelist,
            username,
        } = Named::of(&self.texts);
        Saved {
            name,
            queue,
            project,
            bank,
            duration: self.duration,
            spec_ntasks: self.spec_ntasks,
            spec_ncores: self.spec_ncores,
            spec_nnodes: self.spec_nnodes,
            tasks_per_node: self.tasks_per_node,
            tasks_per_core: self.tasks_per_core,
            r_nnodes: self.r_nnodes,
            r_ncores: self.r_ncores,
            nodelist,
            freed_at: self.freed_at,
            updated: self.updated,
            r_ngpus_1: self.r_ngpus_1,
            username,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for JobSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Owned: a text with escapes cannot be borrowed from JSON.
        let s = Saved::<CompactString>::deserialize(deserializer)?;
        Ok(JobSpec {
            texts: Named {
                name: s.name.as_deref(),
                queue: s.queue.as_deref(),
                project: s.project.as_deref(),
                bank: s.bank.as_deref(),
                nodelist: s.nodelist.as_deref(),
                username: s.username.as_deref(),
            }
            .pack(),
            duration: s.duration,
            spec_ntasks: s.spec_ntasks,
            spec_ncores: s.spec_ncores,
            spec_nnodes: s.spec_nnodes,
            tasks_per_node: s.tasks_per_node,
            tasks_per_core: s.tasks_per_core,
            r_nnodes: s.r_nnodes,
            r_ncores: s.r_ncores,
            freed_at: s.freed_at,
            updated: s.updated,
            r_ngpus_1: s.r_ngpus_1,
        })
    }
}

/// The bits of [`JobSpec::updated`].
struct Updated;

impl Updated {
    const NAME: u8 = 1;
    const QUEUE: u8 = 2;
    const PROJECT: u8 = 4;
    const BANK: u8 = 8;
    const DURATION: u8 = 16;
}

/// Why (part of) a jobspec could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JobSpecError {
    #[error("jobspec is not a JSON object: {0}")]
    NotObject(String),
    #[error("jobspec attributes: {0}")]
    Attributes(String),
    #[error("jobspec has no job name (no job.name and no tasks[0].command[0])")]
    NoName,
    #[error("jobspec counts: {0}")]
    Counts(String),
}

/// A jobspec read whole in one walk: what a well-formed jobspec takes.
/// Any error sends it to [`Top`] instead, read in stages, which says which
/// part was bad and keeps what the other parts give.
#[derive(Deserialize)]
struct Whole<'a> {
    #[serde(borrow, default)]
    version: Option<&'a RawValue>,
    #[serde(default)]
    resources: Option<Vec<Vertex>>,
    #[serde(borrow, default)]
    tasks: Option<Vec<Task<'a>>>,
    #[serde(default)]
    attributes: Option<Attributes>,
}

/// What job-list reads of a jobspec's top level; the rest is skipped.
#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow, default)]
    version: Option<&'a RawValue>,
    #[serde(borrow, default)]
    resources: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tasks: Option<&'a RawValue>,
    #[serde(borrow, default)]
    attributes: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Attributes {
    #[serde(default)]
    system: Option<System>,
}

#[derive(Deserialize, Default)]
struct System {
    #[serde(default)]
    job: Option<JobDict>,
    #[serde(default)]
    queue: Option<CompactString>,
    #[serde(default)]
    duration: Option<f64>,
    #[serde(default)]
    project: Option<CompactString>,
    #[serde(default)]
    bank: Option<CompactString>,
    #[serde(default)]
    shell: Option<Shell>,
}

#[derive(Deserialize, Default)]
struct JobDict {
    #[serde(default)]
    name: Option<CompactString>,
}

#[derive(Deserialize, Default)]
struct Shell {
    #[serde(default)]
    options: Option<ShellOptions>,
}

#[derive(Deserialize, Default)]
struct ShellOptions {
    #[serde(rename = "per-resource", default)]
    per_resource: Option<PerResource>,
}

#[derive(Deserialize)]
struct PerResource {
    #[serde(rename = "type")]
    kind: CompactString,
    #[serde(default)]
    count: Option<i64>,
}

#[derive(Deserialize)]
struct Task<'a> {
    #[serde(borrow, default)]
    command: Option<&'a RawValue>,
    #[serde(default)]
    count: Option<TaskCount>,
}

#[derive(Deserialize)]
struct TaskCount {
    #[serde(default)]
    total: Option<Value>,
}

/// One resource vertex: what `jj_read_vertex` reads.
#[derive(Deserialize)]
struct Vertex {
    #[serde(rename = "type")]
    kind: CompactString,
    count: i64,
    #[serde(default)]
    exclusive: Option<bool>,
    #[serde(default)]
    with: Option<Vec<Vertex>>,
}

/// The first value of a JSON array (a command's name), the rest read and
/// dropped at once, not collected. Each is read as a `Value` still: that
/// refuses what a skip would let by (a lone surrogate, a number beyond
/// f64, nesting past serde_json's limit), as reading the whole command as
/// a `Vec<Value>` did.
struct FirstOf(Option<Value>);

impl<'de> Deserialize<'de> for FirstOf {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct First;
        impl<'de> serde::de::Visitor<'de> for First {
            type Value = FirstOf;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<FirstOf, A::Error> {
                let first = seq.next_element::<Value>()?;
                while seq.next_element::<Value>()?.is_some() {}
                Ok(FirstOf(first))
            }
        }
        d.deserialize_seq(First)
    }
}

/// The counts of a resources tree (`struct jj_counts`).
#[derive(Debug, Default)]
struct Counts {
    nnodes: i64,
    nslots: i64,
    slot_size: i64,
    exclusive: bool,
}

impl Counts {
    fn read(vertices: &[Vertex], factor: i64, out: &mut Counts) -> Result<(), String> {
        for v in vertices {
            if v.count <= 0 {
                return Err(format!("invalid count {} for type '{}'", v.count, v.kind));
            }
            let factor = factor.saturating_mul(v.count);
            match v.kind.as_str() {
                "node" => {
                    out.nnodes = factor;
                    out.exclusive |= v.exclusive == Some(true);
                }
                "slot" => out.nslots = v.count,
                "core" => out.slot_size = v.count,
                _ => {}
            }
            if let Some(with) = &v.with {
                Counts::read(with, factor, out)?;
            }
        }
        Ok(())
    }
}

fn count(n: i64) -> Option<u32> {
    u32::try_from(n).ok()
}

/// A path's base name, or the path when it ends in `/` (as job-list).
fn base_name(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some((_, "")) => path,
        Some((_, base)) => base,
        None => path,
    }
}

impl JobSpec {
    /// One of its texts, if known.
    pub fn text(&self, text: Text) -> Option<&str> {
        self.texts.get(text as usize)
    }

    /// Set one of its texts.
    pub fn set_text(&mut self, text: Text, value: Option<&str>) {
        self.texts.set(text as usize, value);
    }

    /// Every text, each by its name (one walk where six calls take six).
    pub fn texts(&self) -> Named<'_> {
        Named::of(&self.texts)
    }

    /// The job's name.
    pub fn name(&self) -> Option<&str> {
        self.text(Text::Name)
    }

    /// The queue: read for every change of a job's state.
    pub fn queue(&self) -> Option<&str> {
        self.text(Text::Queue)
    }

    /// Who submitted it, by name.
    pub fn username(&self) -> Option<&str> {
        self.text(Text::Username)
    }

    /// The requested time limit in seconds (0: none), if it was read.
    pub fn duration(&self) -> Option<f64> {
        self.duration.get()
    }

    /// When the job's `free` gave R back, if it has.
    pub fn freed_at(&self) -> Option<f64> {
        self.freed_at.get()
    }

    /// The job's `free` gave R back at `t`.
    pub fn free(&mut self, t: f64) {
        self.freed_at.set(t);
    }

    /// Read a jobspec's text. The values that could be read are kept; the
    /// first reason some could not comes with them.
    pub fn parse(text: &str) -> (JobSpec, Option<JobSpecError>) {
        let mut spec = JobSpec::default();
        let error = spec.read(text).err();
        (spec, error)
    }

    fn read(&mut self, text: &str) -> Result<(), JobSpecError> {
        // serde would read a struct from an array too.
        if !text.trim_start().starts_with('{') {
            return Err(JobSpecError::NotObject(text.chars().take(40).collect()));
        }
        // Nearly every jobspec reads whole; the stages below give the same
        // values when it does, and are walked only when it does not.
        if let Ok(whole) = serde_json::from_str::<Whole>(text) {
            return self.take(
                whole.version,
                whole.resources.map(Ok),
                whole.tasks.unwrap_or_default(),
                whole.attributes.unwrap_or_default(),
            );
        }
        self.read_in_stages(text)
    }

    /// Each part read on its own, so that a bad one costs only what it
    /// gives: a bad `resources` tree loses the counts, not the name.
    fn read_in_stages(&mut self, text: &str) -> Result<(), JobSpecError> {
        let top: Top =
            serde_json::from_str(text).map_err(|e| JobSpecError::NotObject(e.to_string()))?;
        let attributes: Attributes = match top.attributes {
            Some(raw) => serde_json::from_str(raw.get())
                .map_err(|e| JobSpecError::Attributes(e.to_string()))?,
            None => Attributes::default(),
        };
        let tasks: Vec<Task> = top
            .tasks
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .unwrap_or_default();
        let resources = top.resources.map(|raw| {
            serde_json::from_str::<Vec<Vertex>>(raw.get()).map_err(|e| format!("resources: {e}"))
        });
        self.take(top.version, resources, tasks, attributes)
    }

    /// The values of a jobspec's parts, read one way or the other.
    fn take(
        &mut self,
        version: Option<&RawValue>,
        resources: Option<Result<Vec<Vertex>, String>>,
        tasks: Vec<Task>,
        attributes: Attributes,
    ) -> Result<(), JobSpecError> {
        let system = attributes.system.unwrap_or_default();
        let name = match system.job.and_then(|j| j.name) {
            Some(name) => name,
            None => {
                let arg0 = tasks
                    .first()
                    .and_then(|t| t.command)
                    .and_then(|c| serde_json::from_str::<FirstOf>(c.get()).ok())
                    .and_then(|c| c.0);
                match arg0 {
                    Some(Value::String(s)) => base_name(&s).into(),
                    _ => return Err(JobSpecError::NoName),
                }
            }
        };
        let was = Named::of(&self.texts);
        self.texts = Named {
            name: Some(&name),
            queue: system.queue.as_deref(),
            project: system.project.as_deref(),
            bank: system.bank.as_deref(),
            ..was
        }
        .pack();
        self.duration = system.duration.into();
        let per_resource = system
            .shell
            .and_then(|s| s.options)
            .and_then(|o| o.per_resource);
        let total = tasks
            .first()
            .and_then(|t| t.count.as_ref())
            .and_then(|c| c.total.as_ref())
            .and_then(Value::as_i64);
        self.count(version, resources, per_resource, total)
            .map_err(JobSpecError::Counts)
    }

    /// The task, core and node counts, as `parse_jobspec` sets them.
    fn count(
        &mut self,
        version: Option<&RawValue>,
        resources: Option<Result<Vec<Vertex>, String>>,
        per_resource: Option<PerResource>,
        total: Option<i64>,
    ) -> Result<(), String> {
        if version.and_then(|v| v.get().parse::<i64>().ok()).is_none() {
            return Err("no integer version".into());
        }
        if !self.duration.is_some() {
            return Err("no attributes.system.duration".into());
        }
        let vertices = resources.ok_or("no resources")??;
        let mut jj = Counts::default();
        Counts::read(&vertices, 1, &mut jj)?;
        if jj.nslots <= 0 {
            return Err("unable to determine slot count".into());
        }
        if jj.slot_size <= 0 {
            return Err("unable to determine slot size".into());
        }
        if jj.nnodes > 0 {
            jj.nslots = jj.nslots.saturating_mul(jj.nnodes);
        }
        self.spec_nnodes = (jj.nnodes > 0).then(|| count(jj.nnodes)).flatten();
        self.spec_ntasks = None;
        self.tasks_per_node = 0;
        self.tasks_per_core = 0;
        let per = match per_resource {
            Some(p) => {
                let n = p.count.unwrap_or(1);
                if n < 1 {
                    return Err(format!("invalid per-resource count {n}"));
                }
                Some((p.kind, n))
            }
            None => None,
        };
        match per {
            Some((kind, n)) if kind == "node" => {
                if jj.nnodes > 0 {
                    self.spec_ntasks = count(jj.nnodes.saturating_mul(n));
                } else {
                    self.tasks_per_node = u32::try_from(n).unwrap_or(u32::MAX);
                }
            }
            Some((kind, n)) if kind == "core" => {
                if jj.nnodes == 0 {
                    self.spec_ntasks =
                        count(jj.nslots.saturating_mul(jj.slot_size).saturating_mul(n));
                } else {
                    self.tasks_per_core = u32::try_from(n).unwrap_or(u32::MAX);
                }
            }
            _ => self.spec_ntasks = count(total.unwrap_or(jj.nslots)),
        }
        self.spec_ncores = if jj.nnodes > 0 && jj.exclusive {
            None
        } else {
            count(jj.nslots.saturating_mul(jj.slot_size))
        };
        Ok(())
    }

    /// What R allocated: its number of nodes, cores and GPUs, and its
    /// hosts.
    pub fn apply_r(&mut self, nnodes: u32, ncores: u32, ngpus: u32, nodelist: Option<&str>) {
        self.r_nnodes = Some(nnodes);
        self.r_ncores = Some(ncores);
        self.r_ngpus_1 = ngpus.saturating_add(1);
        if nodelist.is_some() {
            self.set_text(Text::Nodelist, nodelist);
        }
    }

    /// Keep what `old` had that this copy of the jobspec does not know:
    /// what R allocated, and what updates set (a jobspec read after them).
    pub fn keep_later_of(&mut self, old: &JobSpec) {
        self.r_nnodes = old.r_nnodes;
        self.r_ncores = old.r_ncores;
        self.r_ngpus_1 = old.r_ngpus_1;
        self.freed_at = old.freed_at;
        let kept = |bit: u8| old.updated & bit != 0;
        let new = Named::of(&self.texts);
        let was = Named::of(&old.texts);
        // An updated text stays as the update set it.
        fn either<'x>(kept: bool, was: Option<&'x str>, new: Option<&'x str>) -> Option<&'x str> {
            if kept { was } else { new }
        }
        let texts = Named {
            name: either(kept(Updated::NAME), was.name, new.name),
            queue: either(kept(Updated::QUEUE), was.queue, new.queue),
            project: either(kept(Updated::PROJECT), was.project, new.project),
            bank: either(kept(Updated::BANK), was.bank, new.bank),
            nodelist: was.nodelist,
            username: new.username.or(was.username),
        }
        .pack();
        self.texts = texts;
        if kept(Updated::DURATION) {
            self.duration = old.duration;
        }
        self.updated = old.updated;
    }

    /// Apply a `jobspec-update` event's keys (RFC 21: period-delimited
    /// paths into the jobspec). Only the paths of the values kept here
    /// change anything; an update of `resources` or `tasks` would need the
    /// jobspec itself, which is not kept. Returns the keys not applied.
    pub fn update<'a>(
        &mut self,
        keys: impl IntoIterator<Item = (&'a str, &'a RawValue)>,
    ) -> Vec<&'a str> {
        let mut ignored = Vec::new();
        for (key, raw) in keys {
            let text = || serde_json::from_str::<CompactString>(raw.get()).ok();
            let bit = match key {
                "attributes.system.duration" => match serde_json::from_str::<f64>(raw.get()) {
                    Ok(d) => {
                        self.duration.set(d);
                        Updated::DURATION
                    }
                    Err(_) => 0,
                },
                "attributes.system.queue" => {
                    self.set_text(Text::Queue, text().as_deref());
                    Updated::QUEUE
                }
                "attributes.system.project" => {
                    self.set_text(Text::Project, text().as_deref());
                    Updated::PROJECT
                }
                "attributes.system.bank" => {
                    self.set_text(Text::Bank, text().as_deref());
                    Updated::BANK
                }
                "attributes.system.job.name" => match text() {
                    Some(name) => {
                        self.set_text(Text::Name, Some(&name));
                        Updated::NAME
                    }
                    None => 0,
                },
                _ => 0,
            };
            if bit == 0 {
                ignored.push(key);
            }
            self.updated |= bit;
        }
        ignored
    }

    /// `ntasks` as `flux jobs` shows it.
    pub fn ntasks(&self) -> Option<u32> {
        self.spec_ntasks
            .or_else(|| {
                (self.tasks_per_node > 0)
                    .then(|| self.r_nnodes.map(|n| n.saturating_mul(self.tasks_per_node)))
                    .flatten()
            })
            .or_else(|| {
                (self.tasks_per_core > 0)
                    .then(|| self.r_ncores.map(|n| n.saturating_mul(self.tasks_per_core)))
                    .flatten()
            })
    }

    /// `ncores`: R's once it has one, else what the jobspec asked.
    pub fn ncores(&self) -> Option<u32> {
        self.r_ncores.or(self.spec_ncores)
    }

    /// `ngpus`: R's GPUs, once it has R (flux-core 0.88's job-list has no
    /// such field for a job; this is fluxpipe's).
    pub fn ngpus(&self) -> Option<u32> {
        self.r_ngpus_1.checked_sub(1)
    }

    /// `nnodes`: R's once it has one, else the jobspec's node count.
    pub fn nnodes(&self) -> Option<u32> {
        self.r_nnodes.or(self.spec_nnodes)
    }
}

/// What of a jobspec is read here, and nothing else: `version`,
/// `resources`, the first task's `command[0]`, `slot` and `count`, and
/// `attributes.system`'s `job`, `queue`, `duration`, `project`, `bank` and
/// `shell.options.per-resource`. What a jobspec passed on (the `events`
/// stream) carries: never the working directory, the environment or the
/// command's arguments.
pub fn kept_part(jobspec: &Value) -> Value {
    let Some(top) = jobspec.as_object() else {
        return jobspec.clone();
    };
    let mut out = serde_json::Map::new();
    for key in ["version", "resources"] {
        if let Some(v) = top.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(task) = top
        .get("tasks")
        .and_then(Value::as_array)
        .and_then(|t| t.first())
        .and_then(Value::as_object)
    {
        let mut kept = serde_json::Map::new();
        for key in ["slot", "count"] {
            if let Some(v) = task.get(key) {
                kept.insert(key.into(), v.clone());
            }
        }
        if let Some(arg0) = task
            .get("command")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        {
            kept.insert("command".into(), Value::Array(vec![arg0.clone()]));
        }
        out.insert("tasks".into(), Value::Array(vec![Value::Object(kept)]));
    }
    if let Some(system_value) = top.get("attributes").and_then(|a| a.get("system"))
        && let Some(system) = system_value.as_object()
    {
        let mut kept = serde_json::Map::new();
        for key in ["job", "queue", "duration", "project", "bank"] {
            if let Some(v) = system.get(key) {
                kept.insert(key.into(), v.clone());
            }
        }
        if let Some(per) = system_value.pointer("/shell/options/per-resource") {
            kept.insert(
                "shell".into(),
                serde_json::json!({"options": {"per-resource": per}}),
            );
        }
        out.insert(
            "attributes".into(),
            serde_json::json!({ "system": Value::Object(kept) }),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(text: &str) -> JobSpec {
        let (s, err) = JobSpec::parse(text);
        assert_eq!(err, None, "{text}");
        s
    }

    /// The struct as it was before its texts were packed, field for
    /// field: checkpoints hold this layout.
    #[derive(Serialize)]
    struct Before {
        name: Option<String>,
        queue: Option<String>,
        project: Option<String>,
        bank: Option<String>,
        duration: Option<f64>,
        spec_ntasks: Option<u32>,
        spec_ncores: Option<u32>,
        spec_nnodes: Option<u32>,
        tasks_per_node: u32,
        tasks_per_core: u32,
        r_nnodes: Option<u32>,
        r_ncores: Option<u32>,
        nodelist: Option<String>,
        freed_at: Option<f64>,
        updated: u8,
        r_ngpus_1: u32,
        username: Option<String>,
    }

    impl Before {
        fn of(s: &JobSpec) -> Before {
            let text = |t: Text| s.text(t).map(String::from);
            Before {
                name: text(Text::Name),
                queue: text(Text::Queue),
                project: text(Text::Project),
                bank: text(Text::Bank),
                duration: s.duration(),
                spec_ntasks: s.spec_ntasks,
                spec_ncores: s.spec_ncores,
                spec_nnodes: s.spec_nnodes,
                tasks_per_node: s.tasks_per_node,
                tasks_per_core: s.tasks_per_core,
                r_nnodes: s.r_nnodes,
                r_ncores: s.r_ncores,
                nodelist: text(Text::Nodelist),
                freed_at: s.freed_at(),
                updated: s.updated,
                r_ngpus_1: s.r_ngpus_1,
                username: text(Text::Username),
            }
        }
    }

    /// A spec writes the bytes the struct it was wrote, and reads them
    /// back: packing its texts changed no checkpoint.
    #[test]
    fn a_spec_saves_as_the_struct_it_was() {
        let (mut full, _) = JobSpec::parse(&HOSTNAME.replace(
            r#""cwd":"/w""#,
            r#""queue":"débug","project":"p","bank":"b","job":{"name":"n"}"#,
        ));
        full.apply_r(2, 4, 1, Some("node[0-1]"));
        full.set_text(Text::Username, Some("alice"));
        full.free(1.5);
        let raw = RawValue::from_string("\"q2\"".into()).unwrap();
        full.update([("attributes.system.queue", &*raw)]);
        for spec in [full, JobSpec::default()] {
            let bytes = rmp_serde::to_vec(&spec).unwrap();
            assert_eq!(bytes, rmp_serde::to_vec(&Before::of(&spec)).unwrap());
            let back: JobSpec = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(back, spec);
        }
    }

    const HOSTNAME: &str = r#"{"resources":[{"type":"slot","count":1,"with":[{"type":"core","count":1}],"label":"task"}],"tasks":[{"command":["hostname"],"slot":"task","count":{"per_slot":1}}],"attributes":{"system":{"duration":0,"cwd":"/w"}},"version":1}"#;

    #[test]
    fn one_task_on_one_core() {
        let s = spec(HOSTNAME);
        assert_eq!(s.name(), Some("hostname"));
        assert_eq!(
            (s.ntasks(), s.ncores(), s.nnodes()),
            (Some(1), Some(1), None)
        );
        assert_eq!(s.duration(), Some(0.0));
        assert_eq!(s.queue(), None);
    }

    #[test]
    fn the_name_is_the_base_of_the_first_argument_if_a_string() {
        for (command, name) in [
            (r#"["/usr/bin/lmp","-in",{"x":[1]}]"#, Some("lmp")),
            // What a `Value` refuses anywhere in the command: no name.
            (r#"["/bin/app","\udc80"]"#, None),
            (r#"["/bin/app",1e400]"#, None),
            (r#"["dir/"]"#, Some("dir/")),
            (r#"[3,"a"]"#, None),
            (r#"[]"#, None),
            (r#""a""#, None),
            (r#"{"a":1}"#, None),
        ] {
            let text = HOSTNAME.replace(r#"["hostname"]"#, command);
            let (s, err) = JobSpec::parse(&text);
            assert_eq!(s.name(), name, "{command}");
            assert_eq!(err.is_some(), name.is_none(), "{command}");
        }
    }

    #[test]
    fn nodes_multiply_the_slots_and_r_wins() {
        // flux run -N2 -n4 --exclusive -q batch --job-name=x /bin/app
        let text = r#"{"version":1,"resources":[{"type":"node","count":2,"exclusive":true,"with":[{"type":"slot","count":2,"label":"task","with":[{"type":"core","count":3}]}]}],"tasks":[{"command":["/bin/app"],"slot":"task","count":{"per_slot":1}}],"attributes":{"system":{"duration":60.0,"queue":"batch","job":{"name":"x"},"bank":"b1"}}}"#;
        let mut s = spec(text);
        assert_eq!(s.name(), Some("x"));
        assert_eq!((s.queue(), s.text(Text::Bank)), (Some("batch"), Some("b1")));
        assert_eq!(
            (s.ntasks(), s.ncores(), s.nnodes()),
            (Some(4), None, Some(2))
        );
        s.apply_r(2, 16, 0, Some("n[0-1]"));
        assert_eq!(
            (s.ntasks(), s.ncores(), s.nnodes()),
            (Some(4), Some(16), Some(2))
        );
        assert_eq!(s.text(Text::Nodelist), Some("n[0-1]"));
    }

    #[test]
    fn per_resource_counts_wait_for_r() {
        let per = |kind: &str, nodes: bool| {
            let res = if nodes {
                r#"[{"type":"node","count":1,"with":[{"type":"slot","count":1,"with":[{"type":"core","count":2}]}]}]"#
            } else {
                r#"[{"type":"slot","count":3,"with":[{"type":"core","count":2}]}]"#
            };
            format!(
                r#"{{"version":1,"resources":{res},"tasks":[{{"command":["a/b"],"slot":"task","count":{{"per_slot":1}}}}],"attributes":{{"system":{{"duration":0,"shell":{{"options":{{"per-resource":{{"type":"{kind}","count":2}}}}}}}}}}}}"#
            )
        };
        assert_eq!(spec(&per("node", true)).ntasks(), Some(2));
        assert_eq!(spec(&per("core", false)).ntasks(), Some(12));
        let mut s = spec(&per("core", true));
        assert_eq!(s.ntasks(), None);
        s.apply_r(1, 4, 0, None);
        assert_eq!(s.ntasks(), Some(8));
        let mut s = spec(&per("node", false));
        assert_eq!(s.ntasks(), None);
        s.apply_r(3, 6, 0, None);
        assert_eq!(s.ntasks(), Some(6));
        assert_eq!(s.name(), Some("b"));
    }

    #[test]
    fn a_total_task_count_wins_over_slots() {
        let text = HOSTNAME.replace(r#"{"per_slot":1}"#, r#"{"total":7}"#);
        assert_eq!(spec(&text).ntasks(), Some(7));
    }

    #[test]
    fn the_name_is_the_commands_base_name() {
        assert_eq!(base_name("/usr/bin/sleep"), "sleep");
        assert_eq!(base_name("sleep"), "sleep");
        assert_eq!(base_name("dir/"), "dir/");
    }

    #[test]
    fn what_cannot_be_read_is_unknown_in_stages() {
        let (s, err) = JobSpec::parse("[1]");
        assert!(matches!(err, Some(JobSpecError::NotObject(_))));
        assert_eq!(s, JobSpec::default());
        // bad counts keep the name
        let text = HOSTNAME.replace(r#""count":1,"with""#, r#""count":0,"with""#);
        let (s, err) = JobSpec::parse(&text);
        assert!(matches!(err, Some(JobSpecError::Counts(_))), "{err:?}");
        assert_eq!(s.name(), Some("hostname"));
        assert_eq!((s.ntasks(), s.ncores()), (None, None));
        // a queue of the wrong type loses the attributes
        let text = HOSTNAME.replace(r#""cwd":"/w""#, r#""queue":5"#);
        let (s, err) = JobSpec::parse(&text);
        assert!(matches!(err, Some(JobSpecError::Attributes(_))));
        assert_eq!(s.name(), None);
    }

    #[test]
    fn an_update_changes_what_is_kept() {
        let mut s = spec(HOSTNAME);
        let raw = |t: &str| RawValue::from_string(t.to_string()).unwrap();
        let (d, q, r) = (raw("3600.0"), raw(r#""debug""#), raw("[]"));
        let ignored = s.update([
            ("attributes.system.duration", &*d),
            ("attributes.system.queue", &*q),
            ("resources", &*r),
        ]);
        assert_eq!(ignored, ["resources"]);
        assert_eq!((s.duration(), s.queue()), (Some(3600.0), Some("debug")));
        // the jobspec as submitted, read after the update, keeps it
        let mut again = spec(HOSTNAME);
        again.keep_later_of(&s);
        assert_eq!(
            (again.duration(), again.queue()),
            (Some(3600.0), Some("debug"))
        );
        assert_eq!(again.name(), Some("hostname"));
    }

    #[test]
    fn the_part_passed_on_reads_the_same_and_holds_no_secrets() {
        let full = r#"{"resources":[{"type":"node","count":2,"with":[{"type":"slot","count":3,"label":"task","with":[{"type":"core","count":2}]}]}],"tasks":[{"command":["/bin/app","--token=x"],"slot":"task","count":{"per_slot":1}}],"attributes":{"system":{"duration":60,"cwd":"/home/u","environment":{"SECRET":"x"},"queue":"q","job":{"name":"n"},"shell":{"options":{"rlimit":{},"per-resource":{"type":"core"}}}}},"version":1}"#;
        let value: Value = serde_json::from_str(full).unwrap();
        let part = kept_part(&value);
        let text = part.to_string();
        assert!(!text.contains("/home/u") && !text.contains("SECRET") && !text.contains("token"));
        assert_eq!(JobSpec::parse(&text), JobSpec::parse(full));
        assert_eq!(kept_part(&Value::from(3)), Value::from(3));
    }

    /// A jobspec of parts each good, absent, null or of a wrong type.
    fn jobspec_of_parts() -> impl Strategy<Value = String> {
        let part = |good: &'static [&'static str]| {
            let mut options: Vec<&'static str> = vec!["", "null", "\"x\"", "[]", "{}", "7"];
            options.extend_from_slice(good);
            proptest::sample::select(options)
        };
        (
            part(&["1", "1.5"]),
            part(&[
                r#"[{"type":"node","count":2,"with":[{"type":"slot","count":3,"with":[{"type":"core","count":2}]}]}]"#,
                r#"[{"type":"slot","count":1,"exclusive":true,"with":[{"type":"core","count":0}]}]"#,
                r#"[{"type":"slot","count":"1"}]"#,
            ]),
            part(&[
                r#"[{"command":["/bin/a","b"],"slot":"task","count":{"per_slot":1}}]"#,
                r#"[{"command":[3],"count":{"total":5}}]"#,
                r#"[{"command":"a","count":{"total":"5"}}]"#,
            ]),
            part(&[
                r#"{"system":{"duration":60,"queue":"q","job":{"name":"n"}}}"#,
                r#"{"system":{"duration":0,"bank":"b","shell":{"options":{"per-resource":{"type":"core","count":2}}}}}"#,
                r#"{"system":{"duration":"1"}}"#,
                r#"{"system":{"duration":1,"shell":{"options":{"per-resource":{"count":2}}}}}"#,
            ]),
        )
            .prop_map(|(version, resources, tasks, attributes)| {
                let parts: Vec<String> = [
                    ("version", version),
                    ("resources", resources),
                    ("tasks", tasks),
                    ("attributes", attributes),
                ]
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect();
                format!("{{{}}}", parts.join(","))
            })
    }

    proptest! {
        #[test]
        fn parsing_never_panics(text in "\\PC{0,200}") {
            let _ = JobSpec::parse(&text);
        }

        /// Reading a jobspec whole, when it reads, gives what reading it in
        /// stages gives; when it does not, the stages are what is read.
        #[test]
        fn whole_or_in_stages_read_the_same(text in jobspec_of_parts()) {
            let mut staged = JobSpec::default();
            let error = staged.read_in_stages(&text).err();
            prop_assert_eq!(JobSpec::parse(&text), (staged, error));
        }

        /// Any resources tree of small counts reads to counts whose product
        /// is the tree's, or to a reason.
        #[test]
        fn counts_are_products(nodes in 0i64..4, slots in 1i64..5, cores in 1i64..5) {
            let inner = format!(r#"{{"type":"slot","count":{slots},"with":[{{"type":"core","count":{cores}}}]}}"#);
            let res = if nodes > 0 {
                format!(r#"[{{"type":"node","count":{nodes},"with":[{inner}]}}]"#)
            } else {
                format!("[{inner}]")
            };
            let text = format!(r#"{{"version":1,"resources":{res},"tasks":[{{"command":["x"]}}],"attributes":{{"system":{{"duration":1}}}}}}"#);
            let s = spec(&text);
            let n = nodes.max(1);
            prop_assert_eq!(s.ncores(), count(n * slots * cores));
            prop_assert_eq!(s.ntasks(), count(n * slots));
            prop_assert_eq!(s.nnodes(), (nodes > 0).then_some(nodes as u32));
        }
    }
}
