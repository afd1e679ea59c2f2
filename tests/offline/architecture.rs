//! Keeps the layout honest: every source file states its job in a `//!`
//! header, and every top-level module of `src/` imports only the modules its
//! entry in `ALLOWED` names (the target layout of `docs/architecture.md`'s module
//! layout). Edges that exist today but are scheduled to go are listed apart
//! in `TRANSITIONAL`, each with the module whose arrival removes it; when it
//! lands, the stale-entry test says which line to delete.
//!
//! Imports are found by parsing, not by text match: comments and string
//! literals are blanked first, then every `crate::` path counts, whether in a
//! `use` (plain, grouped, nested, `pub use`) or inline in code. It
//! deliberately knows nothing of what the modules contain, and does not follow
//! `super::` (no file climbs out of its top-level module that way today).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Leaf modules every layer may use: they import nothing of the crate
/// (`images` and `quantity` only `echo`) and know no layer.
const LEAVES: &[&str] = &["cancel", "echo", "images", "json", "log", "metrics", "network", "quantity", "time"];

/// Who may import whom, on top of `LEAVES` (a `*` entry: only the leaves).
/// Keys are module paths under `src/` (`protocol/jsonrpc` is
/// `src/protocol/jsonrpc.rs`); the longest key that is a prefix of a file's
/// path decides. A top-level module without a key fails the test, so a new
/// module starts with a decision.
const ALLOWED: &[(&str, &[&str])] = &[
    // The composition root: it wires every layer (and runs the runner's
    // subcommands), so it may name them all.
    ("main", &["backend", "config", "docker", "engine", "kube", "languages", "protocol", "runner", "sandbox", "tools", "transport"]),
    // `lib.rs` only declares the modules (a `mod` is not an import).
    ("lib", &[]),
    ("transport", &["protocol", "config"]),
    ("protocol", &["tools", "config"]),
    // The wire format of JSON-RPC: it knows no tool.
    ("protocol/jsonrpc", &[]),
    // `sandbox` for what a caller sees of the contract: the default workdir
    // and tmp folder, and which stream live output came from.
    ("tools", &["engine", "config", "languages", "sandbox"]),
    // Backend-neutral: no runner (it shares `sandbox` with it), no kube, no docker.
    ("engine", &["sandbox"]),
    ("sandbox", &[]),
    ("backend", &["engine", "sandbox", "kube", "docker"]),
    // Only the Kubernetes backend imports `kube`, only the Docker one `docker`.
    ("backend/kubernetes", &["engine", "sandbox", "kube", "config"]),
    ("backend/docker", &["engine", "sandbox", "docker", "config"]),
    ("kube", &[]),
    ("docker", &[]),
    // The in-sandbox entrypoint knows only the contract.
    ("runner", &["sandbox"]),
    ("config", &["languages", "pools"]),
    ("languages", &[]),
    ("pools", &[]),
    ("cancel", &[]),
    ("echo", &[]),
    ("images", &[]),
    ("json", &[]),
    ("log", &[]),
    ("metrics", &[]),
    ("network", &[]),
    ("quantity", &[]),
    ("time", &[]),
];

/// Edges of today's tree that the target layout removes: (importing module
/// path, imported top-level module, what removes it). Delete a line when the
/// move lands (the stale-entry test below says when).
const TRANSITIONAL: &[(&str, &str, &str)] = &[];

// ---------------------------------------------------------------------------
// The source tree.

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn source_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![src_dir()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `src/protocol/jsonrpc.rs` → `protocol/jsonrpc`, `src/engine/mod.rs` → `engine`.
fn module_path(path: &Path) -> String {
    let relative = path.strip_prefix(src_dir()).expect("under src");
    let text = relative.to_string_lossy().trim_end_matches(".rs").to_string();
    text.strip_suffix("/mod").map(str::to_string).unwrap_or(text)
}

fn top_module(module_path: &str) -> &str {
    module_path.split('/').next().unwrap_or(module_path)
}

/// The top-level modules of `src/` (files and folders), as `crate::x` names them.
fn top_modules() -> BTreeSet<String> {
    source_files().iter().map(|path| top_module(&module_path(path)).to_string()).collect()
}

/// The most specific `ALLOWED` entry for a module path.
fn rule_for(module_path: &str) -> Option<(&'static str, &'static [&'static str])> {
    ALLOWED
        .iter()
        .filter(|(key, _)| module_path == *key || module_path.starts_with(&format!("{key}/")))
        .max_by_key(|(key, _)| key.len())
        .copied()
}

fn may_import(key: &str, allowed: &[&str], target: &str) -> bool {
    allowed.contains(&target) || LEAVES.contains(&target) || TRANSITIONAL.iter().any(|(from, to, _)| *from == key && *to == target)
}

/// Every (file, importing module path, imported top-level module) of the tree,
/// imports of a module's own top level left out.
fn edges() -> Vec<(PathBuf, String, String)> {
    let modules = top_modules();
    let mut edges = Vec::new();
    for path in source_files() {
        let module_path = module_path(&path);
        let text = std::fs::read_to_string(&path).expect("readable source");
        let code = strip_comments_and_literals(&text);
        let imported: BTreeSet<String> = crate_imports(&code).into_iter().collect();
        for target in imported {
            if target != top_module(&module_path) && modules.contains(&target) {
                edges.push((path.clone(), module_path.clone(), target));
            }
        }
    }
    edges
}

// ---------------------------------------------------------------------------
// The parser.

/// `text` with comments, string literals (plain, byte, raw) and character
/// literals replaced by spaces, so that `crate::` in them is not an import.
/// Lifetimes (`'a`) are kept; newlines too, so positions stay readable.
fn strip_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let end = literal_or_comment_end(&chars, i);
        if end > i {
            out.extend(chars[i..end].iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
            i = end;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Where the comment or literal starting at `i` ends, or `i` when none starts there.
fn literal_or_comment_end(chars: &[char], i: usize) -> usize {
    let at = |k: usize| chars.get(k).copied().unwrap_or('\0');
    let after_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    match (at(i), at(i + 1)) {
        ('/', '/') => (i..chars.len()).find(|&k| chars[k] == '\n').unwrap_or(chars.len()),
        ('/', '*') => block_comment_end(chars, i),
        ('"', _) => quoted_end(chars, i + 1, '"'),
        ('r', '"' | '#') if !after_ident => raw_string_end(chars, i + 1).unwrap_or(i),
        ('b', 'r') if !after_ident => raw_string_end(chars, i + 2).unwrap_or(i),
        ('\'', _) => char_literal_end(chars, i).unwrap_or(i),
        _ => i,
    }
}

/// Block comments nest in Rust.
fn block_comment_end(chars: &[char], start: usize) -> usize {
    let mut depth = 0;
    let mut k = start;
    while k + 1 < chars.len() {
        if chars[k] == '/' && chars[k + 1] == '*' {
            depth += 1;
            k += 2;
        } else if chars[k] == '*' && chars[k + 1] == '/' {
            depth -= 1;
            k += 2;
            if depth == 0 {
                return k;
            }
        } else {
            k += 1;
        }
    }
    chars.len()
}

/// The end of a literal whose body starts at `k` and ends with `close`, with
/// backslash escapes.
fn quoted_end(chars: &[char], mut k: usize, close: char) -> usize {
    while k < chars.len() {
        match chars[k] {
            '\\' => k += 2,
            c if c == close => return k + 1,
            _ => k += 1,
        }
    }
    chars.len()
}

/// `k` points after the `r` of `r#"..."#`; `None` when this is no raw string
/// (an identifier such as `r#type`).
fn raw_string_end(chars: &[char], mut k: usize) -> Option<usize> {
    let mut hashes = 0;
    while chars.get(k) == Some(&'#') {
        hashes += 1;
        k += 1;
    }
    if chars.get(k) != Some(&'"') {
        return None;
    }
    k += 1;
    while k < chars.len() {
        if chars[k] == '"' && (1..=hashes).all(|h| chars.get(k + h) == Some(&'#')) {
            return Some(k + 1 + hashes);
        }
        k += 1;
    }
    Some(chars.len())
}

/// `'x'` or `'\n'`, but not a lifetime (`'a`, `'static`).
fn char_literal_end(chars: &[char], i: usize) -> Option<usize> {
    match chars.get(i + 1)? {
        '\\' => Some(quoted_end(chars, i + 1, '\'')),
        _ if chars.get(i + 2) == Some(&'\'') => Some(i + 3),
        _ => None,
    }
}

/// The top-level module of every crate path in `code` (already stripped):
/// `crate::a::b` → `a`, `crate::{a, b::{c, d}}` → `a`, `b`; the same for
/// `$crate::` in macros and `mcp_k8s_ephemeral_job::` (how `main.rs`
/// names the library). `self`, `*` and the like are left out.
fn crate_imports(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let Some(after_root) = crate_root_at(&chars, i) else {
            i += 1;
            continue;
        };
        let k = skip_spaces(&chars, after_root);
        if chars.get(k) == Some(&'{') {
            let (items, end) = group_items(&chars, k);
            found.extend(items.iter().filter_map(|item| first_identifier(item)));
            i = end;
        } else {
            found.extend(first_identifier(&chars[k..].iter().collect::<String>()));
            i = k;
        }
    }
    found.retain(|name| name != "self" && name != "super");
    found
}

/// When a crate root (`crate`, `$crate`, `mcp_k8s_ephemeral_job`) followed by
/// `::` starts at `i`, where its path continues.
fn crate_root_at(chars: &[char], i: usize) -> Option<usize> {
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    for root in ["crate", "mcp_k8s_ephemeral_job"] {
        let end = i + root.len();
        let matches = chars.get(i..end).is_some_and(|word| word.iter().copied().eq(root.chars()));
        if !matches || chars.get(end).is_some_and(|&c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let k = skip_spaces(chars, end);
        if chars.get(k) == Some(&':') && chars.get(k + 1) == Some(&':') {
            return Some(k + 2);
        }
    }
    None
}

fn skip_spaces(chars: &[char], mut k: usize) -> usize {
    while chars.get(k).is_some_and(|c| c.is_whitespace()) {
        k += 1;
    }
    k
}

/// The top-level items of the `{ ... }` group opening at `open`, and where it ends.
fn group_items(chars: &[char], open: usize) -> (Vec<String>, usize) {
    let mut items = vec![String::new()];
    let mut depth = 0;
    let mut k = open;
    while k < chars.len() {
        let c = chars[k];
        k += 1;
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        if let Some(item) = items.last_mut() {
            item.push(c);
        }
    }
    (items, k)
}

fn first_identifier(text: &str) -> Option<String> {
    let name: String = text.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

// ---------------------------------------------------------------------------
// The rules.

#[test]
fn every_source_file_starts_with_a_module_doc() {
    let missing: Vec<_> = source_files()
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).expect("readable source");
            !text.trim_start().starts_with("//!")
        })
        .collect();
    assert!(missing.is_empty(), "files without a //! header: {missing:?}");
}

#[test]
fn every_top_level_module_has_an_allow_list() {
    let missing: Vec<_> = top_modules().into_iter().filter(|module| !ALLOWED.iter().any(|(key, _)| key == module)).collect();
    assert!(missing.is_empty(), "top-level modules of src/ without an entry in ALLOWED (tests/offline/architecture.rs): {missing:?}");
}

#[test]
fn imports_follow_the_allow_list() {
    let mut violations = Vec::new();
    for (path, module_path, target) in edges() {
        let Some((key, allowed)) = rule_for(&module_path) else {
            continue; // every_top_level_module_has_an_allow_list reports it
        };
        if !may_import(key, allowed, &target) {
            let file = path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(&path).display().to_string();
            violations.push(format!("{file} imports crate::{target}, which {key} may not use"));
        }
    }
    assert!(violations.is_empty(), "imports outside the allow-list (tests/offline/architecture.rs):\n{}", violations.join("\n"));
}

#[test]
fn every_transitional_edge_still_exists() {
    let edges = edges();
    let stale: Vec<_> = TRANSITIONAL
        .iter()
        .filter(|(from, to, _)| {
            !edges.iter().any(|(_, module_path, target)| rule_for(module_path).map(|(key, _)| key) == Some(from) && target == to)
        })
        .map(|(from, to, removed_by)| format!("{from} → {to} (removed by {removed_by})"))
        .collect();
    assert!(
        stale.is_empty(),
        "no file makes these TRANSITIONAL imports any more: delete them from tests/offline/architecture.rs: {stale:?}"
    );
}

#[test]
fn the_allow_list_catches_todays_skip_edges_without_their_transitional_entries() {
    let skip_edges =
        [("transport", "engine"), ("tools", "runner"), ("protocol/jsonrpc", "tools"), ("engine", "runner"), ("engine", "kube")];
    for (from, to) in skip_edges {
        let (key, allowed) = rule_for(from).expect("a rule");
        assert!(!allowed.contains(&to) && !LEAVES.contains(&to), "{key} → {to} must need its TRANSITIONAL entry");
    }
}

// ---------------------------------------------------------------------------
// The parser's own cases.

fn imports_of(source: &str) -> Vec<String> {
    crate_imports(&strip_comments_and_literals(source))
}

#[test]
fn a_plain_use_and_an_inline_path_are_imports() {
    assert_eq!(imports_of("use crate::kube::Client;\nfn f() { crate::log::info(\"x\"); }"), ["kube", "log"]);
}

#[test]
fn grouped_and_nested_uses_name_each_top_level_module() {
    let source = "pub use crate::{engine::{cancel::CancelToken, spec::{RunSpec, Policy}}, kube, runner::frame::{self, Frame}};";
    assert_eq!(imports_of(source), ["engine", "kube", "runner"]);
}

#[test]
fn pub_crate_visibility_and_spacing_are_understood() {
    assert_eq!(imports_of("pub(crate) use crate :: {\n    tools,\n    config::Config,\n};"), ["tools", "config"]);
    assert_eq!(imports_of("pub(crate) fn f() {}"), Vec::<String>::new());
}

#[test]
fn comments_and_string_literals_are_not_imports() {
    let source = concat!(
        "// use crate::kube;\n",
        "/* crate::engine /* nested crate::runner */ crate::tools */\n",
        "/// Calls `crate::docker::run`.\n",
        "const A: &str = \"crate::backend\";\n",
        "const B: &str = r#\"crate::sandbox \"quoted\" \"#;\n",
        "const C: &[u8] = b\"crate::doctor\";\n",
        "const D: char = '\"'; use crate::log;\n",
        "fn f<'a>(x: &'a str) -> &'a str { crate::echo::g(x) }\n",
    );
    assert_eq!(imports_of(source), ["log", "echo"]);
}

#[test]
fn the_library_s_name_and_dollar_crate_count_and_self_does_not() {
    assert_eq!(imports_of("use mcp_k8s_ephemeral_job::config::{self, Config};"), ["config"]);
    assert_eq!(imports_of("macro_rules! m { () => { $crate::log::emit() } }"), ["log"]);
    assert_eq!(imports_of("use crate::{self as root};"), Vec::<String>::new());
    assert_eq!(imports_of("let my_crate::x = 1; notcrate::y();"), Vec::<String>::new());
}

#[test]
fn a_file_s_rule_is_its_longest_key() {
    assert_eq!(rule_for("protocol/jsonrpc").map(|(key, _)| key), Some("protocol/jsonrpc"));
    assert_eq!(rule_for("protocol/tasks").map(|(key, _)| key), Some("protocol"));
    assert_eq!(rule_for("transport/http/conn").map(|(key, _)| key), Some("transport"));
    assert_eq!(rule_for("backend/kubernetes/record").map(|(key, _)| key), Some("backend/kubernetes"));
    assert_eq!(rule_for("protocolx").map(|(key, _)| key), None);
}
