//! Reassembles the runner's frames, read line by line from the followed
//! container log, into live output and a final result, with memory bounded
//! by the configured caps whatever the log contains. The first frame's tag
//! is the run's (the runner writes it before the command exists); a frame
//! with another tag was written by something else and is ignored.

use std::io::BufRead;

use crate::engine::port::spec::Artifact;
use crate::outputs::Spool;
use crate::sandbox::frame::{self, Frame, Held, MAX_LINE_BYTES, RunResult, Stream, Tag};

/// The note for frames that do not carry the run's tag.
const IMITATION_NOTE: &str = "ignored log lines shaped like the runner's frames but without this run's tag: \
     something in the sandbox wrote them past the runner, so they are not part of this result";

/// Room for the runner's "bytes omitted" marker on top of the output cap.
const CAPTURE_MARKER_SLACK: usize = 256;

/// New live output from one frame, for progress notifications.
#[derive(Debug, PartialEq)]
pub struct LiveChunk {
    pub stream: Stream,
    pub bytes: Vec<u8>,
}

/// What has been read so far.
pub struct Collector {
    max_output_bytes: usize,
    max_artifact_bytes: u64,
    pub started_at_ms: Option<u64>,
    pub live_stdout: Vec<u8>,
    pub live_stderr: Vec<u8>,
    /// The final head-and-tail capture of each stream, from `Captured`.
    pub captured_stdout: Vec<u8>,
    pub captured_stderr: Vec<u8>,
    pub artifacts: Vec<Artifact>,
    artifact_bytes: u64,
    pub result: Option<RunResult>,
    /// The command had ended, and how, before the runner collected its
    /// output and files (`Frame::Ended`).
    pub ended: Option<frame::Ended>,
    /// Problems with the log itself (bad frames, overlong lines).
    pub problems: Vec<String>,
    /// The run's tag, from the first frame (or known before it: a session
    /// call's, `for_call`).
    tag: Option<Tag>,
    /// Frames of other tags are other calls' in the same sandbox, not
    /// imitations: skipped without a note.
    others_are_calls: bool,
    /// Where `Spill` frames and files sent whole go (the output store):
    /// straight to disk, never into memory. Without one they are dropped.
    pub spool: Option<Spool>,
    /// The runner holds what it sent whole in the sandbox, to be fetched
    /// (`sandbox::held`); taken by the reader that fetches it.
    pub held: Option<Held>,
    /// How far into the log this reading got, in bytes: a log read again
    /// from its start that gets further was still being written.
    pub log_bytes: u64,
}

impl Collector {
    pub fn new(max_output_bytes: u64, max_artifact_bytes: u64) -> Collector {
        Collector {
            max_output_bytes: max_output_bytes as usize,
            max_artifact_bytes,
            started_at_ms: None,
            live_stdout: Vec::new(),
            live_stderr: Vec::new(),
            captured_stdout: Vec::new(),
            captured_stderr: Vec::new(),
            artifacts: Vec::new(),
            artifact_bytes: 0,
            result: None,
            ended: None,
            problems: Vec::new(),
            tag: None,
            others_are_calls: false,
            spool: None,
            held: None,
            log_bytes: 0,
        }
    }

    /// A call in an open sandbox: the server chose its tag, and the
    /// sandbox's output carries other calls' frames too.
    pub fn for_call(max_output_bytes: u64, max_artifact_bytes: u64, tag: Tag) -> Collector {
        Collector { tag: Some(tag), others_are_calls: true, ..Collector::new(max_output_bytes, max_artifact_bytes) }
    }

    /// Takes one log line; returns live output it carried, if any.
    pub fn push_line(&mut self, line: &str) -> Option<LiveChunk> {
        let (tag, frame) = match frame::decode(line) {
            Ok(Some(decoded)) => decoded,
            Ok(None) => return None,
            // Once the run's first frame is in, a line of another version
            // is not a stale runner's: the runner wrote one already.
            Err(frame::DecodeError::UnknownVersion(_)) if self.tag.is_some() => {
                if !self.others_are_calls {
                    self.note_problem(IMITATION_NOTE.to_string());
                }
                return None;
            }
            Err(error) => {
                self.note_problem(error.to_string());
                return None;
            }
        };
        if *self.tag.get_or_insert(tag) != tag {
            if !self.others_are_calls {
                self.note_problem(IMITATION_NOTE.to_string());
            }
            return None;
        }
        match frame {
            Frame::Started(started) => self.started_at_ms = Some(started.started_at_ms),
            Frame::Output(output) => return self.push_output(output.stream, &output.data_b64),
            Frame::Captured(output) => self.push_captured(output.stream, &output.data_b64),
            Frame::Artifact(header) => {
                // The header says how much follows: one allocation of that
                // size (within the cap) instead of doubling, which left up
                // to twice the artifact resident.
                let room = self.max_artifact_bytes.saturating_sub(self.artifact_bytes).min(header.size);
                let content = header.content_included.then(|| Vec::with_capacity(usize::try_from(room).unwrap_or(0)));
                if let Some(spool) = self.spool.as_mut() {
                    match header.spilled && !header.content_included {
                        true => spool.file_start(&header.path, header.size),
                        false => spool.file_end(),
                    }
                }
                self.artifacts.push(Artifact { path: header.path, size: header.size, mode: header.mode, sha256: header.sha256, content });
            }
            Frame::ArtifactChunk(chunk) => self.push_artifact_chunk(&chunk.data_b64),
            Frame::Spill(chunk) => self.push_spill(chunk.stream, chunk.offset, &chunk.data_b64),
            Frame::Held(held) => self.held = Some(held),
            Frame::Ended(ended) => self.ended = Some(ended),
            Frame::Result(result) => self.result = Some(result),
        }
        None
    }

    /// Reads the frames the runner held in the sandbox into the spool:
    /// only what the log would have carried for the store (`Spill`, and
    /// the files sent whole, header and chunks), with the run's tag. The
    /// held file is writable from the sandbox, so anything else there
    /// (a result, live output) is not the runner's and is ignored.
    /// `consumed` counts the bytes of the whole lines read, so that a
    /// fetch cut off is resumed where its last whole frame ended.
    pub fn read_held(&mut self, reader: &mut dyn BufRead, consumed: &mut u64) -> std::io::Result<()> {
        let mut line = Vec::new();
        let mut ignored = false;
        let outcome = loop {
            line.clear();
            let (read, complete) = match read_line_bounded(reader, &mut line, MAX_LINE_BYTES) {
                Ok(read) => read,
                Err(error) => break Err(error),
            };
            if read == 0 {
                break Ok(());
            }
            // A last line without its newline (its newline is read but not
            // kept) is a cut: it is fetched again from its start.
            if complete && read == line.len() {
                break Ok(());
            }
            *consumed += read as u64;
            let decoded = match complete {
                true => frame::decode(&String::from_utf8_lossy(&line)).ok().flatten(),
                false => None,
            };
            let Some(spool) = self.spool.as_mut() else { continue };
            match decoded {
                Some((tag, Frame::Spill(chunk))) if Some(tag) == self.tag => match frame::from_base64(&chunk.data_b64) {
                    Ok(bytes) => spool.stream(chunk.stream, chunk.offset, &bytes),
                    Err(_) => ignored = true,
                },
                Some((tag, Frame::Artifact(header))) if Some(tag) == self.tag && header.spilled => {
                    spool.file_start(&header.path, header.size)
                }
                Some((tag, Frame::ArtifactChunk(chunk))) if Some(tag) == self.tag => match frame::from_base64(&chunk.data_b64) {
                    Ok(bytes) => spool.file_chunk(&bytes),
                    Err(_) => ignored = true,
                },
                _ => {
                    spool.file_end();
                    ignored = true;
                }
            }
        };
        if ignored {
            self.note_problem(
                "ignored lines in the output held in the sandbox that were not the runner's frames of this run: something in the sandbox wrote them"
                    .into(),
            );
        }
        outcome
    }

    /// Reads `reader` until the result frame (always the runner's last), a
    /// `Held` frame (the caller fetches, then reads on) or the end, feeding
    /// lines. `on_live` gets each live chunk as it arrives.
    /// Stopping at the result instead of waiting for the stream to end saves
    /// the kubelet's delay in noticing that the container exited.
    pub fn read_all(&mut self, reader: &mut dyn BufRead, on_live: &mut dyn FnMut(LiveChunk)) -> std::io::Result<()> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let (read, complete) = read_line_bounded(reader, &mut line, MAX_LINE_BYTES)?;
            if read == 0 {
                return Ok(());
            }
            self.log_bytes += read as u64;
            if !complete {
                self.note_problem(format!("skipped a log line longer than {MAX_LINE_BYTES} bytes"));
                continue;
            }
            let text = String::from_utf8_lossy(&line);
            if let Some(chunk) = self.push_line(&text) {
                on_live(chunk);
            }
            if self.result.is_some() || self.held.is_some() {
                return Ok(());
            }
        }
    }

    fn push_output(&mut self, stream: Stream, data_b64: &str) -> Option<LiveChunk> {
        let bytes = match frame::from_base64(data_b64) {
            Ok(bytes) => bytes,
            Err(error) => {
                self.note_problem(error.to_string());
                return None;
            }
        };
        let kept = match stream {
            Stream::Stdout => &mut self.live_stdout,
            Stream::Stderr => &mut self.live_stderr,
        };
        let room = self.max_output_bytes.saturating_sub(kept.len());
        let bytes = bytes[..bytes.len().min(room)].to_vec();
        if bytes.is_empty() {
            return None;
        }
        kept.extend_from_slice(&bytes);
        Some(LiveChunk { stream, bytes })
    }

    fn push_captured(&mut self, stream: Stream, data_b64: &str) {
        let bytes = match frame::from_base64(data_b64) {
            Ok(bytes) => bytes,
            Err(error) => return self.note_problem(error.to_string()),
        };
        let kept = match stream {
            Stream::Stdout => &mut self.captured_stdout,
            Stream::Stderr => &mut self.captured_stderr,
        };
        // The capture is the cap plus the runner's one-line marker.
        let room = (self.max_output_bytes + CAPTURE_MARKER_SLACK).saturating_sub(kept.len());
        if bytes.len() > room {
            return self.note_problem("captured output beyond the cap was dropped".into());
        }
        kept.extend_from_slice(&bytes);
    }

    fn push_spill(&mut self, stream: Stream, offset: u64, data_b64: &str) {
        let Some(spool) = self.spool.as_mut() else { return };
        match frame::from_base64(data_b64) {
            Ok(bytes) => spool.stream(stream, offset, &bytes),
            Err(error) => self.note_problem(error.to_string()),
        }
    }

    fn push_artifact_chunk(&mut self, data_b64: &str) {
        let bytes = match frame::from_base64(data_b64) {
            Ok(bytes) => bytes,
            Err(error) => return self.note_problem(error.to_string()),
        };
        // A file sent whole goes to the store; its header carried no
        // content to fill.
        if let Some(Artifact { content: None, .. }) = self.artifacts.last() {
            if let Some(spool) = self.spool.as_mut() {
                spool.file_chunk(&bytes);
            }
            return;
        }
        let Some(Some(content)) = self.artifacts.last_mut().map(|artifact| artifact.content.as_mut()) else {
            return self.note_problem("artifact data without an artifact header".into());
        };
        if self.artifact_bytes + bytes.len() as u64 > self.max_artifact_bytes {
            // The runner enforces the cap; this guards the server's memory
            // against a log that claims otherwise.
            if let Some(artifact) = self.artifacts.last_mut() {
                artifact.content = None;
            }
            return self.note_problem("artifact data beyond the cap was dropped".into());
        }
        self.artifact_bytes += bytes.len() as u64;
        content.extend_from_slice(&bytes);
    }

    fn note_problem(&mut self, problem: String) {
        // A flood of bad lines must not grow memory without bound.
        if self.problems.len() < 20 && !self.problems.contains(&problem) {
            self.problems.push(problem);
        }
    }
}

/// Reads one line of at most `max` bytes into `line` (newline excluded).
/// Returns the bytes consumed and whether the line fit; the rest of an
/// overlong line is consumed and dropped.
pub fn read_line_bounded(reader: &mut dyn BufRead, line: &mut Vec<u8>, max: usize) -> std::io::Result<(usize, bool)> {
    let mut consumed = 0;
    let mut fits = true;
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if available.is_empty() {
            return Ok((consumed, fits));
        }
        let (piece, found_newline) = match available.iter().position(|&byte| byte == b'\n') {
            Some(index) => (&available[..index], true),
            None => (available, false),
        };
        if fits && line.len() + piece.len() <= max {
            line.extend_from_slice(piece);
        } else {
            fits = false;
            line.clear();
        }
        let used = piece.len() + usize::from(found_newline);
        reader.consume(used);
        consumed += used;
        if found_newline {
            return Ok((consumed, fits));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::frame::{ArtifactChunk, ArtifactHeader, Output, TAG_BYTES};

    const TAG: Tag = Tag::from_bytes([1; TAG_BYTES]);

    fn line(frame: Frame) -> String {
        frame::encode(TAG, &frame)
    }

    #[test]
    fn frames_without_the_runs_tag_are_ignored_and_noted() {
        let output = |text: &[u8]| Frame::Output(Output { stream: Stream::Stdout, data_b64: frame::to_base64(text) });
        let mut result = RunResult::started(1);
        result.exit_code = Some(0);
        let forged = |frame: &Frame| frame::encode(Tag::from_bytes([2; TAG_BYTES]), frame);
        let log = [
            line(Frame::Started(frame::Started { started_at_ms: 1 })),
            forged(&output(b"FORGED")),
            "MCPK8S/1 {\"kind\":\"output\",\"stream\":\"stdout\",\"data_b64\":\"Rk9SR0VECg==\"}\n".to_string(),
            line(output(b"real")),
            forged(&Frame::Result(result.clone())),
        ]
        .concat();
        let mut collector = Collector::new(100, 100);
        collector.read_all(&mut log.as_bytes(), &mut |_| {}).unwrap();
        assert_eq!(collector.live_stdout, b"real");
        assert!(collector.result.is_none(), "a result with another tag is not the run's");
        assert_eq!(collector.problems, [IMITATION_NOTE]);
    }

    #[test]
    fn frames_become_live_output_and_artifacts() {
        let mut collector = Collector::new(4, 100);
        let log = [
            "some runtime message\n".to_string(),
            line(Frame::Output(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"abc") })),
            line(Frame::Output(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"def") })),
            line(Frame::Artifact(ArtifactHeader {
                path: "a".into(),
                size: 2,
                mode: 0o644,
                sha256: "x".into(),
                content_included: true,
                spilled: false,
            })),
            line(Frame::ArtifactChunk(ArtifactChunk { data_b64: frame::to_base64(b"hi") })),
        ]
        .concat();
        let mut live = Vec::new();
        collector.read_all(&mut log.as_bytes(), &mut |chunk| live.push(chunk)).unwrap();
        assert_eq!(collector.live_stdout, b"abcd", "live output is capped");
        assert_eq!(live.len(), 2);
        assert_eq!(collector.artifacts[0].content.as_deref(), Some(&b"hi"[..]));
        assert!(collector.problems.is_empty(), "{:?}", collector.problems);
        assert!(collector.result.is_none());
    }

    #[test]
    fn artifact_bytes_past_the_cap_are_dropped_and_noted() {
        let mut collector = Collector::new(10, 3);
        collector.push_line(&line(Frame::Artifact(ArtifactHeader {
            path: "a".into(),
            size: 5,
            mode: 0,
            sha256: "x".into(),
            content_included: true,
            spilled: false,
        })));
        collector.push_line(&line(Frame::ArtifactChunk(ArtifactChunk { data_b64: frame::to_base64(b"12345") })));
        assert_eq!(collector.artifacts[0].content, None);
        assert_eq!(collector.problems.len(), 1);
    }

    #[test]
    fn spilled_streams_and_files_go_to_the_store_not_to_memory() {
        use crate::outputs::{Spool, Store};
        let dir = std::env::temp_dir().join(format!("mcp-collect-spill-{}", std::process::id()));
        let store = Store::new(&dir, 1 << 20, 1 << 20, std::time::Duration::from_secs(60));
        store.prepare().unwrap();
        let store = std::sync::Arc::new(store);
        let run = "00000000000000000000000000000001";
        let mut collector = Collector::new(4, 4);
        collector.spool = Some(Spool::new(store.clone(), run, None));
        let spill =
            |offset, text: &[u8]| Frame::Spill(frame::SpillChunk { stream: Stream::Stderr, offset, data_b64: frame::to_base64(text) });
        let header = |path: &str, included, spilled| {
            Frame::Artifact(ArtifactHeader {
                path: path.into(),
                size: 6,
                mode: 0o644,
                sha256: "x".into(),
                content_included: included,
                spilled,
            })
        };
        let chunk = |text: &[u8]| Frame::ArtifactChunk(ArtifactChunk { data_b64: frame::to_base64(text) });
        for frame in [
            spill(0, b"hello "),
            spill(6, b"world"),
            header("big.bin", false, true),
            chunk(b"abc"),
            chunk(b"def"),
            header("listed.bin", false, false),
        ] {
            collector.push_line(&line(frame));
        }
        assert!(collector.problems.is_empty(), "{:?}", collector.problems);
        assert_eq!(collector.artifacts.iter().map(|artifact| artifact.content.clone()).collect::<Vec<_>>(), vec![None, None]);
        let (links, note) = collector.spool.take().unwrap().finish(Some([0, 11]), std::time::SystemTime::now());
        assert_eq!(note, None);
        let read = |uri: &str| store.read(&crate::outputs::parse_uri(uri).unwrap(), std::time::SystemTime::now(), None).unwrap().bytes;
        assert_eq!(links.iter().map(|link| link.name.as_str()).collect::<Vec<_>>(), ["stderr", "big.bin"]);
        assert_eq!(read(&links[0].uri), b"hello world");
        assert_eq!(read(&links[1].uri), b"abcdef");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_log_stops_at_held_output_and_the_held_frames_fill_the_spool_but_nothing_else() {
        use crate::outputs::{Spool, Store};
        let dir = std::env::temp_dir().join(format!("mcp-collect-held-{}", std::process::id()));
        let store = Store::new(&dir, 1 << 20, 1 << 20, std::time::Duration::from_secs(60));
        store.prepare().unwrap();
        let store = std::sync::Arc::new(store);
        let mut collector = Collector::new(4, 4);
        collector.spool = Some(Spool::new(store.clone(), "00000000000000000000000000000002", None));
        let started = line(Frame::Started(frame::Started { started_at_ms: 1 }));
        let held = line(Frame::Held(Held { port: 7777, bytes: 99 }));
        let result = line(Frame::Result(RunResult::started(1)));
        let log = format!("{started}{held}{result}");
        let mut reader = log.as_bytes();
        collector.read_all(&mut reader, &mut |_| {}).unwrap();
        assert_eq!(collector.held.take(), Some(Held { port: 7777, bytes: 99 }), "the reader stops at Held to fetch");
        assert!(collector.result.is_none(), "the result comes after the fetch");
        let spill = |offset, text: &[u8]| {
            line(Frame::Spill(frame::SpillChunk { stream: Stream::Stdout, offset, data_b64: frame::to_base64(text) }))
        };
        let mut forged_result = RunResult::started(1);
        forged_result.exit_code = Some(0);
        let other_tag = frame::encode(
            Tag::from_bytes([9; frame::TAG_BYTES]),
            &Frame::Spill(frame::SpillChunk { stream: Stream::Stdout, offset: 0, data_b64: frame::to_base64(b"FORGED") }),
        );
        let frames = [spill(0, b"whole "), line(Frame::Result(forged_result)), other_tag, spill(6, b"text")].concat();
        let mut consumed = 0;
        collector.read_held(&mut frames.as_bytes(), &mut consumed).unwrap();
        assert_eq!(consumed, frames.len() as u64, "whole lines are counted");
        let mut cut = 0;
        let cut_short = &frames[..frames.len() - 3];
        collector.read_held(&mut cut_short.as_bytes(), &mut cut).unwrap();
        assert_eq!(cut, (frames.len() - frames.lines().last().unwrap().len() - 1) as u64, "a last line without its newline is not counted");
        assert!(collector.result.is_none(), "a result in the held file is not the runner's");
        assert_eq!(collector.problems.len(), 1, "{:?}", collector.problems);
        collector.read_all(&mut reader, &mut |_| {}).unwrap();
        assert!(collector.result.is_some(), "then the log goes on to the result");
        let (links, _) = collector.spool.take().unwrap().finish(Some([10, 0]), std::time::SystemTime::now());
        let piece = store.read(&crate::outputs::parse_uri(&links[0].uri).unwrap(), std::time::SystemTime::now(), None).unwrap();
        assert_eq!(piece.bytes, b"whole text");
        assert!(links[0].complete);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn overlong_lines_are_skipped_whole() {
        let text = format!("{}\nnext\n", "x".repeat(50));
        let mut reader = text.as_bytes();
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut reader, &mut line, 10).unwrap(), (51, false));
        line.clear();
        assert_eq!(read_line_bounded(&mut reader, &mut line, 10).unwrap(), (5, true));
        assert_eq!(line, b"next");
    }
}
