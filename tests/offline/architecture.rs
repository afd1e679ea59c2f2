//! Keeps the layout honest: every source file states its job in a `//!`
//! header, and every top-level module of `src/` imports only the modules its
//! entry in `ALLOWED` names (the target layout of `docs/architecture.md`'s module
//! layout). No edge is tolerated on its way out: a move that needs one
//! lands whole.
//!
//! Inside each folder, the files' imports of one another point one way: no
//! circle (`a.rs → b.rs → a.rs`), which the top-level allow-list cannot see.
//! A folder's nodes are its files and its subfolders (each as one node), and
//! an edge `a → b` means a file under `a` names an item of a module under
//! `b`: the longest prefix of the path that is a module decides, with
//! `super::` and `self::` resolved from the naming file's module. A folder's
//! `mod.rs` (and `lib.rs` for `src/`) is left out of its own folder's graph:
//! declaring its children, re-exporting them and calling into them is what
//! a parent is for, and its children naming its items (`super::Server`) is
//! how Rust shares a folder's vocabulary, so that pair alone is no circle.
//! Test code is left out too: a `#[cfg(test)]` item (the `mod tests` block,
//! whose `use super::*` and fixtures borrowed from siblings are no
//! dependency of the production code), and a file only such a declaration
//! brings in (`protocol/tests.rs`).
//!
//! Imports are found by parsing, not by text match: comments and string
//! literals are blanked first, then every `crate::` path counts, whether in a
//! `use` (plain, grouped, nested, `pub use`) or inline in code; the folder
//! check adds `super::`, `self::` and bare paths (a `mod.rs` naming a
//! child). It deliberately knows nothing of what the modules contain: a
//! name a `mod.rs` re-exports from a child counts as the `mod.rs`'s (the
//! style avoids re-exports; `kube::Error` is one).
//!
//! Counting a `mod.rs` both ways would flag every parent that dispatches to
//! a child which uses the parent's types (`tools::Ctx`, `protocol::Server`,
//! `kube::Client`, `transport::http::HttpState`); moving those types out
//! of their `mod.rs` is a larger step than this check.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// Leaf modules every layer may use: they import nothing of the crate
/// (`images`, `json` and `quantity` only `echo`; `supervise` only `echo`, `log`
/// and `metrics`; `audit` only `log`, `network`, `settings_file` and
/// `supervise`; `trace` only `log`, `metrics` and `supervise`;
/// `settings_file` and `yaml` nothing) and know no layer.
const LEAVES: &[&str] = &[
    "audit",
    "cancel",
    "echo",
    "http1",
    "images",
    "json",
    "log",
    "metrics",
    "network",
    "quantity",
    "settings_file",
    "supervise",
    "time",
    "trace",
    "yaml",
];

/// Who may import whom, on top of `LEAVES` (a `*` entry: only the leaves).
/// Keys are module paths under `src/` (`protocol/jsonrpc` is
/// `src/protocol/jsonrpc.rs`); the longest key that is a prefix of a file's
/// path decides. A top-level module without a key fails the test, so a new
/// module starts with a decision.
const ALLOWED: &[(&str, &[&str])] = &[
    // The composition root: it wires every layer (and runs the runner's
    // subcommands), so it may name them all.
    ("main", &["backend", "config", "engine", "protocol", "runner", "tools", "transport", "wiring"]),
    // main's library half: each layer's settings from the `Config`, and the
    // one `match` on the configured backend.
    ("wiring", &["backend", "config", "engine", "outputs"]),
    // `lib.rs` only declares the modules (a `mod` is not an import).
    ("lib", &[]),
    ("transport", &["protocol", "config", "callers"]),
    ("protocol", &["tools", "config", "callers"]),
    // The wire format of JSON-RPC: it knows no tool.
    ("protocol/jsonrpc", &[]),
    // `sandbox` for what a caller sees of the contract: the default workdir
    // and tmp folder, and which stream live output came from.
    ("tools", &["engine", "config", "languages", "sandbox", "callers", "outputs"]),
    // Backend-neutral: no runner (it shares `sandbox` with it), no kube, no docker.
    ("engine", &["sandbox", "outputs"]),
    // The output store: files on disk and the links to them; the engine
    // writes it, `tools` reads it for `resources/read`.
    ("outputs", &["sandbox"]),
    ("sandbox", &[]),
    // `config`: a backend's `connect` reads its own settings from it.
    ("backend", &["engine", "sandbox", "kube", "docker", "config"]),
    // Only the Kubernetes backend imports `kube`, only the Docker one `docker`.
    ("backend/kubernetes", &["engine", "sandbox", "kube", "config"]),
    ("backend/docker", &["engine", "sandbox", "docker", "config"]),
    ("kube", &[]),
    ("docker", &[]),
    // The in-sandbox entrypoint knows only the contract.
    ("runner", &["sandbox"]),
    ("config", &["languages", "pools", "callers"]),
    ("languages", &[]),
    // The tokens file and the counted limits; the allowlist's syntax is `images`'.
    ("callers", &[]),
    // A pool may be of a language profile (`language`).
    ("pools", &["languages"]),
    ("audit", &[]),
    ("cancel", &[]),
    ("echo", &[]),
    ("http1", &[]),
    ("images", &[]),
    ("json", &[]),
    ("log", &[]),
    ("metrics", &[]),
    ("network", &[]),
    ("quantity", &[]),
    ("settings_file", &[]),
    ("supervise", &[]),
    ("time", &[]),
    ("trace", &[]),
    ("yaml", &[]),
];

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

fn may_import(allowed: &[&str], target: &str) -> bool {
    allowed.contains(&target) || LEAVES.contains(&target)
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
        if !may_import(allowed, &target) {
            let file = path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(&path).display().to_string();
            violations.push(format!("{file} imports crate::{target}, which {key} may not use"));
        }
    }
    assert!(violations.is_empty(), "imports outside the allow-list (tests/offline/architecture.rs):\n{}", violations.join("\n"));
}

/// Every thread the server starts outside a scope goes through
/// `supervise`, which sees its panic (log, counter, `/readyz`). Left out:
/// `supervise` itself, the in-sandbox runner (no `/metrics`, and no log the
/// server reads) and test modules (from a file's `#[cfg(test)]` on).
#[test]
fn threads_start_through_supervise() {
    let mut violations = Vec::new();
    for path in source_files() {
        let module_path = module_path(&path);
        if module_path == "supervise" || top_module(&module_path) == "runner" {
            continue;
        }
        let code = strip_comments_and_literals(&std::fs::read_to_string(&path).expect("readable source"));
        let shipped = code.split("#[cfg(test)]").next().unwrap_or_default();
        for needle in ["thread::spawn", "thread::Builder"] {
            if shipped.contains(needle) {
                let file = path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(&path).display().to_string();
                violations.push(format!("{file} uses {needle}"));
            }
        }
    }
    assert!(violations.is_empty(), "threads started around supervise::spawn:\n{}", violations.join("\n"));
}

#[test]
fn the_allow_list_refuses_edges_that_skip_a_layer() {
    let skip_edges =
        [("transport", "engine"), ("tools", "runner"), ("protocol/jsonrpc", "tools"), ("engine", "runner"), ("engine", "kube")];
    for (from, to) in skip_edges {
        let (key, allowed) = rule_for(from).expect("a rule");
        assert!(!allowed.contains(&to) && !LEAVES.contains(&to), "{key} → {to} skips a layer and must be refused");
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

// ---------------------------------------------------------------------------
// Circles inside folders.

/// The crate's files as (path under `src/`, source), as the folder check reads them.
fn crate_sources() -> Vec<(String, String)> {
    source_files()
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(src_dir()).expect("under src").to_string_lossy().to_string();
            (relative, std::fs::read_to_string(&path).expect("readable source"))
        })
        .collect()
}

/// A file's module as segments: `engine/decide.rs` → `engine`, `decide`;
/// `engine/mod.rs` → `engine`; `lib.rs` and `main.rs` (crate roots) → none.
fn module_of(file: &str) -> Vec<String> {
    let text = file.trim_end_matches(".rs");
    let text = text.strip_suffix("/mod").unwrap_or(text);
    if text == "lib" || text == "main" || text == "mod" {
        return Vec::new();
    }
    text.split('/').map(str::to_string).collect()
}

/// The folder a file sits in (`""` for `src/`) and whether it is that
/// folder's own module (`mod.rs`, or `lib.rs` for `src/`).
fn folder_of(file: &str) -> (&str, bool) {
    let (folder, name) = file.rsplit_once('/').unwrap_or(("", file));
    (folder, name == "mod.rs" || (folder.is_empty() && name == "lib.rs"))
}

/// `code` (already stripped) without its `#[cfg(test)]` items: from the
/// attribute to the item's `;` or the `}` that closes its body.
fn strip_test_items(code: &str) -> String {
    const ATTRIBUTE: &str = "#[cfg(test)]";
    let chars: Vec<char> = code.chars().collect();
    let mut blank = vec![false; chars.len()];
    let mut from = 0;
    while let Some(found) = code[from..].find(ATTRIBUTE) {
        let start_byte = from + found;
        from = start_byte + ATTRIBUTE.len();
        let start = code[..start_byte].chars().count();
        let end = item_end(&chars, start + ATTRIBUTE.chars().count());
        blank[start..end].iter_mut().for_each(|flag| *flag = true);
    }
    chars.iter().zip(blank).map(|(&c, blanked)| if blanked && c != '\n' { ' ' } else { c }).collect()
}

/// Where the item starting at `k` ends: after its first `;` outside any
/// bracket, or after the `}` that closes its first `{`.
fn item_end(chars: &[char], mut k: usize) -> usize {
    let mut depth = 0usize;
    while k < chars.len() {
        match chars[k] {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return k + 1;
                }
            }
            ';' if depth == 0 => return k + 1,
            _ => {}
        }
        k += 1;
    }
    chars.len()
}

/// Whether `code` (stripped) declares the child module `name` (`mod name;`
/// or `mod name {`).
fn declares_module(code: &str, name: &str) -> bool {
    let words: Vec<&str> = code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ';')).filter(|w| !w.is_empty()).collect();
    words.windows(2).any(|pair| pair[0] == "mod" && (pair[1] == format!("{name};") || pair[1] == name))
}

/// Every module path in `code` (stripped), as absolute segments: `crate::`,
/// `$crate::` and `mcp_k8s_ephemeral_job::` from the crate root, `super::`,
/// `self::` and bare paths from `module` (the naming file's), groups
/// expanded (`crate::a::{b::C, d}` → `a b C`, `a d`).
fn absolute_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let boundary = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':');
        let word = identifier_at(&chars, i);
        let word_end = i + word.chars().count();
        if !boundary || word.is_empty() {
            i = word_end.max(i + 1);
            continue;
        }
        let after_word = skip_spaces(&chars, word_end);
        let is_path = chars.get(after_word) == Some(&':') && chars.get(after_word + 1) == Some(&':');
        let prefix = match word.as_str() {
            "crate" | "mcp_k8s_ephemeral_job" if is_path => Some(Vec::new()),
            "self" if is_path => Some(module.to_vec()),
            "super" if is_path => Some(module[..module.len().saturating_sub(1)].to_vec()),
            // A bare path is relative to the file's module: a `mod.rs`
            // naming its child (`modern::complete`). Any other (`std::`, an
            // alias a `use` made) resolves back to the file itself.
            _ if is_path => Some(module.iter().cloned().chain([word.clone()]).collect()),
            _ => None,
        };
        i = match prefix {
            Some(prefix) => path_rest(&chars, after_word + 2, prefix, &mut found),
            None => word_end,
        };
    }
    found
}

fn identifier_at(chars: &[char], k: usize) -> String {
    chars[k..].iter().take_while(|c| c.is_alphanumeric() || **c == '_').collect()
}

/// Reads the rest of a path from `k` (after a `::`) onto `prefix`, pushes
/// each path it names, and returns where it ends.
fn path_rest(chars: &[char], k: usize, mut prefix: Vec<String>, found: &mut Vec<Vec<String>>) -> usize {
    let mut k = skip_spaces(chars, k);
    loop {
        if chars.get(k) == Some(&'{') {
            return group_rest(chars, k, &prefix, found);
        }
        let word = identifier_at(chars, k);
        let word_end = k + word.chars().count();
        match word.as_str() {
            // `*`, `self` in a group, or what is no path segment: the prefix itself.
            "" | "self" => {
                found.push(prefix);
                return word_end;
            }
            "super" => {
                prefix.pop();
            }
            _ => prefix.push(word.clone()),
        }
        let after_word = skip_spaces(chars, word_end);
        if chars.get(after_word) == Some(&':') && chars.get(after_word + 1) == Some(&':') {
            k = skip_spaces(chars, after_word + 2);
        } else {
            found.push(prefix);
            return word_end;
        }
    }
}

/// The items of the group opening at `open`, each read onto `prefix`.
fn group_rest(chars: &[char], open: usize, prefix: &[String], found: &mut Vec<Vec<String>>) -> usize {
    let mut k = open + 1;
    loop {
        k = skip_spaces(chars, k);
        match chars.get(k) {
            None => return chars.len(),
            Some('}') => return k + 1,
            Some(',') => {
                k += 1;
                continue;
            }
            _ => {}
        }
        k = path_rest(chars, k, prefix.to_vec(), found);
        // What follows an item up to its comma (`as name`) names nothing.
        while chars.get(k).is_some_and(|&c| c != ',' && c != '}') {
            k += 1;
        }
    }
}

/// One import between two nodes of a folder, and the first path that makes it.
#[derive(Debug)]
struct FolderEdge {
    folder: String,
    from: String,
    to: String,
    file: String,
    path: String,
}

/// The node of `folder` that holds `file`: the file's name (`decide.rs`)
/// or its subfolder's (`http/`).
fn node_in(folder: &str, file: &str) -> String {
    let below = if folder.is_empty() { file } else { &file[folder.len() + 1..] };
    match below.split_once('/') {
        Some((subfolder, _)) => format!("{subfolder}/"),
        None => below.to_string(),
    }
}

/// The deepest folder holding both files.
fn common_folder(a: &str, b: &str) -> String {
    let (folder_a, _) = a.rsplit_once('/').unwrap_or(("", a));
    let (folder_b, _) = b.rsplit_once('/').unwrap_or(("", b));
    let common: Vec<&str> =
        folder_a.split('/').zip(folder_b.split('/')).take_while(|(x, y)| x == y && !x.is_empty()).map(|(x, _)| x).collect();
    common.join("/")
}

/// Every import between two nodes of one folder, in files the production
/// build compiles, with test items left out; each (folder, from, to) once.
fn folder_edges(sources: &[(String, String)]) -> Vec<FolderEdge> {
    let stripped: BTreeMap<&str, String> =
        sources.iter().map(|(file, text)| (file.as_str(), strip_test_items(&strip_comments_and_literals(text)))).collect();
    let file_of_module: BTreeMap<Vec<String>, &str> =
        stripped.keys().filter(|file| **file != "main.rs").map(|file| (module_of(file), *file)).collect();
    // A file counts when its parent declares it outside test items.
    let compiled = |file: &str| {
        let module = module_of(file);
        let Some((name, parent)) = module.split_last() else { return true };
        file_of_module.get(parent).is_some_and(|parent_file| declares_module(&stripped[parent_file], name))
    };
    let mut edges: Vec<FolderEdge> = Vec::new();
    for (file, code) in &stripped {
        if !compiled(file) {
            continue;
        }
        for path in absolute_paths(code, &module_of(file)) {
            let Some(target) = (0..=path.len()).rev().find_map(|n| file_of_module.get(&path[..n])) else { continue };
            if target == file || !compiled(target) {
                continue;
            }
            let folder = common_folder(file, target);
            let (from, to) = (node_in(&folder, file), node_in(&folder, target));
            let is_root = |file: &str| folder_of(file) == (folder.as_str(), true);
            if is_root(file) || is_root(target) || from == to {
                continue;
            }
            if !edges.iter().any(|edge| edge.folder == folder && edge.from == from && edge.to == to) {
                let path = format!("crate::{}", path.join("::"));
                edges.push(FolderEdge { folder, from, to, file: file.to_string(), path });
            }
        }
    }
    edges
}

/// The circles among `edges`, each as `src/folder/: a.rs → b.rs → a.rs`
/// with the paths that make its steps: for every edge inside a strongly
/// connected set, the shortest way back, so every edge that closes a circle
/// shows in one.
fn circles(edges: &[FolderEdge]) -> Vec<String> {
    let folders: BTreeSet<&str> = edges.iter().map(|edge| edge.folder.as_str()).collect();
    let mut found = BTreeSet::new();
    for folder in folders {
        let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for edge in edges.iter().filter(|edge| edge.folder == folder) {
            next.entry(edge.from.as_str()).or_default().push(edge.to.as_str());
            next.entry(edge.to.as_str()).or_default();
        }
        for component in strongly_connected(&next).into_iter().filter(|component| component.len() > 1) {
            for &from in &component {
                for &to in next[from].iter().filter(|to| component.contains(*to)) {
                    // `to` … `from`, the way back; `from` closes the circle.
                    let mut cycle = vec![from];
                    cycle.extend(shortest_path(&next, &component, to, from));
                    cycle.pop();
                    found.insert(describe_circle(folder, &cycle, edges));
                }
            }
        }
    }
    found.into_iter().collect()
}

/// Tarjan's strongly connected components of a small graph.
fn strongly_connected<'a>(next: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<BTreeSet<&'a str>> {
    struct Walk<'a, 'g> {
        next: &'g BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        components: Vec<BTreeSet<&'a str>>,
    }
    fn visit<'a>(walk: &mut Walk<'a, '_>, node: &'a str) {
        let index = walk.index.len();
        walk.index.insert(node, index);
        walk.low.insert(node, index);
        walk.stack.push(node);
        let next = walk.next;
        for &to in &next[node] {
            if !walk.index.contains_key(to) {
                visit(walk, to);
                let low = walk.low[node].min(walk.low[to]);
                walk.low.insert(node, low);
            } else if walk.stack.contains(&to) {
                let low = walk.low[node].min(walk.index[to]);
                walk.low.insert(node, low);
            }
        }
        if walk.low[node] == walk.index[node] {
            let mut component = BTreeSet::new();
            while let Some(member) = walk.stack.pop() {
                component.insert(member);
                if member == node {
                    break;
                }
            }
            walk.components.push(component);
        }
    }
    let mut walk = Walk { next, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), components: Vec::new() };
    for &node in next.keys() {
        if !walk.index.contains_key(node) {
            visit(&mut walk, node);
        }
    }
    walk.components
}

/// A shortest way from `from` to `to` inside `component`, both ends included.
fn shortest_path<'a>(next: &BTreeMap<&'a str, Vec<&'a str>>, component: &BTreeSet<&'a str>, from: &'a str, to: &'a str) -> Vec<&'a str> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(node) = queue.pop_front() {
        if node == to {
            break;
        }
        for &after in next[node].iter().filter(|after| component.contains(*after)) {
            if after != from && !came_from.contains_key(after) {
                came_from.insert(after, node);
                queue.push_back(after);
            }
        }
    }
    let mut path = vec![to];
    while let Some(&before) = came_from.get(path.last().expect("not empty")) {
        path.push(before);
    }
    path.reverse();
    path
}

/// `src/engine/: a.rs → b.rs → a.rs` (rotated to start at its least node),
/// then each step's evidence.
fn describe_circle(folder: &str, cycle: &[&str], edges: &[FolderEdge]) -> String {
    let least = (0..cycle.len()).min_by_key(|&i| cycle[i]).expect("a circle has nodes");
    let rotated: Vec<&str> = cycle[least..].iter().chain(&cycle[..least]).copied().collect();
    let shown = if folder.is_empty() { "src/".to_string() } else { format!("src/{folder}/") };
    let mut text = format!("{shown}: {} → {}", rotated.join(" → "), rotated[0]);
    for (i, from) in rotated.iter().enumerate() {
        let to = rotated[(i + 1) % rotated.len()];
        let edge = edges.iter().find(|edge| edge.folder == folder && edge.from == *from && edge.to == to).expect("a step is an edge");
        text.push_str(&format!("\n    src/{} names {}", edge.file, edge.path));
    }
    text
}

#[test]
fn no_folder_has_a_circle_of_imports() {
    let found = circles(&folder_edges(&crate_sources()));
    assert!(
        found.is_empty(),
        "imports inside a folder go round in a circle; move what both sides need to the file that owns it:\n{}",
        found.join("\n")
    );
}

/// The engine's lifecycles, bottom up (`docs/architecture.md`): each may
/// import only those before it. A new lifecycle starts with its place here.
const ENGINE_LAYERS: &[&str] = &["port/", "run/", "pools/", "sandboxes/", "background/", "reaper.rs"];

#[test]
fn the_engines_lifecycles_import_only_what_is_below_them() {
    let edges = folder_edges(&crate_sources());
    let layer = |node: &str| ENGINE_LAYERS.iter().position(|layer| *layer == node);
    let mut wrong = Vec::new();
    for edge in edges.iter().filter(|edge| edge.folder == "engine") {
        match (layer(&edge.from), layer(&edge.to)) {
            (Some(from), Some(to)) if to < from => {}
            (None, _) => wrong.push(format!("src/engine/{} has no place in ENGINE_LAYERS", edge.from)),
            (_, None) => wrong.push(format!("src/engine/{} has no place in ENGINE_LAYERS", edge.to)),
            _ => wrong.push(format!("src/{} names {}, which is not below {}", edge.file, edge.path, edge.from)),
        }
    }
    wrong.dedup();
    assert!(wrong.is_empty(), "the engine's lifecycles import one way only (ENGINE_LAYERS):\n{}", wrong.join("\n"));
}

/// The source files `docs/architecture.md`'s module table names: a row
/// whose first cell is a folder (`src/engine/run/`) names the files in
/// backticks after it relative to that folder (`mod.rs`, `http/conn.rs`);
/// a row of files (`src/cancel.rs`, …) names them whole. Each as a path
/// under `src/`.
fn files_the_layout_names(doc: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for row in doc.lines().filter(|line| line.starts_with("| `src/")) {
        let mut cells = row.split(" | ");
        let first = cells.next().unwrap_or_default();
        let rest: String = cells.collect::<Vec<_>>().join(" | ");
        let heads: Vec<&str> = ticked(first).into_iter().filter_map(|name| name.strip_prefix("src/")).collect();
        let folder = heads.first().filter(|head| head.ends_with('/')).copied();
        for head in &heads {
            if head.ends_with(".rs") {
                named.insert(head.to_string());
            }
        }
        let Some(folder) = folder else { continue };
        for name in ticked(first).into_iter().chain(ticked(&rest)) {
            let plain = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '/' || c == '.');
            if !plain || !name.ends_with(".rs") || name.starts_with("src/") || name.starts_with("tests/") {
                continue;
            }
            // `engine/run/spans.rs` in another folder's row names it from
            // `src/`; `http/conn.rs` in `src/transport/`'s, from the row's.
            let top = name.split('/').next().unwrap_or_default();
            let from_src = name.contains('/') && !folder.contains(&format!("{top}/")) && src_dir().join(top).is_dir();
            named.insert(if from_src { name.to_string() } else { format!("{folder}{name}") });
        }
    }
    named
}

/// The texts between backticks on a line.
fn ticked(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

#[test]
fn the_architecture_doc_names_every_source_file_and_only_those() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md")).expect("docs/architecture.md");
    let named = files_the_layout_names(&doc);
    let src = src_dir();
    let existing: BTreeSet<String> =
        source_files().iter().map(|path| path.strip_prefix(&src).expect("under src").display().to_string()).collect();
    let missing: Vec<_> = named.difference(&existing).collect();
    let unnamed: Vec<_> = existing.difference(&named).collect();
    assert!(
        missing.is_empty() && unnamed.is_empty(),
        "docs/architecture.md's module table (a row per folder, its files in backticks) is out of date:\n  names files that do not exist: {missing:?}\n  misses files that do: {unnamed:?}"
    );
}

// The folder check's own cases, on small synthetic trees.

/// The circles of a synthetic tree, each by its first line (the path of files).
fn circles_in(files: &[(&str, &str)]) -> Vec<String> {
    circles(&edges_of(files)).into_iter().map(|circle| circle.lines().next().unwrap_or_default().to_string()).collect()
}

/// The folder edges of a synthetic tree, as `folder: from → to`.
fn edges_in(files: &[(&str, &str)]) -> Vec<String> {
    edges_of(files).into_iter().map(|edge| format!("{}: {} → {}", edge.folder, edge.from, edge.to)).collect()
}

fn edges_of(files: &[(&str, &str)]) -> Vec<FolderEdge> {
    let sources: Vec<(String, String)> = files.iter().map(|(file, text)| (file.to_string(), text.to_string())).collect();
    folder_edges(&sources)
}

const ENGINE_ROOT: (&str, &str) = ("engine/mod.rs", "pub mod a;\npub mod b;\npub mod c;\n");
const CRATE_ROOT: (&str, &str) = ("lib.rs", "pub mod engine;\npub mod transport;\n");

#[test]
fn a_circle_of_three_siblings_is_named_as_a_path() {
    let files = [
        CRATE_ROOT,
        ENGINE_ROOT,
        ("engine/a.rs", "use crate::engine::b::View;"),
        ("engine/b.rs", "use crate::engine::c::Finished;"),
        ("engine/c.rs", "use crate::engine::a::Wording;"),
    ];
    assert_eq!(circles_in(&files), ["src/engine/: a.rs → b.rs → c.rs → a.rs"]);
}

#[test]
fn two_circles_through_one_file_are_both_named() {
    let files = [
        CRATE_ROOT,
        ENGINE_ROOT,
        ("engine/a.rs", "use crate::engine::b::View;\nuse crate::engine::c::Recorded;"),
        ("engine/b.rs", "use crate::engine::a::Wording;"),
        ("engine/c.rs", "fn f(backend: &dyn crate::engine::a::Backend) {}"),
    ];
    assert_eq!(circles_in(&files), ["src/engine/: a.rs → b.rs → a.rs", "src/engine/: a.rs → c.rs → a.rs"]);
}

#[test]
fn imports_that_point_one_way_are_no_circle() {
    let files = [
        CRATE_ROOT,
        ENGINE_ROOT,
        ("engine/a.rs", "use crate::engine::b::View;\nuse crate::engine::c;"),
        ("engine/b.rs", "use crate::engine::c::Finished;"),
        ("engine/c.rs", "use crate::log;"),
    ];
    assert_eq!(edges_in(&files), ["engine: a.rs → b.rs", "engine: a.rs → c.rs", "engine: b.rs → c.rs"]);
    assert_eq!(circles_in(&files), Vec::<String>::new());
}

#[test]
fn super_and_self_paths_resolve_from_the_naming_file() {
    let module = |path: &str| path.split('/').map(str::to_string).collect::<Vec<_>>();
    let paths = |code: &str, file_module: &str| -> Vec<String> {
        absolute_paths(code, &module(file_module)).into_iter().map(|path| path.join("::")).collect()
    };
    assert_eq!(
        paths("use super::conn::{self, Response};", "transport/http/mcp"),
        ["transport::http::conn", "transport::http::conn::Response"]
    );
    assert_eq!(
        paths("use super::{BUDGET_WAIT, HttpState};", "transport/http/mcp"),
        ["transport::http::BUDGET_WAIT", "transport::http::HttpState"]
    );
    assert_eq!(paths("fn f() { super::super::stdio::serve() }", "transport/http/mcp"), ["transport::stdio::serve"]);
    assert_eq!(paths("let n = self::usage(path);", "runner/disk"), ["runner::disk::usage"]);
    // `main.rs` names the library by its name.
    assert_eq!(paths("use mcp_k8s_ephemeral_job::{engine, tools::Ctx};", ""), ["engine", "tools::Ctx"]);
    // In a `mod.rs`, `super` is the folder's parent.
    assert_eq!(paths("use super::stdio::X;", "transport"), ["stdio::X"]);
    // A bare path is relative to the file's module: a `mod.rs` names its
    // child so; `Self::` and `std::` stay under the file itself and so name
    // no other file; a method named `self_test` is no path.
    assert_eq!(paths("fn f() { modern::complete(x) }", "protocol"), ["protocol::modern::complete"]);
    assert_eq!(
        paths("Self::new(); x.self_test(); use std::io::{self, Read};", "engine/a"),
        ["engine::a::Self::new", "engine::a::std::io", "engine::a::std::io::Read"]
    );
}

#[test]
fn grouped_uses_and_inline_paths_name_each_file() {
    let files = [
        CRATE_ROOT,
        ("engine/mod.rs", "pub mod backend;\npub mod decide;\npub mod spec;\npub mod run;\n"),
        ("engine/run.rs", "use crate::engine::{backend::{Backend, Stop}, decide, spec::{self, RunSpec as Spec}};"),
        ("engine/backend.rs", "fn f() -> bool { crate::engine::run::follow() }"),
        ("engine/decide.rs", "use super::spec::RunReason;"),
        ("engine/spec.rs", ""),
    ];
    assert_eq!(
        edges_in(&files),
        [
            "engine: backend.rs → run.rs",
            "engine: decide.rs → spec.rs",
            "engine: run.rs → backend.rs",
            "engine: run.rs → decide.rs",
            "engine: run.rs → spec.rs"
        ]
    );
    assert_eq!(circles_in(&files), ["src/engine/: backend.rs → run.rs → backend.rs"]);
}

#[test]
fn test_items_and_test_only_files_are_no_edges() {
    let files = [
        CRATE_ROOT,
        ("engine/mod.rs", "pub mod a;\npub mod b;\n#[cfg(test)]\nmod tests;\n"),
        ("engine/a.rs", "use crate::engine::b::View;\n"),
        (
            "engine/b.rs",
            "pub struct View;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::engine::a::helper;\n    fn t() { let x = [1, 2]; }\n}\n#[cfg(test)]\nuse crate::engine::a::Other;\n",
        ),
        ("engine/tests.rs", "use crate::engine::a::X;\nuse crate::engine::b::Y;\n"),
    ];
    assert_eq!(edges_in(&files), ["engine: a.rs → b.rs"]);
    assert_eq!(circles_in(&files), Vec::<String>::new());
}

#[test]
fn a_mod_rs_with_its_children_is_no_circle() {
    let files = [
        CRATE_ROOT,
        ("engine/mod.rs", "pub mod a;\npub mod b;\npub use a::Thing;\npub struct Shared;\nfn f() { a::run(); b::run(); }\n"),
        ("engine/a.rs", "use super::Shared;\n"),
        ("engine/b.rs", "use crate::engine::Shared;\n"),
    ];
    assert_eq!(edges_in(&files), Vec::<String>::new());
}

#[test]
fn a_subfolder_is_one_node_of_its_parent_folder() {
    let files = [
        CRATE_ROOT,
        ("transport/mod.rs", "pub mod http;\npub mod stdio;\n"),
        ("transport/stdio.rs", "use crate::transport::http::conn::Conn;\n"),
        ("transport/http/mod.rs", "mod conn;\nmod routes;\n"),
        ("transport/http/conn.rs", "use super::routes::answer;\n"),
        ("transport/http/routes.rs", "use super::super::stdio::serve;\nuse super::conn::Conn;\n"),
    ];
    assert_eq!(circles_in(&files), ["src/transport/: http/ → stdio.rs → http/", "src/transport/http/: conn.rs → routes.rs → conn.rs"]);
}

/// Where a run call's arguments are read: `call_args` parses a run call
/// once, and no tool rewrites a call's arguments (takes `site`, `sandbox`
/// or `idempotency_key` off them, or writes an `image` found elsewhere
/// back) for a later check to read. A tool reads the call-level arguments
/// through `call_args` (`site`, `sandbox_id`), and the key through it too.
#[test]
fn a_run_call_is_parsed_once_in_call_args() {
    let tools = src_dir().join("tools");
    let mut violations = Vec::new();
    for path in source_files().into_iter().filter(|path| path.starts_with(&tools)) {
        let name = path.strip_prefix(&tools).unwrap_or(&path).to_string_lossy().into_owned();
        if name == "call_args.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable source");
        let shipped = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = shipped.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
        let mut needles = vec![
            // Arguments carried half-peeled, borrowed until something is taken off.
            "Cow",
            ".into_owned()",
            // A call-level argument taken off, written back or read outside the one parse.
            ".remove(\"",
            ".remove(ARGUMENT",
            ".remove(idempotency::ARGUMENT",
            ".insert(\"site\"",
            ".insert(\"sandbox\"",
            "(\"site\")",
            "(\"sandbox\")",
            "(\"idempotency_key\")",
            "(idempotency::ARGUMENT)",
            "idempotency::key(",
        ];
        if name != "idempotency.rs" {
            needles.push("(ARGUMENT)");
        }
        for needle in needles {
            if code.contains(needle) {
                violations.push(format!("src/tools/{name} has `{needle}`"));
            }
        }
    }
    assert!(violations.is_empty(), "a run call's arguments are read outside call_args, or rewritten:\n{}", violations.join("\n"));
}
