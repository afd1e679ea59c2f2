//! `kube::Error`: everything that can go wrong between "which cluster?" and a
//! decoded answer, with messages a user can act on.
//!
//! API refusals keep the whole `Status` object (code, reason, message,
//! `details.causes`) so the engine can tell quota, AlreadyExists, NotFound,
//! Forbidden and Invalid apart without parsing text. Configuration errors use
//! kubectl's wording where kubectl has one, so a user can search for them.
//! Nothing here holds a token, a key or kubeconfig contents.

use std::fmt;

/// One error type for the whole client; `Display` is the user-facing text.
#[derive(Debug)]
pub enum Error {
    /// The API server answered with a non-success status (`Status` body).
    Api { verb: &'static str, path: String, status: Box<Status> },
    /// The API server answered 401 to the credentials this client sent
    /// (after one refresh where one was possible). `hint` names those
    /// credentials and what to check; it never holds a secret.
    Unauthorized { verb: &'static str, path: String, status: Box<Status>, hint: String },
    /// The request did not get an HTTP answer (connect, TLS, timeout, reset).
    /// The message names the server and, for TLS, the CAs it was checked with.
    Transport { verb: &'static str, path: String, message: String },
    /// The answer was not the JSON we expected.
    Decode { verb: &'static str, path: String, message: String },
    /// The kubeconfig or in-cluster environment is unusable.
    Config(String),
    /// No cluster configuration at all: no kubeconfig file where one was
    /// looked for (the caller knows which settings would name one).
    NoConfiguration { searched: String },
    /// Credentials could not be produced before any request was sent (exec
    /// plugin, token file): not an answer of the API server.
    Credentials(String),
    /// A stream was closed on purpose through its `Abort` handle.
    Aborted { verb: &'static str, path: String },
}

/// What an RBAC 403 says: who may not do what, where.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PermissionDenied {
    pub user: String,
    /// `create`, `watch`, ...
    pub verb: String,
    /// The plural, with a subresource when there is one (`pods/log`).
    pub resource: String,
    /// `""` for the core group.
    pub group: String,
    /// `None` at the cluster scope.
    pub namespace: Option<String>,
}

impl PermissionDenied {
    /// Reads the authorizer's message (apiserver `forbiddenMessage`):
    /// `... is forbidden: User "u" cannot create resource "jobs" in API
    /// group "batch" in the namespace "ci"` (or `at the cluster scope`).
    /// `None` for any other text.
    fn from_message(message: &str) -> Option<PermissionDenied> {
        let (_, after_user) = message.split_once("is forbidden: User \"")?;
        let (user, after_cannot) = after_user.split_once("\" cannot ")?;
        let (verb, after_verb) = after_cannot.split_once(' ')?;
        let after_resource = after_verb.strip_prefix("resource \"")?;
        let (resource, rest) = after_resource.split_once('"')?;
        let group = quoted_after(rest, " in API group \"").unwrap_or_default();
        let namespace = quoted_after(rest, " in the namespace \"");
        Some(PermissionDenied {
            user: user.to_string(),
            verb: verb.to_string(),
            resource: resource.to_string(),
            group: group.to_string(),
            namespace: namespace.map(str::to_string),
        })
    }

    /// `jobs.batch`, `pods/log`: the resource as RBAC rules name it.
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() { self.resource.clone() } else { format!("{}.{}", self.resource, self.group) }
    }
}

/// The text between `prefix` and the next `"`.
fn quoted_after<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let (_, after) = text.split_once(prefix)?;
    after.split_once('"').map(|(quoted, _)| quoted)
}

/// The API's `Status` object (meta/v1), reduced to what callers decide on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    /// `Forbidden`, `NotFound`, `AlreadyExists`, `Invalid`, `Expired`, ...
    pub reason: String,
    pub message: String,
    pub details: StatusDetails,
}

/// `Status.details`: which object, and why (field-level causes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusDetails {
    pub name: String,
    pub group: String,
    pub kind: String,
    pub causes: Vec<StatusCause>,
    pub retry_after_seconds: Option<u64>,
}

/// One entry of `Status.details.causes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusCause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

impl Error {
    /// The API's `Status`, when the server answered with one.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Error::Api { status, .. } | Error::Unauthorized { status, .. } => Some(status),
            _ => None,
        }
    }

    /// Credentials could not be produced, so nothing was asked of the API.
    pub fn is_credentials(&self) -> bool {
        matches!(self, Error::Credentials(_))
    }

    /// No kubeconfig was found and the process is not in a pod.
    pub fn is_no_configuration(&self) -> bool {
        matches!(self, Error::NoConfiguration { .. })
    }

    /// An RBAC refusal (403 "User ... cannot VERB resource ..."), as opposed
    /// to a 403 from admission (Pod Security, quota, webhooks): the
    /// credentials lack a permission, and the fix is a Role.
    pub fn permission_denied(&self) -> Option<PermissionDenied> {
        let status = self.status().filter(|status| status.code == 403)?;
        PermissionDenied::from_message(&status.message)
    }

    pub fn code(&self) -> Option<u16> {
        self.status().map(|status| status.code)
    }

    pub fn is_not_found(&self) -> bool {
        self.has_reason_or_code("NotFound", 404)
    }

    pub fn is_already_exists(&self) -> bool {
        self.status().is_some_and(|status| status.reason == "AlreadyExists")
    }

    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }

    pub fn is_forbidden(&self) -> bool {
        self.has_reason_or_code("Forbidden", 403)
    }

    pub fn is_unauthorized(&self) -> bool {
        self.has_reason_or_code("Unauthorized", 401)
    }

    pub fn is_invalid(&self) -> bool {
        self.has_reason_or_code("Invalid", 422)
    }

    /// 410: the resourceVersion is too old (`Expired` or `Gone`).
    pub fn is_gone(&self) -> bool {
        self.code() == Some(410)
    }

    /// A ResourceQuota refused the object. The API says so only in the
    /// message ("exceeded quota: ..."), with reason Forbidden.
    pub fn is_quota_exceeded(&self) -> bool {
        self.status().is_some_and(|status| status.code == 403 && status.message.contains("exceeded quota"))
    }

    fn has_reason_or_code(&self, reason: &str, code: u16) -> bool {
        self.status().is_some_and(|status| status.reason == reason || status.code == code)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api { verb, path, status } => {
                write_status(formatter, verb, path, status)?;
                if let Some(denied) = PermissionDenied::from_message(&status.message).filter(|_| status.code == 403) {
                    let scope = denied
                        .namespace
                        .as_ref()
                        .map_or_else(|| "at the cluster scope".to_string(), |namespace| format!("in namespace `{namespace}`"));
                    write!(
                        formatter,
                        "; forbidden: `{}` may not `{}` `{}` {scope}; grant that verb in the Role bound to it (deploy/role.yaml has every verb the server needs)",
                        denied.user,
                        denied.verb,
                        denied.qualified_resource()
                    )?;
                }
                Ok(())
            }
            Error::Unauthorized { verb, path, status, hint } => {
                write_status(formatter, verb, path, status)?;
                write!(formatter, "; {hint}")
            }
            Error::Transport { verb, path, message } => write!(formatter, "{verb} {path}: {message}"),
            Error::Decode { verb, path, message } => {
                write!(formatter, "{verb} {path}: unexpected answer: {message}")
            }
            Error::Config(message) => write!(formatter, "invalid configuration: {message}"),
            // kubectl's words, so the text can be searched for.
            Error::NoConfiguration { searched } => {
                write!(formatter, "invalid configuration: no configuration has been provided; no kubeconfig found at {searched}")
            }
            Error::Credentials(message) => write!(formatter, "getting credentials: {message}"),
            Error::Aborted { verb, path } => write!(formatter, "{verb} {path}: aborted"),
        }
    }
}

impl std::error::Error for Error {}

/// `GET /path: 404 NotFound: message`.
fn write_status(formatter: &mut fmt::Formatter<'_>, verb: &str, path: &str, status: &Status) -> fmt::Result {
    let reason = if status.reason.is_empty() { canonical_reason(status.code) } else { status.reason.as_str() };
    write!(formatter, "{verb} {path}: {} {reason}", status.code)?;
    if !status.message.is_empty() {
        write!(formatter, ": {}", status.message)?;
    }
    Ok(())
}

impl Status {
    /// Decodes a `Status` body; `None` when the body is something else
    /// (an HTML error page from a proxy, say).
    pub fn from_json(value: &serde_json::Value) -> Option<Status> {
        if value.get("kind").and_then(|kind| kind.as_str()) != Some("Status") {
            return None;
        }
        let text = |object: &serde_json::Value, key: &str| -> String {
            object.get(key).and_then(|field| field.as_str()).unwrap_or_default().to_string()
        };
        let details = value.get("details").cloned().unwrap_or_default();
        let causes = details
            .get("causes")
            .and_then(|causes| causes.as_array())
            .map(|causes| {
                causes
                    .iter()
                    .map(|cause| StatusCause {
                        reason: text(cause, "reason"),
                        message: text(cause, "message"),
                        field: text(cause, "field"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Status {
            code: value.get("code").and_then(|code| code.as_u64()).unwrap_or_default() as u16,
            reason: text(value, "reason"),
            message: text(value, "message"),
            details: StatusDetails {
                name: text(&details, "name"),
                group: text(&details, "group"),
                kind: text(&details, "kind"),
                causes,
                retry_after_seconds: details.get("retryAfterSeconds").and_then(|seconds| seconds.as_u64()),
            },
        })
    }

    /// The `Status` for an error answer: the body's when it is one, else one
    /// made from the HTTP code and the start of the body (proxies and load
    /// balancers answer with plain text or HTML).
    pub fn from_response(code: u16, body: &[u8]) -> Status {
        let decoded = serde_json::from_slice::<serde_json::Value>(body).ok();
        if let Some(mut status) = decoded.as_ref().and_then(Status::from_json) {
            if status.code == 0 {
                status.code = code;
            }
            return status;
        }
        let text = String::from_utf8_lossy(body);
        let mut message: String = text.trim().chars().take(300).collect();
        if message.len() < text.trim().len() {
            message.push_str("...");
        }
        Status { code, reason: canonical_reason(code).to_string(), message, details: StatusDetails::default() }
    }
}

/// The reason the API uses for a bare HTTP code (apimachinery `StatusReason`).
fn canonical_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_reads_like_kubectl() {
        let body = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"jobs.batch is forbidden: User \"system:serviceaccount:ci:mcp\" cannot create resource \"jobs\" in API group \"batch\" in the namespace \"ci\"","reason":"Forbidden","details":{"group":"batch","kind":"jobs"},"code":403}"#;
        let error = Error::Api {
            verb: "POST",
            path: "/apis/batch/v1/namespaces/ci/jobs".into(),
            status: Box::new(Status::from_response(403, body)),
        };
        assert_eq!(
            error.to_string(),
            "POST /apis/batch/v1/namespaces/ci/jobs: 403 Forbidden: jobs.batch is forbidden: User \"system:serviceaccount:ci:mcp\" cannot create resource \"jobs\" in API group \"batch\" in the namespace \"ci\"; forbidden: `system:serviceaccount:ci:mcp` may not `create` `jobs.batch` in namespace `ci`; grant that verb in the Role bound to it (deploy/role.yaml has every verb the server needs)"
        );
        assert!(error.is_forbidden());
        assert!(!error.is_quota_exceeded());
        let denied = error.permission_denied().expect("an RBAC refusal");
        assert_eq!((denied.verb.as_str(), denied.resource.as_str(), denied.group.as_str()), ("create", "jobs", "batch"));
        assert_eq!(denied.namespace.as_deref(), Some("ci"));
    }

    #[test]
    fn permission_denied_is_read_from_rbac_messages_only() {
        // (message, (verb, resource, group, namespace) when it is an RBAC refusal)
        type Expected<'a> = Option<(&'a str, &'a str, &'a str, Option<&'a str>)>;
        let cases: &[(&str, Expected)] = &[
            (
                r#"pods "p" is forbidden: User "alice" cannot get resource "pods/log" in API group "" in the namespace "ci""#,
                Some(("get", "pods/log", "", Some("ci"))),
            ),
            (
                r#"namespaces is forbidden: User "alice" cannot list resource "namespaces" in API group "" at the cluster scope"#,
                Some(("list", "namespaces", "", None)),
            ),
            (
                r#"jobs.batch is forbidden: User "bob" cannot watch resource "jobs" in API group "batch" in the namespace "ci": RBAC: role.rbac.authorization.k8s.io "x" not found"#,
                Some(("watch", "jobs", "batch", Some("ci"))),
            ),
            (r#"pods "p" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true"#, None),
            (r#"jobs "x" is forbidden: exceeded quota: q, requested: count/jobs.batch=1"#, None),
            (r#"is forbidden: User "é"#, None),
            ("", None),
        ];
        for (message, expected) in cases {
            let denied = PermissionDenied::from_message(message);
            let got = denied
                .as_ref()
                .map(|denied| (denied.verb.as_str(), denied.resource.as_str(), denied.group.as_str(), denied.namespace.as_deref()));
            assert_eq!(got, *expected, "{message}");
        }
    }

    #[test]
    fn causes_and_quota_are_kept() {
        let body = br#"{"kind":"Status","status":"Failure","message":"jobs \"x\" is forbidden: exceeded quota: q, requested: count/jobs.batch=1","reason":"Forbidden","details":{"name":"x","kind":"jobs","causes":[{"reason":"FieldValueInvalid","message":"bad","field":"spec.x"}]},"code":403}"#;
        let status = Status::from_response(403, body);
        assert_eq!(status.details.causes.len(), 1);
        assert_eq!(status.details.causes[0].field, "spec.x");
        let error = Error::Api { verb: "POST", path: "/x".into(), status: Box::new(status) };
        assert!(error.is_quota_exceeded());
    }

    #[test]
    fn non_status_bodies_get_the_canonical_reason() {
        let status = Status::from_response(502, b"<html>bad gateway</html>");
        assert_eq!(status.reason, "Unknown");
        assert_eq!(status.message, "<html>bad gateway</html>");
        let status = Status::from_response(503, b"");
        assert_eq!(status.reason, "ServiceUnavailable");
    }
}
