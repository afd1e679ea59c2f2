//! The reaper's clock: asks the backend to delete every expired object
//! this server created, at start and then every `REAP_EVERY`, so a server
//! that crashed (or lost its connection) leaves nothing behind for long.
//! What "expired" means and how it is deleted is the backend's.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::engine::port::Backend;
use crate::outputs::Store;
use crate::supervise;

/// How often the reaper looks.
pub const REAP_EVERY: Duration = Duration::from_secs(60);

/// Reaps once now, then every `every`, on its own thread, for the life of
/// the process (an essential one: a panic fails `/readyz`).
/// The output store's expired runs go on the same clock.
/// Open sandboxes are looked at more often: one idle past its timeout, or
/// whose runner ended, is closed within this.
pub const SANDBOXES_EVERY: Duration = Duration::from_secs(5);

pub fn start(backend: Arc<dyn Backend>, outputs: Option<Arc<Store>>, every: Duration) -> std::io::Result<()> {
    supervise::spawn(supervise::Kind::Reaper, move || {
        let mut next_reap = std::time::Instant::now();
        loop {
            if std::time::Instant::now() >= next_reap {
                backend.reap(SystemTime::now());
                if let Some(outputs) = &outputs {
                    outputs.reap(SystemTime::now());
                }
                next_reap = std::time::Instant::now() + every;
            }
            crate::engine::sandboxes::reap(backend.as_ref());
            std::thread::sleep(SANDBOXES_EVERY.min(every));
        }
    })?;
    Ok(())
}
