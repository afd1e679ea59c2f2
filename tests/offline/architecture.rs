//! Keeps the layout honest: every source file states its job in a `//!`
//! header, and imports point one way (transport → protocol → tools → engine
//! → kube; runner stands alone).

use std::path::{Path, PathBuf};

fn source_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
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

fn module_of(path: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let relative = path.strip_prefix(&src).expect("under src");
    let first = relative.components().next().expect("non-empty path");
    first.as_os_str().to_string_lossy().trim_end_matches(".rs").to_string()
}

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
fn imports_point_one_way() {
    // Each layer may use the layers after it, never the ones before it.
    let forbidden: &[(&str, &[&str])] = &[
        ("kube", &["engine", "tools", "protocol", "transport", "runner"]),
        ("engine", &["tools", "protocol", "transport"]),
        ("tools", &["protocol", "transport"]),
        ("protocol", &["transport"]),
        ("runner", &["kube", "engine", "tools", "protocol", "transport"]),
    ];
    let mut violations = Vec::new();
    for path in source_files() {
        let module = module_of(&path);
        let Some((_, banned)) = forbidden.iter().find(|(name, _)| *name == module) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("readable source");
        for banned_module in banned.iter() {
            if text.contains(&format!("crate::{banned_module}")) {
                violations.push(format!("{} uses crate::{banned_module}", path.display()));
            }
        }
    }
    assert!(violations.is_empty(), "layering violations: {violations:#?}");
}
