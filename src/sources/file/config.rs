//! `[sources.NAME] type = "file"`: its keys and their checks.

use crate::component::Problem;
use crate::sources::SourceSpec;
use crate::sources::config::source_config;
use std::path::{Path, PathBuf};

/// Where to start in a file with no checkpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadFrom {
    #[default]
    Beginning,
    End,
}

source_config! {
    /// `type = "file"`: eventlogs and journals on disk, tailed.
    FileSourceConfig {
        /// Glob patterns (`**` matches any depth).
        include: Vec<String>,
        #[serde(default)]
        exclude: Vec<String>,
        /// Where to start in a file with no checkpoint.
        #[serde(default)]
        read_from: ReadFrom,
        /// How often to look for new files and appended lines, in milliseconds.
        #[serde(default = "default_poll_ms")]
        poll_interval_ms: u64,
    }
}

fn default_poll_ms() -> u64 {
    250
}

impl SourceSpec for FileSourceConfig {
    fn reads(&self) -> String {
        format!("include {:?} exclude {:?}", self.include, self.exclude)
    }

    /// At least one pattern, each a glob whose fixed part can be read.
    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if self.include.is_empty() {
            out.push(Problem::new("include", ": at least one pattern is needed"));
        }
        for (key, patterns) in [("include", &self.include), ("exclude", &self.exclude)] {
            for (i, pattern) in patterns.iter().enumerate() {
                if let Some(e) = glob_problem(pattern) {
                    out.push(Problem::at(key, i, format!(" `{pattern}`: {e}")));
                }
            }
        }
        out
    }

    fn has_positions(&self) -> bool {
        true
    }
}

/// Why a glob pattern cannot work, if it cannot.
fn glob_problem(pattern: &str) -> Option<String> {
    if pattern.is_empty() {
        return Some("empty pattern".into());
    }
    if let Err(e) = globset::Glob::new(pattern) {
        return Some(e.to_string());
    }
    // The fixed part before the first wildcard must be readable.
    let base: PathBuf = Path::new(pattern)
        .components()
        .take_while(|c| {
            !c.as_os_str()
                .to_string_lossy()
                .contains(['*', '?', '[', '{'])
        })
        .collect();
    let mut dir = base.as_path();
    while !dir.as_os_str().is_empty() && !dir.exists() {
        dir = dir.parent().unwrap_or(Path::new(""));
    }
    if !dir.as_os_str().is_empty() && std::fs::read_dir(dir).is_err() && dir.is_dir() {
        return Some(format!("folder {} cannot be read", dir.display()));
    }
    None
}
