//! What `fluxpipe validate` checks beyond the config's text, without
//! starting anything: that the data folder can be written, that the
//! addresses to listen on are free, that the file sources' patterns match
//! files now.

use super::config::Config;
use crate::component::Resource;
use crate::sources::{SourceConfig, SourceSpec};
use std::path::Path;

/// What would stop the pipeline at start.
pub fn problems(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if let Err(why) = writable(&config.data_dir) {
        out.push(format!("data_dir {}: {why}", config.data_dir.display()));
    }
    let mut listens: Vec<(String, Resource)> = Vec::new();
    if let Some(api) = &config.api {
        listens.extend(
            api.claims()
                .into_iter()
                .map(|c| ("api".to_string(), c.resource)),
        );
    }
    for (name, source) in &config.sources {
        listens.extend(
            source
                .claims()
                .into_iter()
                .map(|c| (format!("sources.{name}.{}", c.key), c.resource)),
        );
    }
    for (key, resource) in listens {
        if let Err(e) = free(&resource) {
            out.push(format!("{key}: cannot listen on {resource}: {e}"));
        }
    }
    out
}

/// What would start but likely not as meant.
pub fn warnings(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for (name, source) in &config.sources {
        if let SourceConfig::File(file) = source {
            match crate::sources::file::files_matching(file) {
                Ok(0) => out.push(format!(
                    "sources.{name}: include ({}) matches no file now",
                    file.include.join(", ")
                )),
                Ok(_) => {}
                Err(e) => out.push(format!("sources.{name}: {e:#}")),
            }
        }
    }
    out
}

/// Whether files can be made in `dir`, or in the nearest folder above it
/// that exists (the pipeline makes the rest).
fn writable(dir: &Path) -> Result<(), String> {
    let mut at = dir;
    while !at.exists() {
        match at.parent() {
            Some(up) if !up.as_os_str().is_empty() => at = up,
            _ => return Ok(()),
        }
    }
    if !at.is_dir() {
        return Err(format!("{} is not a folder", at.display()));
    }
    let probe = at.join(format!(".fluxpipe-validate-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(format!("cannot write in {}: {e}", at.display())),
    }
}

/// Whether an address can be listened on now.
fn free(resource: &Resource) -> std::io::Result<()> {
    match resource {
        Resource::Tcp(addr) => std::net::TcpListener::bind(addr).map(drop),
        Resource::Udp(addr) => std::net::UdpSocket::bind(addr).map(drop),
        Resource::Unix(path) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another process listens there",
                ));
            }
            Ok(())
        }
        Resource::Stdin => Ok(()),
    }
}
