//! Bounded capture of one output stream: keeps the head and the tail within
//! a byte cap (the end of a log usually holds the error), counts what was
//! dropped, and forwards a capped live copy as frames while the command runs.
//! With an output store (`--spill-bytes`), a stream that outgrows the cap is
//! also sent whole, as `Spill` frames, from the moment it does: what it held
//! so far first, then each new read, so output under the cap costs nothing
//! extra and none of it waits on the sandbox's disk.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sandbox::frame::{self, Frame, Output, SpillChunk, Stream, TAG_BYTES, Tag};

/// Head and tail of a byte stream under a total cap.
///
/// The first half of the cap is kept as the head; after that the most recent
/// bytes are kept in a ring as the tail. While the total stays within the cap
/// nothing is dropped and `contents` returns the stream exactly.
pub struct HeadTail {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl HeadTail {
    pub fn new(cap: usize) -> HeadTail {
        HeadTail { cap, head: Vec::new(), tail: VecDeque::new(), total: 0 }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let head_cap = self.cap / 2;
        if self.head.len() < head_cap {
            let taken = bytes.len().min(head_cap - self.head.len());
            self.head.extend_from_slice(&bytes[..taken]);
            bytes = &bytes[taken..];
        }
        let tail_cap = self.cap - head_cap;
        if bytes.len() >= tail_cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    pub fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The whole stream so far, while nothing has been dropped.
    fn whole(&self) -> Option<Vec<u8>> {
        (!self.truncated()).then(|| self.head.iter().chain(self.tail.iter()).copied().collect())
    }

    /// The kept bytes; when something was dropped, a marker line saying how
    /// much stands between head and tail.
    pub fn contents(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        if self.truncated() {
            let dropped = self.total - (self.head.len() + self.tail.len()) as u64;
            out.extend_from_slice(format!("\n[mcp-k8s-ephemeral-job: {dropped} bytes omitted]\n").as_bytes());
        }
        out.extend(self.tail.iter());
        out
    }
}

/// Where frames go: the runner's stdout, shared by both stream readers and
/// the main thread, each frame stamped with the run's tag. A write error
/// (the log pipe closed) is dropped, since there is nobody to report it to.
#[derive(Clone)]
pub struct FrameSink {
    tag: Tag,
    out: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl FrameSink {
    /// The runner's stdout, with a fresh tag.
    pub fn stdout() -> Result<FrameSink, String> {
        Ok(FrameSink { tag: Tag::random()?, out: Arc::new(Mutex::new(Box::new(std::io::stdout()))) })
    }

    /// A session call's frames: `tag` is the one the server chose.
    pub fn tagged(tag: Tag, out: Box<dyn Write + Send>) -> FrameSink {
        FrameSink { tag, out: Arc::new(Mutex::new(out)) }
    }

    /// Frames of this sink's run (its tag) written to `out` instead.
    pub fn same_run_to(&self, out: Box<dyn Write + Send>) -> FrameSink {
        FrameSink { tag: self.tag, out: Arc::new(Mutex::new(out)) }
    }
}

/// A sink that keeps the frames in memory, with the buffer to read them
/// back: how the runner's tests (and any caller that wants the frames as
/// bytes) see exactly what would reach the container log.
pub fn memory_sink() -> (FrameSink, Arc<Mutex<Vec<u8>>>) {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let out: Box<dyn Write + Send> = Box::new(MemoryWriter(buffer.clone()));
    (FrameSink { tag: Tag::from_bytes([0; TAG_BYTES]), out: Arc::new(Mutex::new(out)) }, buffer)
}

struct MemoryWriter(Arc<Mutex<Vec<u8>>>);

impl Write for MemoryWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the runner may still send whole for the output store, shared by
/// both streams and the files: the server's per-run limit.
#[derive(Clone)]
pub struct SpillBudget(Arc<AtomicU64>, Option<FrameSink>);

impl SpillBudget {
    pub fn new(bytes: u64) -> SpillBudget {
        SpillBudget(Arc::new(AtomicU64::new(bytes)), None)
    }

    /// A budget whose frames go to `held` (a file in the sandbox the
    /// server fetches, `sandbox::held`) instead of the log.
    pub fn held(bytes: u64, held: FrameSink) -> SpillBudget {
        SpillBudget(Arc::new(AtomicU64::new(bytes)), Some(held))
    }

    /// Where what is sent whole goes when it is held in the sandbox.
    pub fn held_sink(&self) -> Option<&FrameSink> {
        self.1.as_ref()
    }

    /// Takes up to `wanted` bytes; returns how many it got.
    pub fn take(&self, wanted: u64) -> u64 {
        let taken = self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| Some(left.saturating_sub(wanted)));
        taken.map_or(0, |left| left.min(wanted))
    }

    /// Takes `wanted` bytes only if all of them are left.
    pub fn take_whole(&self, wanted: u64) -> bool {
        self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(wanted)).is_ok()
    }
}

/// One stream's sending of its whole text: the budget, and the bytes sent
/// (the next offset), which the result reports.
pub struct StreamSpill {
    pub budget: SpillBudget,
    pub sent: Arc<AtomicU64>,
}

impl StreamSpill {
    /// Sends `bytes` as `Spill` frames at the next offset, as far as the
    /// budget goes.
    fn send(&self, sink: &FrameSink, stream: Stream, bytes: &[u8]) {
        let sink = self.budget.held_sink().unwrap_or(sink);
        let granted = self.budget.take(bytes.len() as u64) as usize;
        for chunk in bytes[..granted].chunks(frame::CHUNK_BYTES) {
            let offset = self.sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            write_frame(sink, &Frame::Spill(SpillChunk { stream, offset, data_b64: frame::to_base64(chunk) }));
        }
    }
}

pub fn write_frame(sink: &FrameSink, frame: &Frame) {
    let line = frame::encode(sink.tag, frame);
    if let Ok(mut out) = sink.out.lock() {
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }
}

/// Reads `source` to its end into `kept` (shared, so that what was read is
/// there even while a stray process holds the stream open), forwarding the
/// first `live_cap` bytes as `Output` frames as they arrive, and with
/// `spill`, the whole stream once it outgrows what `kept` holds.
pub fn pump(mut source: impl Read, stream: Stream, kept: &Mutex<HeadTail>, live_cap: usize, spill: Option<&StreamSpill>, sink: &FrameSink) {
    let mut live_sent = 0usize;
    let mut spilling = false;
    let mut buffer = vec![0u8; frame::CHUNK_BYTES];
    loop {
        let read = match source.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &buffer[..read];
        let so_far = {
            let mut kept = kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let crossing = spill.is_some() && !spilling && kept.total + chunk.len() as u64 > kept.cap as u64;
            let so_far = if crossing { kept.whole() } else { None };
            kept.push(chunk);
            so_far
        };
        if let Some(spill) = spill {
            if let Some(so_far) = so_far {
                spilling = true;
                spill.send(sink, stream, &so_far);
            }
            if spilling {
                spill.send(sink, stream, chunk);
            }
        }
        if live_sent < live_cap {
            let live = &chunk[..chunk.len().min(live_cap - live_sent)];
            live_sent += live.len();
            write_frame(sink, &Frame::Output(Output { stream, data_b64: frame::to_base64(live) }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(cap: usize, pushes: &[&[u8]]) -> (Vec<u8>, bool, u64) {
        let mut kept = HeadTail::new(cap);
        for bytes in pushes {
            kept.push(bytes);
        }
        (kept.contents(), kept.truncated(), kept.total_bytes())
    }

    #[test]
    fn within_the_cap_nothing_is_lost() {
        // (cap, pushes, expected contents)
        type Case<'a> = (usize, &'a [&'a [u8]], &'a [u8]);
        let cases: &[Case] = &[
            (10, &[b"abc"], b"abc"),
            (10, &[b"abcde", b"fghij"], b"abcdefghij"),
            (10, &[b"a", b"b", b"cdefghij"], b"abcdefghij"),
            (10, &[], b""),
        ];
        for (cap, pushes, expected) in cases {
            let (contents, truncated, _) = captured(*cap, pushes);
            assert_eq!(contents, *expected, "pushes {pushes:?}");
            assert!(!truncated);
        }
    }

    #[test]
    fn over_the_cap_head_and_tail_survive_with_a_marker() {
        let cases: &[(&[&[u8]], &str)] = &[
            (&[b"0123456789ABCDEF"], "01234\n[mcp-k8s-ephemeral-job: 6 bytes omitted]\nBCDEF"),
            (&[b"0123456789", b"ABCDEF"], "01234\n[mcp-k8s-ephemeral-job: 6 bytes omitted]\nBCDEF"),
            (&[b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9", b"A"], "01234\n[mcp-k8s-ephemeral-job: 1 bytes omitted]\n6789A"),
        ];
        for (pushes, expected) in cases {
            let (contents, truncated, total) = captured(10, pushes);
            assert_eq!(String::from_utf8(contents).unwrap(), *expected);
            assert!(truncated);
            assert_eq!(total, pushes.iter().map(|p| p.len() as u64).sum::<u64>());
        }
    }

    #[test]
    fn zero_cap_keeps_nothing_but_counts() {
        let (contents, truncated, total) = captured(0, &[b"abc"]);
        assert_eq!(contents, b"\n[mcp-k8s-ephemeral-job: 3 bytes omitted]\n");
        assert!(truncated);
        assert_eq!(total, 3);
    }

    #[test]
    fn pump_forwards_live_output_up_to_its_cap() {
        let (sink, sink_buffer) = memory_sink();
        let kept = Mutex::new(HeadTail::new(100));
        pump(&b"hello world"[..], Stream::Stdout, &kept, 5, None, &sink);
        assert_eq!(kept.lock().unwrap().contents(), b"hello world");
        let text = String::from_utf8(sink_buffer.lock().unwrap().clone()).unwrap();
        let frames: Vec<_> = text.lines().map(|line| frame::decode(line).unwrap().unwrap().1).collect();
        assert_eq!(frames, vec![Frame::Output(Output { stream: Stream::Stdout, data_b64: frame::to_base64(b"hello") })]);
    }

    /// Feeds `reads` through a pump with a cap of 4 and a spill budget;
    /// returns the spilled text as the frames put it back together, and
    /// the bytes the pump says it sent.
    fn spilled(reads: &[&[u8]], budget: u64) -> (Vec<u8>, u64) {
        struct Reads(Vec<Vec<u8>>);
        impl Read for Reads {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                if self.0.is_empty() {
                    return Ok(0);
                }
                let next = self.0.remove(0);
                out[..next.len()].copy_from_slice(&next);
                Ok(next.len())
            }
        }
        let (sink, sink_buffer) = memory_sink();
        let kept = Mutex::new(HeadTail::new(4));
        let spill = StreamSpill { budget: SpillBudget::new(budget), sent: Arc::new(AtomicU64::new(0)) };
        pump(Reads(reads.iter().map(|read| read.to_vec()).collect()), Stream::Stderr, &kept, 0, Some(&spill), &sink);
        let text = String::from_utf8(sink_buffer.lock().unwrap().clone()).unwrap();
        let mut whole = Vec::new();
        for line in text.lines() {
            if let Some((_, Frame::Spill(chunk))) = frame::decode(line).unwrap() {
                assert_eq!(chunk.offset, whole.len() as u64, "pieces arrive in order, each at its offset");
                whole.extend(frame::from_base64(&chunk.data_b64).unwrap());
            }
        }
        (whole, spill.sent.load(Ordering::SeqCst))
    }

    #[test]
    fn a_stream_is_sent_whole_once_it_outgrows_the_cap_and_only_then() {
        // (case, reads, budget, spilled text)
        type Case<'a> = (&'a str, &'a [&'a [u8]], u64, &'a [u8]);
        let cases: &[Case] = &[
            ("within the cap: nothing extra", &[b"ab", b"cd"], 100, b""),
            ("crossing in one read", &[b"abcdef"], 100, b"abcdef"),
            ("what was held, then each read", &[b"abc", b"de", b"f"], 100, b"abcdef"),
            ("the budget cuts it", &[b"abc", b"defgh"], 6, b"abcdef"),
            ("no budget: nothing", &[b"abcdefgh"], 0, b""),
        ];
        for (case, reads, budget, expected) in cases {
            let (whole, sent) = spilled(reads, *budget);
            assert_eq!(whole, *expected, "{case}");
            assert_eq!(sent, expected.len() as u64, "{case}");
        }
    }

    #[test]
    fn the_budget_is_shared_and_never_goes_below_zero() {
        let budget = SpillBudget::new(10);
        assert_eq!(budget.take(4), 4);
        assert!(!budget.take_whole(7));
        assert!(budget.take_whole(6));
        assert_eq!(budget.take(1), 0);
    }
}
