//! The API permissions the server needs in its namespace, defined once:
//! `doctor` asks the API about each (SelfSubjectAccessReview), and a test
//! checks that `deploy/role.yaml` grants exactly these. Adding an API call
//! to the engine means adding its verb here, and the test then says which
//! Role line is missing.

/// Verbs on one resource (optionally a subresource) of one API group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    /// `""` for the core group.
    pub group: &'static str,
    pub resource: &'static str,
    /// `""`, or e.g. `log` for `pods/log`.
    pub subresource: &'static str,
    pub verbs: &'static [&'static str],
    /// What the server does with it, for doctor's messages.
    pub used_for: &'static str,
}

impl Permission {
    /// `jobs`, `pods/log`: how a Role's `resources` names it.
    pub fn role_resource(&self) -> String {
        if self.subresource.is_empty() { self.resource.to_string() } else { format!("{}/{}", self.resource, self.subresource) }
    }

    /// `jobs.batch`, `pods/log`: the names RBAC messages use.
    pub fn resource_name(&self) -> String {
        let resource = self.role_resource();
        if self.group.is_empty() { resource } else { format!("{resource}.{}", self.group) }
    }
}

/// Everything the server may call in its namespace, nothing more.
pub const REQUIRED: &[Permission] = &[
    Permission {
        group: "batch",
        resource: "jobs",
        subresource: "",
        verbs: &["create", "get", "list", "delete", "patch"],
        used_for: "one Job per run, deleted when it ends; background Jobs are read back, listed by label, marked when cancelled and reaped",
    },
    Permission {
        group: "",
        resource: "pods",
        subresource: "",
        verbs: &["list", "watch", "delete"],
        used_for: "following each run's pod (a watch lists first), and deleting it when a background job is cancelled",
    },
    Permission { group: "", resource: "pods", subresource: "log", verbs: &["get"], used_for: "reading the runner's output" },
    Permission {
        group: "",
        resource: "secrets",
        subresource: "",
        verbs: &["create", "get", "list", "delete"],
        used_for: "input files, reaping the Secrets of crashed runs, and checking the clone Secret exists",
    },
    Permission {
        group: "",
        resource: "events",
        subresource: "",
        verbs: &["list"],
        used_for: "telling why a pod was not created (FailedCreate events)",
    },
    Permission {
        group: "",
        resource: "persistentvolumeclaims",
        subresource: "",
        verbs: &["get"],
        used_for: "checking the cache volume exists",
    },
];

/// What warm pools (`MCP_K8S_WARM_POOLS`) need on top of `REQUIRED`, granted
/// by `deploy/warm-pools.optional.yaml`; `doctor` checks it only when pools
/// are declared, so a server without pools is not granted it.
pub const WARM_POOLS: &[Permission] = &[Permission {
    group: "",
    resource: "pods",
    subresource: "proxy",
    verbs: &["create"],
    used_for: "handing a run to its warm pool pod: the assignment is POSTed to the pod's runner through the API server",
}];

/// What open sandboxes (`MCP_K8S_MAX_SANDBOXES` above 0) need on top of
/// `REQUIRED`, granted by `deploy/sandboxes.yaml` (in the base); `doctor`
/// checks it only when sandboxes may be opened.
pub const SANDBOXES: &[Permission] = &[Permission {
    group: "",
    resource: "pods",
    subresource: "proxy",
    verbs: &["create"],
    used_for: "running a call in an open sandbox: the call is POSTed to the sandbox pod's runner through the API server, which streams its output back",
}];

/// What an output store (`MCP_K8S_OUTPUTS_DIR`) needs on top of `REQUIRED`,
/// granted by `deploy/outputs.optional.yaml`; `doctor` checks it only when
/// the store is set.
pub const OUTPUTS: &[Permission] = &[Permission {
    group: "",
    resource: "pods",
    subresource: "proxy",
    verbs: &["create"],
    used_for: "fetching a run's whole output, which its runner holds in the pod, through the API server",
}];
