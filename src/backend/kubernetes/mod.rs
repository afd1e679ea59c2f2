//! The Kubernetes backend: a run is a Job (with an inputs Secret it owns)
//! whose pod runs the caller's image with the runner as its entrypoint.
//! `manifest` builds the objects, `classify` reads pod status into neutral
//! views, `record` keeps a background run's record in the Job's
//! annotations, `reaper` deletes what expired, `permissions` lists the RBAC
//! the server needs. Speaks to the API server only through `kube`.

pub mod classify;
pub mod manifest;
pub mod permissions;
pub mod reaper;
pub mod record;
