//! The inputs manifest: how the caller's input files travel from the engine
//! to `runner init`. A Secret cannot use file paths as keys (keys are
//! `[-._a-zA-Z0-9]+`), so it holds `manifest.json` (a list of `InputFile`)
//! and one key per file's contents (`content_key`). The engine writes this
//! layout and the runner reads it; neither knows how the other side stores
//! or writes the files.

use serde::{Deserialize, Serialize};

/// Name of the manifest key next to the contents.
pub const MANIFEST_KEY: &str = "manifest.json";

/// One input file: which key holds its bytes, where it goes under the
/// workdir, and its permission bits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputFile {
    pub key: String,
    pub path: String,
    pub mode: u32,
}

/// The key holding the contents of the `index`th input file.
pub fn content_key(index: usize) -> String {
    format!("f{index}")
}

/// The manifest as stored under `MANIFEST_KEY`.
pub fn encode_manifest(files: &[InputFile]) -> Vec<u8> {
    // A list of plain structs always serializes; the fallback is never used.
    serde_json::to_vec(files).unwrap_or_default()
}

/// The inverse of `encode_manifest`.
pub fn decode_manifest(bytes: &[u8]) -> Result<Vec<InputFile>, String> {
    serde_json::from_slice(bytes).map_err(|error| format!("input manifest is not valid: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_round_trips() {
        let files = vec![
            InputFile { key: content_key(0), path: "main.py".into(), mode: 0o644 },
            InputFile { key: content_key(1), path: "bin/run.sh".into(), mode: 0o755 },
        ];
        let bytes = encode_manifest(&files);
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            r#"[{"key":"f0","path":"main.py","mode":420},{"key":"f1","path":"bin/run.sh","mode":493}]"#
        );
        assert_eq!(decode_manifest(&bytes), Ok(files));
        assert!(decode_manifest(b"{").is_err());
    }
}
