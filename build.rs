//! Puts the commit into `fluxpipe --version` (`0.1.0 (1a2b3c4d5e6f)`), as
//! ripgrep does; `unknown commit` when built outside a git checkout.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs");
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown commit".to_string());
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=FLUXPIPE_VERSION={version} ({commit})");
    println!("cargo:rustc-env=FLUXPIPE_COMMIT={commit}");
}
