//! The image allowlist (`MCP_K8S_ALLOWED_IMAGES`): references are normalised
//! the way container runtimes do before comparing, so `python:3.12-slim`
//! and `docker.io/library/python:3.12-slim` are one image and `python:3.12`
//! is another. Entries may pin a digest, or end in `:*` (every tag of a
//! repository) or `/*` (every repository under a prefix).
//!
//! A reference with a digest is pulled by that digest alone, its tag
//! ignored; so only an entry pinning that digest, or a `/*` entry (which
//! trusts everything under its prefix), admits one. A tag entry and a
//! `:*` entry never do.

use std::fmt;

/// A normalised image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// `registry/path`, e.g. `docker.io/library/python`.
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl fmt::Display for ImageRef {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.repository)?;
        if let Some(tag) = &self.tag {
            write!(formatter, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(formatter, "@{digest}")?;
        }
        Ok(())
    }
}

/// One allowlist entry.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    Exact(ImageRef),
    AnyTag { repository: String },
    AnyUnder { prefix: String },
}

/// The parsed allowlist, with the operator's own spelling kept for messages.
#[derive(Clone, Debug)]
pub struct Allowlist {
    entries: Vec<Entry>,
    pub as_written: Vec<String>,
}

impl Allowlist {
    /// Parses the comma-separated list; an entry that is not a valid
    /// reference is an error: (the entry, why).
    pub fn parse(csv: &str) -> Result<Allowlist, (String, String)> {
        let mut entries = Vec::new();
        let mut as_written = Vec::new();
        for raw in csv.split(',').map(str::trim).filter(|raw| !raw.is_empty()) {
            let entry = if let Some(prefix) = raw.strip_suffix("/*") {
                normalise_repository(prefix).map(|prefix| Entry::AnyUnder { prefix })
            } else if let Some(repository) = raw.strip_suffix(":*") {
                normalise_repository(repository).map(|repository| Entry::AnyTag { repository })
            } else {
                normalise(raw).map(Entry::Exact)
            }
            .map_err(|why| (raw.to_string(), why))?;
            entries.push(entry);
            as_written.push(raw.to_string());
        }
        Ok(Allowlist { entries, as_written })
    }

    /// This list and `images` (exact references, already checked as
    /// such): the images an operator's languages file names join the
    /// operator's allowlist. Written as given, after the list's own.
    pub fn with_images(mut self, images: &[String]) -> Result<Allowlist, (String, String)> {
        for image in images {
            if self.check(image).is_ok() {
                continue;
            }
            self.entries.push(Entry::Exact(normalise(image).map_err(|why| (image.clone(), why))?));
            self.as_written.push(image.clone());
        }
        Ok(self)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Checks a caller's image; returns its normalised reference, which is
    /// what goes into the pod spec.
    pub fn check(&self, image: &str) -> Result<ImageRef, String> {
        // Shortened only when it is not a reference at all: a valid one
        // is at most 512 characters, and a digest is worth quoting whole.
        let wanted = normalise(image)?;
        if self.entries.iter().any(|entry| entry_allows(entry, &wanted)) {
            return Ok(wanted);
        }
        if self.entries.is_empty() {
            return Err(format!(
                "image `{image}` is not allowed: the server allows no images (MCP_K8S_ALLOWED_IMAGES is empty); ask the operator to set it"
            ));
        }
        Err(format!("image `{image}` is not allowed; allowed: {}", self.as_written.join(", ")))
    }
}

/// Normalises a reference as containerd and Docker do: default registry
/// `docker.io`, `library/` for official images, default tag `latest` when
/// neither tag nor digest is given.
pub fn normalise(reference: &str) -> Result<ImageRef, String> {
    let invalid = |why: &str| format!("image `{}` is not a valid image reference: {why}", crate::echo::shorten(reference));
    if reference.is_empty() || reference.len() > 512 {
        return Err(invalid("it must be 1 to 512 characters"));
    }
    if reference.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("it contains white space or control characters"));
    }
    let (name, digest) = match reference.split_once('@') {
        Some((name, digest)) => {
            let (algorithm, hex) = digest.split_once(':').ok_or_else(|| invalid("the digest must look like `sha256:<hex>`"))?;
            if algorithm != "sha256" || hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid("the digest must look like `sha256:<64 hex digits>`"));
            }
            (name, Some(format!("sha256:{}", hex.to_ascii_lowercase())))
        }
        None => (reference, None),
    };
    let last_slash = name.rfind('/').map_or(0, |index| index + 1);
    let (repository, tag) = match name[last_slash..].rfind(':') {
        Some(colon) => (&name[..last_slash + colon], Some(&name[last_slash + colon + 1..])),
        None => (name, None),
    };
    if let Some(tag) = tag {
        let valid_tag = !tag.is_empty()
            && tag.len() <= 128
            && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && !tag.starts_with(['.', '-']);
        if !valid_tag {
            return Err(invalid("the tag may hold letters, digits, `.`, `_` and `-`"));
        }
    }
    let repository = normalise_repository(repository).map_err(|_| invalid("the repository name is not valid"))?;
    let tag = match (tag, &digest) {
        (Some(tag), _) => Some(tag.to_string()),
        (None, Some(_)) => None,
        (None, None) => Some("latest".to_string()),
    };
    let image_ref = ImageRef { repository, tag, digest };
    // The full form is what the pod spec gets and what a later check reads,
    // so the bound holds for it too (found by fuzz/fuzz_targets/images.rs).
    if image_ref.to_string().len() > 512 {
        return Err(invalid("its full form, with registry and tag, is over 512 characters"));
    }
    Ok(image_ref)
}

fn normalise_repository(repository: &str) -> Result<String, String> {
    let error = || format!("`{repository}` is not a valid repository name");
    let (domain, path) = match repository.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first.to_string(), rest.to_string()),
        _ => ("docker.io".to_string(), repository.to_string()),
    };
    let domain = if domain == "index.docker.io" { "docker.io".to_string() } else { domain };
    let path = if domain == "docker.io" && !path.contains('/') { format!("library/{path}") } else { path };
    let valid_path = !path.is_empty()
        && path.split('/').all(|component| {
            !component.is_empty()
                && component.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && !component.starts_with(['.', '_', '-'])
        });
    let valid_domain = !domain.is_empty() && domain.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
    if !valid_path || !valid_domain {
        return Err(error());
    }
    Ok(format!("{domain}/{path}"))
}

fn entry_allows(entry: &Entry, wanted: &ImageRef) -> bool {
    match entry {
        Entry::AnyUnder { prefix } => wanted.repository.starts_with(&format!("{prefix}/")),
        // Every tag, but no digest: `golang:*` trusts what the
        // repository's tags name, not any content pushed to it.
        Entry::AnyTag { repository } => &wanted.repository == repository && wanted.digest.is_none(),
        Entry::Exact(allowed) => {
            if allowed.repository != wanted.repository {
                return false;
            }
            match (&allowed.digest, &wanted.digest) {
                // A pinned entry allows exactly that content, whatever tag
                // the caller writes beside it (runtimes ignore it).
                (Some(pinned), Some(digest)) => pinned == digest,
                (Some(_), None) => false,
                // A tag entry allows that tag only. A digest beside it
                // would be what is pulled, and it can name any content
                // of the repository.
                (None, Some(_)) => false,
                (None, None) => allowed.tag == wanted.tag,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn normalisation() {
        let cases = [
            ("python", "docker.io/library/python:latest"),
            ("python:3.12-slim", "docker.io/library/python:3.12-slim"),
            ("docker.io/library/python:3.12-slim", "docker.io/library/python:3.12-slim"),
            ("index.docker.io/library/python:3", "docker.io/library/python:3"),
            ("bitnami/git:2", "docker.io/bitnami/git:2"),
            ("ghcr.io/org/tool", "ghcr.io/org/tool:latest"),
            ("localhost:5000/x:1", "localhost:5000/x:1"),
            ("mcp-k8s-test.local/busybox:1.36", "mcp-k8s-test.local/busybox:1.36"),
            ("docker.io/python:3.12-slim", "docker.io/library/python:3.12-slim"),
            ("library/python:3.12-slim", "docker.io/library/python:3.12-slim"),
            ("index.docker.io/bitnami/git", "docker.io/bitnami/git:latest"),
            ("registry.example.com:5000/team/app:v1.2", "registry.example.com:5000/team/app:v1.2"),
            ("localhost/app", "localhost/app:latest"),
        ];
        for (raw, expected) in cases {
            assert_eq!(normalise(raw).unwrap().to_string(), expected, "{raw}");
        }
        assert_eq!(normalise(&format!("alpine@{DIGEST}")).unwrap().to_string(), format!("docker.io/library/alpine@{DIGEST}"));
    }

    #[test]
    fn invalid_references() {
        for raw in ["", "Python", "python:", "py thon", "python@sha256:xyz", "a//b", "-x", "python:-1"] {
            assert!(normalise(raw).is_err(), "{raw:?} should be refused");
        }
    }

    #[test]
    fn a_short_form_whose_full_form_is_over_512_characters_is_refused() {
        // `docker.io/library/` and `:latest` add 25 characters.
        let longest = "a".repeat(512 - 25);
        let full_form = normalise(&longest).unwrap().to_string();
        assert_eq!(full_form.len(), 512);
        assert_eq!(normalise(&full_form).unwrap().to_string(), full_form);
        let error = normalise(&"a".repeat(512 - 24)).unwrap_err();
        assert!(error.contains("full form") && error.contains("over 512 characters"), "{error}");
    }

    #[test]
    fn allowlist_decisions() {
        let list =
            Allowlist::parse(&format!("docker.io/library/python:3.12-slim, golang:*, ghcr.io/acme/*, alpine@{DIGEST}, busybox")).unwrap();
        let cases = [
            ("python:3.12-slim", true),
            ("docker.io/library/python:3.12-slim", true),
            ("python:3.12", false),
            ("python", false),
            ("golang:1.26", true),
            ("golang", true),
            ("docker.io/library/golang:1.22-alpine", true),
            ("ghcr.io/acme/builder:7", true),
            ("ghcr.io/acme/team/tool", true),
            ("ghcr.io/acmex/tool", false),
            ("ghcr.io/acme", false),
            (&format!("alpine@{DIGEST}"), true),
            ("alpine:3.20", false),
            ("busybox", true),
            ("busybox:latest", true),
            ("busybox:1.36", false),
            // A tag entry does not admit a digest.
            (&format!("busybox:latest@{DIGEST}"), false),
            (&format!("busybox@{DIGEST}"), false),
            (&format!("docker.io/library/busybox:latest@{DIGEST}"), false),
            (&format!("python:3.12-slim@{DIGEST}"), false),
            (&format!("alpine:3.20@{DIGEST}"), true),
            (&format!("alpine:3.20@{}", DIGEST.replace("0123", "4567")), false),
            ("docker.io/python:3.12-slim", true),
            ("library/python:3.12-slim", true),
            ("python:3.12-slim-bookworm", false),
            (&format!("golang@{DIGEST}"), false),
            (&format!("golang:1.26@{DIGEST}"), false),
            (&format!("ghcr.io/acme/builder@{DIGEST}"), true),
            (&format!("alpine@{}", DIGEST.to_ascii_uppercase().replace("SHA256", "sha256")), true),
            ("alpine@sha256:1111111111111111111111111111111111111111111111111111111111111111", false),
            ("index.docker.io/library/busybox", true),
            ("docker.io/busybox", true),
            ("Busybox", false),
            ("busybox:", false),
            ("busybox ", false),
            ("busybox\t", false),
            ("busybox\u{0}", false),
            ("busybox@sha256:0123", false),
            (&format!("busybox@sha256:{}", "0".repeat(63)), false),
            (&format!("busybox@sha512:{}", "0".repeat(64)), false),
            ("localhost:5000/busybox", false),
            ("registry-1.docker.io/library/busybox", false),
        ];
        for (image, allowed) in cases {
            assert_eq!(list.check(image).is_ok(), allowed, "{image}");
        }
        let refusal = list.check("evil").unwrap_err();
        assert!(refusal.contains("`evil`") && refusal.contains("allowed: docker.io/library/python:3.12-slim, golang:*"), "{refusal}");
    }

    #[test]
    fn an_empty_list_allows_nothing_and_says_why() {
        let list = Allowlist::parse(" , ").unwrap();
        assert!(list.is_empty());
        assert!(list.check("busybox").unwrap_err().contains("MCP_K8S_ALLOWED_IMAGES is empty"));
    }
}
