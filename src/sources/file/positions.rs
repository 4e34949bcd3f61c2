//! The `file` source's positions, in the JSON form kept in a checkpoint.

use super::*;

/// The version of this form.
pub(super) const CHECKPOINT_VERSION: u32 = 1;

/// The positions, in the JSON form kept in a checkpoint.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CheckpointFile {
    pub(super) version: u32,
    /// Tailed files, by fingerprint.
    pub(super) files: Vec<FileEntry>,
    /// R documents, by path.
    pub(super) documents: Vec<DocEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileEntry {
    /// 16 hex digits.
    pub(super) fingerprint: String,
    /// Where the file was last seen (for people; files are matched by
    /// fingerprint).
    pub(super) path: PathBuf,
    /// Offset just past the last line handed on.
    pub(super) position: u64,
    /// Lines before `position`.
    pub(super) lines: u64,
    /// Unix time the file was last seen missing, if it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) gone_at: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DocEntry {
    pub(super) path: PathBuf,
    /// 16 hex digits: FNV-1a of the document last sent.
    pub(super) hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) gone_at: Option<u64>,
}

/// Positions as saved in a checkpoint; none saved: nothing read yet.
pub(super) fn parse_positions(text: Option<&str>) -> Result<CheckpointFile> {
    let Some(text) = text else {
        return Ok(CheckpointFile {
            version: CHECKPOINT_VERSION,
            ..Default::default()
        });
    };
    let corrupt = |why: String| {
        anyhow!("corrupt: {why}; start with --reset-state to read every file again from the start")
    };
    let file: CheckpointFile = serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    if file.version != CHECKPOINT_VERSION {
        return Err(corrupt(format!(
            "version {} (this fluxpipe writes version {CHECKPOINT_VERSION})",
            file.version
        )));
    }
    for f in &file.files {
        parse_hex(&f.fingerprint)
            .ok_or_else(|| corrupt(format!("bad fingerprint `{}`", f.fingerprint)))?;
    }
    for d in &file.documents {
        parse_hex(&d.hash).ok_or_else(|| corrupt(format!("bad hash `{}`", d.hash)))?;
    }
    Ok(file)
}

pub(super) fn parse_hex(s: &str) -> Option<u64> {
    (s.len() == 16)
        .then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
}
