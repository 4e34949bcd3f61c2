//! Readiness for `/readyz`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Readiness for `/readyz`: the pipeline is running and not shutting down,
/// and no component has said it cannot do its work (a Kafka source that
/// reaches no broker).
#[derive(Debug, Default, Clone)]
pub struct Readiness {
    running: Arc<AtomicBool>,
    /// Component → why it is not ready.
    blocked: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.running.store(ready, Ordering::Relaxed);
    }

    /// `who` cannot do its work, for `why`, until [`Readiness::clear`].
    pub fn block(&self, who: &str, why: String) {
        if let Ok(mut b) = self.blocked.lock() {
            b.insert(who.to_string(), why);
        }
    }

    pub fn clear(&self, who: &str) {
        if let Ok(mut b) = self.blocked.lock() {
            b.remove(who);
        }
    }

    pub fn get(&self) -> bool {
        self.reasons().is_empty()
    }

    /// Why not ready, one line each; empty when ready.
    pub fn reasons(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.running.load(Ordering::Relaxed) {
            out.push("the pipeline is not running (starting or stopping)".to_string());
        }
        if let Ok(b) = self.blocked.lock() {
            out.extend(b.iter().map(|(who, why)| format!("{who}: {why}")));
        }
        out
    }
}
