//! The operator's pod template (`MCP_K8S_POD_TEMPLATE`): the
//! parts of every job pod that belong to the cluster's operator (where it
//! schedules, which registry credentials and RuntimeClass it uses, extra
//! labels and annotations, DNS), read from a YAML or JSON file once at start
//! and checked into a `PodTemplate` that `manifest::apply_pod_template`
//! merges into every Job.
//!
//! The file is an allow-list: a field that is not named here is an error,
//! and fields that would weaken the pod (host namespaces, volumes,
//! containers, security contexts, the ServiceAccount) are refused by name,
//! so the restricted Pod Security fields stay the manifest's alone. Deep
//! shapes the API server already validates (an `affinity` term) are checked
//! only for their type here; the API server names what is wrong inside.
//!
//! Knows nothing of callers: a run's arguments never reach this module.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::config::Config;

/// The largest template file read: a template is a few dozen lines, and a
/// bound keeps a wrong path (a log, a device) from being read whole.
const MAX_TEMPLATE_BYTES: u64 = 64 << 10;

/// A checked template: pod spec fields to add, and the pod's extra labels
/// and annotations. Sorted maps keep the manifest deterministic.
#[derive(Clone, Debug, PartialEq)]
pub struct PodTemplate {
    /// Fields of the pod spec, each one of `POD_SPEC_FIELDS`.
    pub pod_spec: BTreeMap<String, Value>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl PodTemplate {
    pub fn runtime_class_name(&self) -> Option<&str> {
        self.pod_spec.get("runtimeClassName").and_then(Value::as_str)
    }

    pub fn priority_class_name(&self) -> Option<&str> {
        self.pod_spec.get("priorityClassName").and_then(Value::as_str)
    }

    /// The names under `imagePullSecrets`, in the file's order.
    pub fn image_pull_secrets(&self) -> Vec<&str> {
        let Some(Value::Array(entries)) = self.pod_spec.get("imagePullSecrets") else { return Vec::new() };
        entries.iter().filter_map(|entry| entry["name"].as_str()).collect()
    }
}

/// Why the template was refused. Every variant names the file.
#[derive(Debug)]
pub enum Error {
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    TooLarge {
        path: PathBuf,
        size: u64,
    },
    Parse {
        path: PathBuf,
        message: String,
    },
    /// A field the server owns: the security model or its own bookkeeping.
    Forbidden {
        path: PathBuf,
        field: String,
        why: &'static str,
    },
    Unknown {
        path: PathBuf,
        field: String,
        allowed: String,
    },
    WrongType {
        path: PathBuf,
        field: String,
        expected: &'static str,
    },
    /// A label or annotation key this server uses to find its own objects.
    ReservedKey {
        path: PathBuf,
        field: String,
        key: String,
    },
    /// An annotation that sets a container's AppArmor or seccomp profile,
    /// which the server sets itself (restricted Pod Security).
    ProfileAnnotation {
        path: PathBuf,
        key: String,
    },
    /// A label or annotation key, or a label value, the API server refuses:
    /// every run would fail with a 422.
    BadMetadata {
        path: PathBuf,
        field: String,
        entry: String,
        why: &'static str,
    },
    /// The template and `MCP_K8S_RUNTIME_CLASS` name different classes.
    RuntimeClassConflict {
        path: PathBuf,
        template: String,
        setting: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read { path, source } => write!(f, "MCP_K8S_POD_TEMPLATE: cannot read `{}`: {source}", path.display()),
            Error::TooLarge { path, size } => write!(
                f,
                "MCP_K8S_POD_TEMPLATE: `{}` is {size} bytes; a pod template may have at most {MAX_TEMPLATE_BYTES}",
                path.display()
            ),
            Error::Parse { path, message } => {
                write!(f, "MCP_K8S_POD_TEMPLATE: `{}` is not a YAML or JSON mapping: {message}", path.display())
            }
            Error::Forbidden { path, field, why } => {
                write!(f, "MCP_K8S_POD_TEMPLATE: `{}`: field `{field}` is forbidden: {why}", path.display())
            }
            Error::Unknown { path, field, allowed } => {
                write!(f, "MCP_K8S_POD_TEMPLATE: `{}`: unknown field `{field}`; allowed: {allowed}", path.display())
            }
            Error::WrongType { path, field, expected } => {
                write!(f, "MCP_K8S_POD_TEMPLATE: `{}`: field `{field}` must be {expected}", path.display())
            }
            Error::ReservedKey { path, field, key } => write!(
                f,
                "MCP_K8S_POD_TEMPLATE: `{}`: {field} key `{key}` is reserved: the server and Kubernetes use it to find their own objects",
                path.display()
            ),
            Error::ProfileAnnotation { path, key } => write!(
                f,
                "MCP_K8S_POD_TEMPLATE: `{}`: annotations key `{key}` would set a container's AppArmor or seccomp profile, which the server sets itself for restricted Pod Security; remove it",
                path.display()
            ),
            Error::BadMetadata { path, field, entry, why } => write!(
                f,
                "MCP_K8S_POD_TEMPLATE: `{}`: {field} `{entry}` is not valid ({why}); the API server would refuse every run with it",
                path.display()
            ),
            Error::RuntimeClassConflict { path, template, setting } => write!(
                f,
                "MCP_K8S_POD_TEMPLATE: `{}`: runtimeClassName `{template}` differs from MCP_K8S_RUNTIME_CLASS `{setting}`; set one of them, or the same class in both",
                path.display()
            ),
        }
    }
}

impl std::error::Error for Error {}

/// The configured template, read and checked; `None` without
/// `MCP_K8S_POD_TEMPLATE`. Also cross-checks `MCP_K8S_RUNTIME_CLASS`: both
/// may be set only to the same class, so neither silently wins.
pub fn from_config(config: &Config) -> Result<Option<PodTemplate>, Error> {
    let Some(path) = &config.pod_template else { return Ok(None) };
    let template = load(path)?;
    if let (Some(template_class), Some(setting)) = (template.runtime_class_name(), &config.runtime_class)
        && template_class != setting
    {
        return Err(Error::RuntimeClassConflict { path: path.clone(), template: template_class.to_string(), setting: setting.clone() });
    }
    Ok(Some(template))
}

/// Reads and checks one template file.
pub fn load(path: &Path) -> Result<PodTemplate, Error> {
    let read_error = |source| Error::Read { path: path.to_path_buf(), source };
    let size = std::fs::metadata(path).map_err(read_error)?.len();
    if size > MAX_TEMPLATE_BYTES {
        return Err(Error::TooLarge { path: path.to_path_buf(), size });
    }
    // Not `fs::read`: a FIFO would hold the start (`settings_file`).
    let bytes = crate::settings_file::read_bytes(path, MAX_TEMPLATE_BYTES).map_err(read_error)?;
    parse(&bytes, path)
}

/// Checks a template's text; `path` is only named in errors.
pub fn parse(bytes: &[u8], path: &Path) -> Result<PodTemplate, Error> {
    let parse_error = |message: String| Error::Parse { path: path.to_path_buf(), message };
    let text = std::str::from_utf8(bytes).map_err(|_| parse_error("not UTF-8".into()))?;
    // JSON is read as JSON, as the kubeconfig reader does: it is YAML only
    // mostly (tabs).
    let value: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|error| parse_error(error.to_string()))?
    } else {
        crate::yaml::from_str(text).map_err(|error| parse_error(error.to_string()))?
    };
    let Value::Object(fields) = value else { return Err(parse_error("the top level must be a mapping of pod fields".into())) };
    Checker { path }.template(fields)
}

/// The pod spec fields an operator may set, with the shape each must have.
const POD_SPEC_FIELDS: &[(&str, Shape)] = &[
    ("nodeSelector", Shape::StringMap),
    ("tolerations", Shape::Tolerations),
    ("affinity", Shape::Affinity),
    ("topologySpreadConstraints", Shape::ListOfMaps),
    ("priorityClassName", Shape::Name),
    ("runtimeClassName", Shape::Name),
    ("imagePullSecrets", Shape::PullSecrets),
    ("dnsPolicy", Shape::DnsPolicy),
    ("dnsConfig", Shape::DnsConfig),
];

/// Pod fields refused by name, each with the reason; anything else not in
/// `POD_SPEC_FIELDS` is merely unknown.
const FORBIDDEN_FIELDS: &[(&str, &str)] = &[
    ("hostNetwork", "host namespaces break the sandbox (restricted Pod Security)"),
    ("hostPID", "host namespaces break the sandbox (restricted Pod Security)"),
    ("hostIPC", "host namespaces break the sandbox (restricted Pod Security)"),
    ("hostUsers", "host namespaces break the sandbox (restricted Pod Security)"),
    ("privileged", "privileged pods break the sandbox (restricted Pod Security)"),
    ("securityContext", "the server sets the restricted security context itself"),
    ("containers", "the server builds the containers from checked arguments"),
    ("initContainers", "the server builds the containers from checked arguments"),
    ("ephemeralContainers", "the server builds the containers from checked arguments"),
    ("volumes", "the server owns the pod's volumes (size-limited emptyDirs and its Secrets)"),
    ("serviceAccountName", "job pods run without a ServiceAccount token"),
    ("serviceAccount", "job pods run without a ServiceAccount token"),
    ("automountServiceAccountToken", "job pods run without a ServiceAccount token"),
    ("hostAliases", "name resolution is the operator's through dnsConfig, not per-pod host entries"),
    ("hostname", "the pod's identity is the server's"),
    ("subdomain", "the pod's identity is the server's"),
    ("setHostnameAsFQDN", "the pod's identity is the server's"),
    ("nodeName", "scheduling goes through the scheduler: use nodeSelector or affinity"),
    ("shareProcessNamespace", "the runner's process control assumes its own namespace"),
    ("restartPolicy", "the server owns the run's lifecycle"),
    ("activeDeadlineSeconds", "the server owns the run's deadline"),
    ("terminationGracePeriodSeconds", "the server owns the run's lifecycle"),
    ("enableServiceLinks", "the server keeps the environment free of service variables"),
    ("resources", "the server owns the pod's resources"),
    ("overhead", "the RuntimeClass sets the overhead"),
    ("os", "the runner's platform is the server's"),
    ("resourceClaims", "the server owns the pod's resources"),
    ("schedulingGates", "a gated pod would wait out the start timeout"),
    ("readinessGates", "the server owns the run's lifecycle"),
    ("preemptionPolicy", "set it on the PriorityClass"),
    ("priority", "set priorityClassName instead"),
    ("schedulerName", "the pod is scheduled by the cluster's scheduler"),
    ("metadata", "give extra `labels` and `annotations` at the top level"),
    ("spec", "the template's fields are the pod spec's, at the top level"),
];

/// Label and annotation keys the server or Kubernetes uses to find and
/// account for objects: a template setting one could hide a pod from the
/// reaper or make it look like another run's.
const RESERVED_KEYS: &[&str] = &["app.kubernetes.io/managed-by", "controller-uid", "job-name"];
const RESERVED_PREFIXES: &[&str] = &["mcp-k8s-ephemeral-job/", "batch.kubernetes.io/"];
const PROFILE_ANNOTATION_PREFIXES: &[&str] = &[
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
];

#[derive(Clone, Copy)]
enum Shape {
    StringMap,
    Tolerations,
    Affinity,
    ListOfMaps,
    Name,
    PullSecrets,
    DnsPolicy,
    DnsConfig,
}

struct Checker<'a> {
    path: &'a Path,
}

impl Checker<'_> {
    fn template(&self, fields: Map<String, Value>) -> Result<PodTemplate, Error> {
        let mut template = PodTemplate { pod_spec: BTreeMap::new(), labels: BTreeMap::new(), annotations: BTreeMap::new() };
        for (field, value) in fields {
            match field.as_str() {
                "labels" => template.labels = self.metadata_map("labels", &value)?,
                "annotations" => template.annotations = self.annotations(&value)?,
                _ => {
                    let shape = self.shape_of(&field)?;
                    self.check(&field, shape, &value)?;
                    template.pod_spec.insert(field, value);
                }
            }
        }
        Ok(template)
    }

    fn shape_of(&self, field: &str) -> Result<Shape, Error> {
        if let Some((_, why)) = FORBIDDEN_FIELDS.iter().find(|(name, _)| *name == field) {
            return Err(Error::Forbidden { path: self.path.to_path_buf(), field: field.to_string(), why });
        }
        match POD_SPEC_FIELDS.iter().find(|(name, _)| *name == field) {
            Some((_, shape)) => Ok(*shape),
            None => {
                let mut allowed: Vec<&str> = POD_SPEC_FIELDS.iter().map(|(name, _)| *name).collect();
                allowed.extend(["labels", "annotations"]);
                Err(Error::Unknown { path: self.path.to_path_buf(), field: field.to_string(), allowed: allowed.join(", ") })
            }
        }
    }

    fn check(&self, field: &str, shape: Shape, value: &Value) -> Result<(), Error> {
        match shape {
            Shape::StringMap => self.string_map(field, value).and_then(|map| self.label_entries(field, &map, true)),
            Shape::Tolerations => self.tolerations(field, value),
            Shape::Affinity => self.affinity(field, value),
            Shape::ListOfMaps => self.list_of_maps(field, value).map(|_| ()),
            Shape::Name => self.name(field, value),
            Shape::PullSecrets => self.pull_secrets(field, value),
            Shape::DnsPolicy => self.one_of(field, value, &["ClusterFirst", "Default", "None"]),
            Shape::DnsConfig => self.dns_config(field, value),
        }
    }

    fn wrong_type(&self, field: &str, expected: &'static str) -> Error {
        Error::WrongType { path: self.path.to_path_buf(), field: field.to_string(), expected }
    }

    fn unknown(&self, field: String, allowed: &[&str]) -> Error {
        Error::Unknown { path: self.path.to_path_buf(), field, allowed: allowed.join(", ") }
    }

    fn string_map(&self, field: &str, value: &Value) -> Result<BTreeMap<String, String>, Error> {
        let Value::Object(entries) = value else { return Err(self.wrong_type(field, "a mapping of strings to strings")) };
        let mut map = BTreeMap::new();
        for (key, entry) in entries {
            let Value::String(text) = entry else { return Err(self.wrong_type(&format!("{field}.{key}"), "a string")) };
            map.insert(key.clone(), text.clone());
        }
        Ok(map)
    }

    fn metadata_map(&self, field: &str, value: &Value) -> Result<BTreeMap<String, String>, Error> {
        let map = self.string_map(field, value)?;
        if let Some(key) = map.keys().find(|key| is_reserved_key(key)) {
            return Err(Error::ReservedKey { path: self.path.to_path_buf(), field: field.to_string(), key: key.clone() });
        }
        let values_are_labels = field != "annotations";
        self.label_entries(field, &map, values_are_labels)?;
        Ok(map)
    }

    /// Keys are qualified names; with `values_are_labels` (labels, a node
    /// selector), values are label values too.
    fn label_entries(&self, field: &str, map: &BTreeMap<String, String>, values_are_labels: bool) -> Result<(), Error> {
        let bad = |entry: &str, why| Error::BadMetadata {
            path: self.path.to_path_buf(),
            field: field.to_string(),
            entry: entry.to_string(),
            why,
        };
        for (key, value) in map {
            if let Some(why) = qualified_name_problem(key) {
                return Err(bad(&format!("key {key}"), why));
            }
            if values_are_labels && let Some(why) = label_value_problem(value) {
                return Err(bad(&format!("value {value} of {key}"), why));
            }
        }
        Ok(())
    }

    /// Annotations, without the legacy keys that set security profiles: a
    /// namespace without Pod Security admission would let them weaken the
    /// pod, one with it would refuse every run.
    fn annotations(&self, value: &Value) -> Result<BTreeMap<String, String>, Error> {
        let map = self.metadata_map("annotations", value)?;
        if let Some(key) = map.keys().find(|key| PROFILE_ANNOTATION_PREFIXES.iter().any(|prefix| key.starts_with(prefix))) {
            return Err(Error::ProfileAnnotation { path: self.path.to_path_buf(), key: key.clone() });
        }
        Ok(map)
    }

    fn list_of_maps<'v>(&self, field: &str, value: &'v Value) -> Result<Vec<&'v Map<String, Value>>, Error> {
        let Value::Array(items) = value else { return Err(self.wrong_type(field, "a list of mappings")) };
        items
            .iter()
            .enumerate()
            .map(|(index, item)| item.as_object().ok_or_else(|| self.wrong_type(&format!("{field}[{index}]"), "a mapping")))
            .collect()
    }

    /// Every key of `entry` is in `allowed`, and every value is a string
    /// unless it is in `numbers`.
    fn flat_entry(&self, field: &str, entry: &Map<String, Value>, allowed: &[&str], numbers: &[&str]) -> Result<(), Error> {
        for (key, value) in entry {
            let name = format!("{field}.{key}");
            if !allowed.contains(&key.as_str()) {
                return Err(self.unknown(name, allowed));
            }
            let fits = if numbers.contains(&key.as_str()) { value.is_i64() } else { value.is_string() };
            if !fits {
                return Err(self.wrong_type(&name, if numbers.contains(&key.as_str()) { "a whole number" } else { "a string" }));
            }
        }
        Ok(())
    }

    fn tolerations(&self, field: &str, value: &Value) -> Result<(), Error> {
        const KEYS: &[&str] = &["key", "operator", "value", "effect", "tolerationSeconds"];
        for (index, entry) in self.list_of_maps(field, value)?.into_iter().enumerate() {
            let name = format!("{field}[{index}]");
            self.flat_entry(&name, entry, KEYS, &["tolerationSeconds"])?;
            if let Some(operator) = entry.get("operator") {
                self.one_of(&format!("{name}.operator"), operator, &["Exists", "Equal"])?;
            }
            if let Some(effect) = entry.get("effect") {
                self.one_of(&format!("{name}.effect"), effect, &["NoSchedule", "PreferNoSchedule", "NoExecute"])?;
            }
        }
        Ok(())
    }

    /// Only the three kinds are checked: their terms are long and the API
    /// server validates them with better messages than a copy here would.
    fn affinity(&self, field: &str, value: &Value) -> Result<(), Error> {
        const KINDS: &[&str] = &["nodeAffinity", "podAffinity", "podAntiAffinity"];
        let Value::Object(kinds) = value else { return Err(self.wrong_type(field, "a mapping")) };
        for (kind, terms) in kinds {
            let name = format!("{field}.{kind}");
            if !KINDS.contains(&kind.as_str()) {
                return Err(self.unknown(name, KINDS));
            }
            if !terms.is_object() {
                return Err(self.wrong_type(&name, "a mapping"));
            }
        }
        Ok(())
    }

    /// A DNS-1123 subdomain, as RuntimeClass and PriorityClass names are.
    fn name(&self, field: &str, value: &Value) -> Result<(), Error> {
        match value.as_str() {
            // Kubernetes reserves `system-` for its own classes, which let a
            // pod preempt the cluster's own components.
            Some(text) if field == "priorityClassName" && text.starts_with("system-") => Err(Error::Forbidden {
                path: self.path.to_path_buf(),
                field: field.to_string(),
                why: "the system- priority classes are for the cluster's own components, which a sandbox must never preempt",
            }),
            Some(text) if is_object_name(text) => Ok(()),
            _ => Err(self.wrong_type(field, "a Kubernetes object name (lowercase letters, digits, '-' and '.')")),
        }
    }

    fn pull_secrets(&self, field: &str, value: &Value) -> Result<(), Error> {
        for (index, entry) in self.list_of_maps(field, value)?.into_iter().enumerate() {
            let name = format!("{field}[{index}]");
            self.flat_entry(&name, entry, &["name"], &[])?;
            self.name(&format!("{name}.name"), entry.get("name").unwrap_or(&Value::Null))?;
        }
        Ok(())
    }

    fn one_of(&self, field: &str, value: &Value, accepted: &[&str]) -> Result<(), Error> {
        match value.as_str() {
            Some(text) if accepted.contains(&text) => Ok(()),
            _ => Err(Error::Unknown { path: self.path.to_path_buf(), field: format!("{field}: {value}"), allowed: accepted.join(", ") }),
        }
    }

    fn dns_config(&self, field: &str, value: &Value) -> Result<(), Error> {
        const KEYS: &[&str] = &["nameservers", "searches", "options"];
        let Value::Object(entries) = value else { return Err(self.wrong_type(field, "a mapping")) };
        for (key, entry) in entries {
            let name = format!("{field}.{key}");
            match key.as_str() {
                "nameservers" | "searches" => {
                    let strings = entry.as_array().is_some_and(|items| items.iter().all(Value::is_string));
                    if !strings {
                        return Err(self.wrong_type(&name, "a list of strings"));
                    }
                }
                "options" => {
                    for (index, option) in self.list_of_maps(&name, entry)?.into_iter().enumerate() {
                        self.flat_entry(&format!("{name}[{index}]"), option, &["name", "value"], &[])?;
                    }
                }
                _ => return Err(self.unknown(name, KEYS)),
            }
        }
        Ok(())
    }
}

/// Why `text` is not a label value (at most 63 characters, empty or
/// alphanumerics with `-`, `_` and `.` inside), or `None` when it is.
fn label_value_problem(text: &str) -> Option<&'static str> {
    if text.len() > 63 {
        return Some("at most 63 characters");
    }
    (!text.is_empty() && !is_label_segment(text)).then_some("letters, digits, '-', '_' and '.', starting and ending with a letter or digit")
}

/// Why `key` is not a qualified name (`[prefix/]name`: a DNS subdomain of
/// at most 253 characters, then a name of at most 63 as in a label value),
/// or `None` when it is.
fn qualified_name_problem(key: &str) -> Option<&'static str> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(is_dns_label))
    {
        return Some("a prefix must be a DNS subdomain: lowercase letters, digits, '-' and '.'");
    }
    if name.is_empty() || name.len() > 63 || !is_label_segment(name) {
        return Some("a name of 1 to 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit");
    }
    None
}

fn is_label_segment(text: &str) -> bool {
    let bytes = text.as_bytes();
    let inner = |byte: &u8| byte.is_ascii_alphanumeric() || b"-_.".contains(byte);
    bytes.first().is_some_and(u8::is_ascii_alphanumeric) && bytes.last().is_some_and(u8::is_ascii_alphanumeric) && bytes.iter().all(inner)
}

fn is_dns_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    let inner = |byte: &u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || *byte == b'-';
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(inner)
        && bytes.first().is_some_and(|byte| byte.is_ascii_alphanumeric())
        && bytes.last().is_some_and(|byte| byte.is_ascii_alphanumeric())
}

fn is_reserved_key(key: &str) -> bool {
    // `mcp-k8s-ephemeral-job/...` and `app.kubernetes.io/managed-by` select
    // this server's objects; the rest are Kubernetes' own (the Job
    // controller's `controller-uid`, `job-name`, `batch.kubernetes.io/...`).
    // Other `*.kubernetes.io/` keys stay allowed: `app.kubernetes.io/name`
    // and its siblings are labels operators are told to set.
    RESERVED_KEYS.contains(&key) || RESERVED_PREFIXES.iter().any(|prefix| key.starts_with(prefix))
}

fn is_object_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-' || byte == b'.')
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<PodTemplate, String> {
        parse(text.as_bytes(), Path::new("/etc/pod-template.yaml")).map_err(|error| error.to_string())
    }

    fn error_of(text: &str) -> String {
        match parsed(text) {
            Ok(template) => panic!("accepted: {template:?}"),
            Err(message) => message,
        }
    }

    const FULL: &str = "\
nodeSelector:
  pool: sandboxes
tolerations:
  - key: sandbox
    operator: Equal
    value: \"true\"
    effect: NoSchedule
  - key: node.kubernetes.io/not-ready
    operator: Exists
    effect: NoExecute
    tolerationSeconds: 30
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
priorityClassName: sandbox-low
runtimeClassName: gvisor
imagePullSecrets:
  - name: registry-creds
labels:
  team: platform
annotations:
  example.com/cost-center: \"42\"
dnsPolicy: None
dnsConfig:
  nameservers: [10.0.0.10]
  searches: [corp.example]
  options:
    - name: ndots
      value: \"2\"
";

    #[test]
    fn a_full_template_is_accepted() {
        let template = parsed(FULL).unwrap();
        assert_eq!(template.runtime_class_name(), Some("gvisor"));
        assert_eq!(template.priority_class_name(), Some("sandbox-low"));
        assert_eq!(template.image_pull_secrets(), ["registry-creds"]);
        assert_eq!(template.labels["team"], "platform");
        assert_eq!(template.annotations["example.com/cost-center"], "42");
        assert_eq!(template.pod_spec["tolerations"][1]["tolerationSeconds"], 30);
        assert_eq!(template.pod_spec.len(), 9);
    }

    #[test]
    fn label_keys_and_values_follow_the_api_servers_rules() {
        let long = "a".repeat(64);
        let values = [
            ("", true),
            ("a", true),
            ("a-b_c.d", true),
            ("A9", true),
            ("-a", false),
            ("a-", false),
            ("a b", false),
            (long.as_str(), false),
        ];
        for (value, valid) in values {
            assert_eq!(label_value_problem(value).is_none(), valid, "value {value:?}");
        }
        let keys = [
            ("team", true),
            ("example.com/team", true),
            ("a.b-c/d_e", true),
            ("", false),
            ("/team", false),
            ("Example.com/team", false),
            ("example.com/", false),
            ("a/b/c", false),
            (long.as_str(), false),
        ];
        for (key, valid) in keys {
            assert_eq!(qualified_name_problem(key).is_none(), valid, "key {key:?}");
        }
    }

    #[test]
    fn json_is_accepted_too() {
        let template = parsed(r#"{"nodeSelector": {"pool": "a"}, "imagePullSecrets": [{"name": "creds"}]}"#).unwrap();
        assert_eq!(template.image_pull_secrets(), ["creds"]);
    }

    #[test]
    fn bad_templates_name_the_file_and_the_field() {
        let cases = [
            ("hostNetwork: true", "`/etc/pod-template.yaml`: field `hostNetwork` is forbidden: host namespaces"),
            ("hostPID: true", "field `hostPID` is forbidden"),
            ("volumes: []", "field `volumes` is forbidden"),
            ("containers: []", "field `containers` is forbidden"),
            ("initContainers: []", "field `initContainers` is forbidden"),
            ("securityContext: {}", "field `securityContext` is forbidden"),
            ("serviceAccountName: admin", "field `serviceAccountName` is forbidden"),
            ("automountServiceAccountToken: true", "field `automountServiceAccountToken` is forbidden"),
            ("hostAliases: []", "field `hostAliases` is forbidden"),
            ("privileged: true", "field `privileged` is forbidden"),
            ("nodeSelecter: {}", "unknown field `nodeSelecter`; allowed: nodeSelector, tolerations"),
            ("nodeSelector: [a]", "field `nodeSelector` must be a mapping of strings to strings"),
            ("nodeSelector: {pool: 1}", "field `nodeSelector.pool` must be a string"),
            ("tolerations: {key: a}", "field `tolerations` must be a list of mappings"),
            ("tolerations: [{key: a, operator: Maybe}]", "unknown field `tolerations[0].operator: \"Maybe\"`; allowed: Exists, Equal"),
            ("tolerations: [{key: a, effect: Never}]", "unknown field `tolerations[0].effect: \"Never\"`"),
            ("tolerations: [{key: a, tolerationSeconds: soon}]", "field `tolerations[0].tolerationSeconds` must be a whole number"),
            ("tolerations: [{key: a, privileged: true}]", "unknown field `tolerations[0].privileged`"),
            ("affinity: {nodeAffinity: []}", "field `affinity.nodeAffinity` must be a mapping"),
            ("affinity: {hostAffinity: {}}", "unknown field `affinity.hostAffinity`"),
            ("priorityClassName: High", "field `priorityClassName` must be a Kubernetes object name"),
            ("priorityClassName: system-node-critical", "field `priorityClassName` is forbidden: the system- priority classes"),
            ("priorityClassName: system-cluster-critical", "field `priorityClassName` is forbidden: the system- priority classes"),
            ("labels: {team: \"two words\"}", "labels `value two words of team` is not valid (letters, digits"),
            ("labels: {team: -x}", "labels `value -x of team` is not valid"),
            ("labels: {\"bad key\": x}", "labels `key bad key` is not valid (a name of 1 to 63"),
            ("labels: {Example.com/team: x}", "labels `key Example.com/team` is not valid (a prefix must be a DNS subdomain"),
            ("annotations: {\"/x\": z}", "annotations `key /x` is not valid"),
            ("nodeSelector: {pool: \"a b\"}", "nodeSelector `value a b of pool` is not valid"),
            ("runtimeClassName: 3", "field `runtimeClassName` must be a Kubernetes object name"),
            ("imagePullSecrets: [creds]", "field `imagePullSecrets[0]` must be a mapping"),
            ("imagePullSecrets: [{}]", "field `imagePullSecrets[0].name` must be a Kubernetes object name"),
            ("imagePullSecrets: [{name: c, namespace: x}]", "unknown field `imagePullSecrets[0].namespace`"),
            ("dnsPolicy: ClusterFirstWithHostNet", "unknown field `dnsPolicy: \"ClusterFirstWithHostNet\"`"),
            ("dnsConfig: {nameservers: 10.0.0.1}", "field `dnsConfig.nameservers` must be a list of strings"),
            ("dnsConfig: {options: [{name: a, weight: 1}]}", "unknown field `dnsConfig.options[0].weight`"),
            ("labels: {app.kubernetes.io/managed-by: me}", "labels key `app.kubernetes.io/managed-by` is reserved"),
            ("labels: {mcp-k8s-ephemeral-job/run-id: x}", "labels key `mcp-k8s-ephemeral-job/run-id` is reserved"),
            ("labels: {job-name: x}", "labels key `job-name` is reserved"),
            ("labels: {controller-uid: x}", "labels key `controller-uid` is reserved"),
            ("annotations: {batch.kubernetes.io/job-tracking: x}", "annotations key `batch.kubernetes.io/job-tracking` is reserved"),
            ("annotations: {mcp-k8s-ephemeral-job/expires-at: x}", "annotations key `mcp-k8s-ephemeral-job/expires-at` is reserved"),
            (
                "annotations: {container.apparmor.security.beta.kubernetes.io/main: unconfined}",
                "annotations key `container.apparmor.security.beta.kubernetes.io/main` would set a container's AppArmor or seccomp profile",
            ),
            ("annotations: {seccomp.security.alpha.kubernetes.io/pod: unconfined}", "`seccomp.security.alpha.kubernetes.io/pod` would set"),
            (
                "annotations: {container.seccomp.security.alpha.kubernetes.io/main: x}",
                "`container.seccomp.security.alpha.kubernetes.io/main` would set",
            ),
            ("labels: {team: 7}", "field `labels.team` must be a string"),
            ("- nodeSelector", "is not a YAML or JSON mapping: the top level must be a mapping"),
            ("{\"nodeSelector\": ", "`/etc/pod-template.yaml` is not a YAML or JSON mapping"),
        ];
        for (text, expected) in cases {
            let message = error_of(text);
            assert!(message.starts_with("MCP_K8S_POD_TEMPLATE: "), "{text}: {message}");
            assert!(message.contains(expected), "{text}\n got: {message}\nwant: {expected}");
        }
    }

    #[test]
    fn an_empty_file_is_an_empty_template_or_an_error() {
        // An empty YAML document is `null`, not a mapping: said, not guessed.
        assert!(parsed("").is_err());
        assert_eq!(parsed("{}").unwrap().pod_spec.len(), 0);
    }

    #[test]
    fn the_runtime_class_setting_and_the_template_must_agree() {
        let dir = std::env::temp_dir().join(format!("mcp-pod-template-rc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("template.yaml");
        std::fs::write(&path, "runtimeClassName: gvisor\n").unwrap();
        let config_with = |runtime_class: Option<&str>| {
            let raw = crate::config::RawConfig {
                pod_template: Some(path.display().to_string()),
                runtime_class: runtime_class.map(str::to_string),
                ..crate::config::RawConfig::default()
            };
            Config::from_raw(&raw).unwrap()
        };
        assert!(from_config(&config_with(None)).unwrap().is_some());
        assert!(from_config(&config_with(Some("gvisor"))).unwrap().is_some());
        let message = from_config(&config_with(Some("kata"))).unwrap_err().to_string();
        assert!(message.contains("runtimeClassName `gvisor` differs from MCP_K8S_RUNTIME_CLASS `kata`"), "{message}");
        let unset = Config::from_raw(&crate::config::RawConfig::default()).unwrap();
        assert!(from_config(&unset).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_too_large_is_refused_before_it_is_read() {
        let dir = std::env::temp_dir().join(format!("mcp-pod-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.yaml");
        std::fs::write(&path, vec![b' '; MAX_TEMPLATE_BYTES as usize + 1]).unwrap();
        let message = load(&path).unwrap_err().to_string();
        assert!(message.contains("a pod template may have at most 65536"), "{message}");
        let missing = load(&dir.join("missing.yaml")).unwrap_err().to_string();
        assert!(missing.starts_with("MCP_K8S_POD_TEMPLATE: cannot read `"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
