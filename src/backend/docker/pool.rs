//! The Docker backend's warm pool sandboxes, plugged into the engine's one
//! pool manager (`engine::pools`, which keeps the threads, the
//! hand-out and the drain): a pool sandbox is a run's container, created
//! and started ahead, whose runner waits for one assignment on its stdin
//! (`spec::pool_container`); its health is the container's state; the run
//! is written into its stdin through the Docker API
//! (`docker::Client::container_attach`, which also brings its output back): no network, no host
//! directory, no key file, so a pool of network mode `none` is warm too
//! and a server in a container with only the Docker socket can keep pools.
//!
//! Knows nothing of MCP; the decisions (when to make, replace, hand out)
//! are `engine::pools::pool`'s.

use std::time::SystemTime;

use crate::backend::docker::{Docker, spec};
use crate::docker::Filters;
use crate::engine::pools::{self, Health, Listed, NewSandbox, PoolSandboxes};
use crate::engine::port::spec::{Policy, run_deadline};
use crate::engine::port::{self, ErrorKind};
use crate::metrics;
use crate::sandbox::assignment::{self, Assignment, KEY_BYTES, Key};

/// The key an assignment on stdin carries: the format has one, and the
/// runner reading stdin checks none (`runner await-assignment --stdin`).
/// Only a Docker API client can write to a container's stdin, and such a
/// client can `exec` in the container anyway, so a key would guard
/// nothing; it would cost a volume per sandbox (the root is read-only and
/// a tmpfs is not mounted before the start, so `put-archive` has nowhere
/// else to put it).
const STDIN_KEY: Key = Key::from_bytes([0; KEY_BYTES]);

/// The server's pools on one daemon.
pub type Pools = pools::Pools<Docker>;

/// A sandbox handed to a run, until its assignment is delivered: its
/// container is `name`.
pub type Reserved = pools::Reserved<()>;

impl PoolSandboxes for Docker {
    /// The container's name comes from the run id: nothing to keep.
    type Made = ();

    fn pool_policy(&self) -> &Policy {
        &self.policy
    }

    /// Its image and network checked as a cold run's are, its container
    /// created (its volume workdir owned by the run's user where the
    /// engine has no owned tmpfs) and started; removed again on a failure.
    fn create_sandbox(&self, sandbox: &NewSandbox) -> Result<(), port::Error> {
        let created = start_pool_container(self, sandbox);
        if created.is_err() {
            metrics::api_error("create_pool_container");
            self.delete_sandbox(sandbox.run_id);
        }
        created
    }

    /// The pool's containers by label: `running` is ready, `exited`,
    /// `dead` or `removing` ended.
    fn list_sandboxes(&self, pool: &str, owner: &str) -> Result<Vec<Listed>, port::Error> {
        let filters = Filters {
            labels: vec![
                format!("{}={}", spec::LABEL_MANAGED_BY, spec::MANAGED_BY),
                format!("{}={pool}", spec::LABEL_POOL),
                format!("{}={owner}", spec::LABEL_POOL_OWNER),
            ],
        };
        let containers = self.client.container_list(&filters).map_err(|error| super::api_error("list a pool's containers", &error))?;
        Ok(containers
            .into_iter()
            .filter_map(|container| {
                let run_id = container.labels.get(spec::LABEL_RUN_ID)?.clone();
                Some(Listed { name: spec::container_name(&run_id), run_id, health: health(&container.state) })
            })
            .collect())
    }

    fn sandbox_is_ready(&self, container: &str) -> bool {
        match self.client.container_inspect(container) {
            Ok(inspect) => inspect.state.running,
            Err(error) if error.is_not_found() => false,
            Err(_) => true,
        }
    }

    /// The assignment, on its stdin. dockerd takes an attach to a container
    /// that has ended (and the bytes go nowhere), so the container is
    /// looked at first: one that ended since the claim is an error here,
    /// not a run without a result later.
    fn deliver(&self, reserved: &Reserved, assignment: &Assignment) -> Result<(), port::Error> {
        const WHAT: &str = "hand the run to its warm container";
        let inspect = self.client.container_inspect(&reserved.name).map_err(|error| super::api_error(WHAT, &error))?;
        if !inspect.state.running {
            let message = format!("the container is `{}`, no longer waiting", inspect.state.status);
            return Err(port::Error { what: WHAT, kind: ErrorKind::NotFound, message });
        }
        let output = self.client.container_attach(&reserved.name, &assignment::encode(&STDIN_KEY, assignment));
        self.keep_attached(&reserved.name, output.map_err(|error| super::api_error(WHAT, &error))?);
        Ok(())
    }

    /// Removes the sandbox's container (with its volume); the expiry label
    /// and the reaper remove one this misses.
    fn delete_sandbox(&self, run_id: &str) {
        let name = spec::container_name(run_id);
        super::remove_container(&self.client, &name, "pool sandbox not removed; its expiry and the reaper remove it");
    }
}

/// A pool sandbox's container, created and started (a failure leaves what
/// was made to the caller).
fn start_pool_container(docker: &Docker, sandbox: &NewSandbox) -> Result<(), port::Error> {
    let template = sandbox.template;
    let name = spec::container_name(sandbox.run_id);
    docker.ensure_image(&template.image).map_err(|refused| refused_error("pull the pool's image", refused.message))?;
    docker
        .ensure_network(template.network, &template.image)
        .map_err(|refused| refused_error("make the pool's network", refused.message))?;
    let expires_at = SystemTime::now() + run_deadline(template, &docker.policy) + crate::engine::run::EXPIRY_SLACK;
    let labels = spec::PoolSandbox {
        run_id: sandbox.run_id,
        pool: sandbox.pool,
        owner: sandbox.owner,
        max_wait: sandbox.max_wait,
        expires_at,
        preload: sandbox.preload,
    };
    let body = spec::pool_container(template, &docker.policy, &docker.options, &labels);
    docker.client.container_create(&name, &body).map_err(|error| super::api_error("create a pool container", &error))?;
    if spec::workdir_is_volume(template, &docker.options) {
        let root = spec::inputs_archive(template, docker.policy.run_as_user)
            .map_err(|why| refused_error("make a pool container's workdir", why))?;
        docker
            .client
            .container_put_archive(&name, &template.workdir, &root)
            .map_err(|error| super::api_error("make a pool container's workdir", &error))?;
    }
    docker.client.container_start(&name).map_err(|error| super::api_error("start a pool container", &error))
}

fn refused_error(what: &'static str, message: String) -> port::Error {
    port::Error { what, kind: ErrorKind::Refused, message }
}

/// A listed container's state (`ContainerSummary::state`) as a pool
/// sandbox's health.
fn health(state: &str) -> Health {
    match state {
        "running" => Health::Ready,
        "exited" | "dead" | "removing" => Health::Ended,
        _ => Health::Starting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_containers_state_says_whether_it_is_ready_or_ended() {
        assert_eq!(health("running"), Health::Ready);
        for ended in ["exited", "dead", "removing"] {
            assert_eq!(health(ended), Health::Ended, "{ended}");
        }
        for starting in ["created", "restarting", "paused", ""] {
            assert_eq!(health(starting), Health::Starting, "{starting}");
        }
    }
}
