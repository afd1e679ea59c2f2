//! MCP_K8S_SITES: the sites file read and checked into `Site`s, each a
//! name and the configuration a run there sees (the server's settings with
//! the site's `SITE_FIELDS` on top), the default first. What a site's
//! backend does with its settings is the backend's business.

use super::{Config, Error, RawConfig, SETTINGS};
use crate::pools::{self, Pool};
use crate::settings_file::{self, FileKind};

/// A named site: where runs go (a Kubernetes context, a Docker engine),
/// as the whole configuration a run there sees.
#[derive(Clone, Debug)]
pub struct Site {
    pub name: String,
    pub config: Config,
}

/// The one site of a server without MCP_K8S_SITES.
pub const DEFAULT_SITE: &str = "default";

/// The names of `sites`, the default first; `default` alone without
/// MCP_K8S_SITES.
pub fn site_names(sites: &[Site]) -> Vec<&str> {
    match sites {
        [] => vec![DEFAULT_SITE],
        sites => sites.iter().map(|site| site.name.as_str()).collect(),
    }
}
/// The sites file, as its errors name it. Its errors about one site are
/// `Syntax` ones that name the site: a site's setting is checked as the
/// server's is, so no one field of it names what is wrong.
const FILE: FileKind = FileKind { variable: "MCP_K8S_SITES", entry: "site" };
/// The sites file is configuration: 64 KiB hold hundreds of sites.
const MAX_SITES_FILE_BYTES: u64 = 64 << 10;
/// A site's name goes into job tokens: short, a DNS label.
pub const MAX_SITE_NAME_CHARS: usize = 32;
/// What a site may set, as the fields of its entry and the settings they
/// stand for; everything else is the server's, shared by every site.
const SITE_FIELDS: &[(&str, &str)] = &[
    ("backend", "MCP_K8S_BACKEND"),
    ("kubeconfig", "MCP_K8S_KUBECONFIG"),
    ("context", "MCP_K8S_KUBE_CONTEXT"),
    ("namespace", "MCP_K8S_NAMESPACE"),
    ("runner_image", "MCP_K8S_RUNNER_IMAGE"),
    ("docker_host", "MCP_K8S_DOCKER_HOST"),
    ("runner_binary", "MCP_K8S_RUNNER_BINARY"),
    ("docker_network", "MCP_K8S_DOCKER_NETWORK"),
];

/// MCP_K8S_SITES: a JSON list of sites, each a name, `default` on at most
/// one (else the first is), and settings of its own (`SITE_FIELDS`) on top
/// of the server's. Each site's settings are checked as the server's are,
/// so an error names the site and the variable. Warm pools stay with the
/// default site.
pub(super) fn parse_sites(raw: &RawConfig, pools: &[Pool]) -> Result<Vec<Site>, Error> {
    let Some(path) = raw.sites.as_deref() else { return Ok(Vec::new()) };
    let problem = |message: String| Error::Sites(settings_file::Error::Syntax { kind: &FILE, path: path.to_string(), message });
    let text = settings_file::read_settings(&FILE, std::path::Path::new(path), MAX_SITES_FILE_BYTES).map_err(Error::Sites)?;
    let parsed = crate::json::parse_settings(&text).map_err(|error| problem(error.to_string()))?;
    let Some(items) = parsed.as_array().filter(|items| !items.is_empty()) else {
        return Err(problem(
            "must be a JSON list of sites, such as [{\"name\": \"eu\", \"backend\": \"kubernetes\", \"context\": \"eu\"}]".into(),
        ));
    };
    let mut sites: Vec<(bool, Site)> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let (default, mut site) = parse_site(raw, index, item).map_err(problem)?;
        site.config.warm_pools = pools.to_vec();
        if sites.iter().any(|(_, other)| other.name == site.name) {
            return Err(problem(format!("site `{}`: the name is used by an earlier site; give each its own", site.name)));
        }
        if default && sites.iter().any(|(other_default, _)| *other_default) {
            return Err(problem(format!("site `{}`: another site is already the default; mark one only", site.name)));
        }
        sites.push((default, site));
    }
    // The default first: the one a run without `site` goes to.
    let default_at = sites.iter().position(|(default, _)| *default).unwrap_or(0);
    let default = sites.remove(default_at);
    let mut ordered = vec![default.1];
    ordered.extend(sites.into_iter().map(|(_, site)| site));
    // Each site keeps the pools that name it; a pool naming none is the
    // default site's.
    let default_name = ordered[0].name.clone();
    for site in &mut ordered {
        site.config.warm_pools.retain(|pool| pool.site.as_deref().unwrap_or(&default_name) == site.name);
    }
    Ok(ordered)
}

/// Every pool names a site there is (`default` without MCP_K8S_SITES).
pub(super) fn check_pool_sites(pools: &[Pool], sites: &[Site], path: Option<&str>) -> Result<(), Error> {
    let names = site_names(sites);
    let Some(pool) = pools.iter().find(|pool| pool.site.as_deref().is_some_and(|site| !names.contains(&site))) else { return Ok(()) };
    Err(Error::WarmPools(settings_file::Error::Field {
        kind: &pools::FILE,
        path: path.unwrap_or_default().to_string(),
        entry: pool.name.clone(),
        field: "site".into(),
        message: format!(
            "`{}` is not a site here; sites: {}",
            crate::echo::shorten(pool.site.as_deref().unwrap_or_default()),
            names.join(", ")
        ),
    }))
}

fn parse_site(raw: &RawConfig, index: usize, item: &serde_json::Value) -> Result<(bool, Site), String> {
    let Some(fields) = item.as_object() else { return Err(format!("site #{index} must be an object of fields")) };
    let name = match fields.get("name").and_then(serde_json::Value::as_str) {
        Some(name) if is_site_name(name) => name.to_string(),
        Some(name) => {
            return Err(format!(
                "site #{index}: name `{}` must be 1 to {MAX_SITE_NAME_CHARS} lowercase letters, digits or '-', starting and ending with a letter or digit",
                crate::echo::shorten(name)
            ));
        }
        None => return Err(format!("site #{index}: `name` is required, a string")),
    };
    let default = match fields.get("default") {
        None => false,
        Some(serde_json::Value::Bool(default)) => *default,
        Some(_) => return Err(format!("site `{name}`: `default` must be true or false")),
    };
    let mut site_raw = raw.clone();
    // The files that are the server's, not a site's, are read once.
    site_raw.sites = None;
    site_raw.auth_tokens_file = None;
    site_raw.warm_pools = None;
    for (key, value) in fields.iter().filter(|(key, _)| !matches!(key.as_str(), "name" | "default")) {
        let Some((_, variable)) = SITE_FIELDS.iter().find(|(field, _)| field == key) else {
            let accepted: Vec<&str> = SITE_FIELDS.iter().map(|(field, _)| *field).collect();
            return Err(format!(
                "site `{name}`: unknown field `{}`; accepted: name, default, {}",
                crate::echo::shorten(key),
                accepted.join(", ")
            ));
        };
        let Some(text) = value.as_str() else { return Err(format!("site `{name}`: `{key}` must be a string")) };
        let Some(setting) = SETTINGS.iter().find(|setting| setting.env == *variable) else { continue };
        *setting.slot(&mut site_raw) = Some(text.to_string()).filter(|text| !text.is_empty());
    }
    let config = Config::from_raw(&site_raw).map_err(|error| format!("site `{name}`: {error}"))?;
    Ok((default, Site { name, config }))
}

fn is_site_name(name: &str) -> bool {
    let valid_chars = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let valid_ends = name.starts_with(|c: char| c.is_ascii_alphanumeric()) && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    !name.is_empty() && name.len() <= MAX_SITE_NAME_CHARS && valid_chars && valid_ends
}
