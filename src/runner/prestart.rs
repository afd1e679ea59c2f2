//! A warm sandbox's pre-started process (`sandbox::args::Preload`): started
//! as soon as the runner waits for its assignment, so that whatever it
//! does ahead (an interpreter loading modules) is done before the call
//! comes. A fitting assignment's command becomes it: the rest of its argv
//! goes to it as one line on its stdin, then end-of-file, and from there
//! it is the command, captured, timed and stopped as a spawned one is. Any
//! other assignment runs as usual and the process is stopped first.
//!
//! Knows nothing of what the process is, nor of the assignment's source.

#![allow(unsafe_code)] // its tests look for a process with kill(pid, 0).

use std::io::Write;
use std::path::Path;
use std::process::Child;

use crate::runner::process;
use crate::sandbox::args::Preload;

/// The pre-started process, stopped (its whole group) when dropped unused.
pub struct Prestarted {
    child: Option<Child>,
}

impl Prestarted {
    /// Starts `preload.argv` in `workdir`; `None` when it cannot start (the
    /// assignment then runs as usual).
    pub fn start(preload: &Preload, workdir: &Path) -> Option<Prestarted> {
        let child = process::spawn_reading(&preload.argv, workdir, &preload.env).ok()?;
        Some(Prestarted { child: Some(child) })
    }

    /// The process, told to run `rest`: the command from here on. `None`
    /// when it ended meanwhile or could not be told (it is stopped then,
    /// and the assignment runs as usual).
    pub fn go(mut self, rest: &[String]) -> Option<Child> {
        let mut child = self.child.take()?;
        let alive = matches!(child.try_wait(), Ok(None));
        let told = alive
            && child.stdin.take().is_some_and(|mut stdin| {
                // Dropped after the line: end-of-file, as a command's
                // stdin (/dev/null) gives.
                stdin.write_all(Preload::line(rest).as_bytes()).is_ok()
            });
        if told {
            return Some(child);
        }
        stop(&mut child);
        None
    }
}

impl Drop for Prestarted {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            stop(child);
        }
    }
}

/// Its whole group, itself the leader (`process::spawn_reading`).
fn stop(child: &mut Child) {
    process::kill_group_leftovers(child);
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preload(script: &str) -> Preload {
        Preload {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            prefix: vec!["interp".into()],
            env: [("X".into(), "1".into())].into(),
        }
    }

    #[test]
    fn told_its_line_the_process_runs_it_with_the_env_it_started_with() {
        let dir = std::env::temp_dir();
        let started = Prestarted::start(&preload("read line; echo \"$X $line\"; cat; echo end"), &dir).expect("started");
        let child = started.go(&["main.py".to_string(), "a".to_string()]).expect("told");
        let out = child.wait_with_output().expect("ran");
        let line = crate::sandbox::to_hex(b"main.py\0a");
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("1 {line}\nend\n"));
    }

    #[test]
    fn one_that_ended_is_not_told_and_one_unused_is_stopped() {
        let dir = std::env::temp_dir();
        let mut ended = Prestarted::start(&preload("exit 0"), &dir).expect("started");
        ended.child.as_mut().map(Child::wait).expect("a child").expect("it ended");
        assert!(ended.go(&["main.py".to_string()]).is_none());
        let waiting = Prestarted::start(&preload("sleep 30"), &dir).expect("started");
        let pid = waiting.child.as_ref().map(Child::id).unwrap_or_default();
        drop(waiting);
        // SAFETY: kill(2) with signal 0 only asks whether the pid exists.
        assert_ne!(unsafe { libc::kill(pid as libc::pid_t, 0) }, 0, "the unused process was reaped");
    }
}
