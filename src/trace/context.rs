//! W3C trace context (`traceparent`): the ids a client's span hands to
//! ours, read from a request's `params._meta` as the MCP semantic
//! conventions say, and fresh ids for our own spans. Total on hostile
//! text: anything that is not a valid `traceparent` is no parent.

/// A span's place in a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The `sampled` flag the caller set (bit 0 of the trace flags).
    pub sampled: bool,
}

impl SpanContext {
    /// A new root: a fresh trace, sampled.
    pub fn root() -> SpanContext {
        SpanContext { trace_id: random_nonzero(), span_id: random_nonzero(), sampled: true }
    }

    /// A child of this span: same trace, fresh span id.
    pub fn child(&self) -> SpanContext {
        SpanContext { span_id: random_nonzero(), ..*self }
    }

    /// As a `traceparent` header value.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.span_id), u8::from(self.sampled))
    }
}

/// Reads a `traceparent` value: version `00` exactly as the recommendation
/// writes it, or a later version whose first four fields have that shape
/// (and more after a `-`). All-zero ids and version `ff` are invalid.
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let text = text.trim();
    if text.len() < 55 || !text.is_ascii() {
        return None;
    }
    let (head, rest) = text.split_at(55);
    let fields: Vec<&str> = head.split('-').collect();
    let [version, trace_id, span_id, flags] = fields.as_slice() else { return None };
    let lower_hex = |field: &str| field.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte));
    if !([*version, *trace_id, *span_id, *flags].iter().all(|field| lower_hex(field))) || *version == "ff" {
        return None;
    }
    if (*version == "00" && !rest.is_empty()) || (*version != "00" && !rest.is_empty() && !rest.starts_with('-')) {
        return None;
    }
    let trace_id: [u8; 16] = from_hex(trace_id)?;
    let span_id: [u8; 8] = from_hex(span_id)?;
    let flags: [u8; 1] = from_hex(flags)?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(SpanContext { trace_id, span_id, sampled: flags[0] & 1 == 1 })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut bytes = [0u8; N];
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * index..2 * index + 2], 16).ok()?;
    }
    Some(bytes)
}

fn random_nonzero<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom as _;
    let rng = ring::rand::SystemRandom::new();
    let mut bytes = [0u8; N];
    // A failed or all-zero draw (never seen in practice) falls back to a
    // fixed non-zero id: the span stays valid, only less unique.
    if rng.fill(&mut bytes).is_err() || bytes == [0; N] {
        bytes[N - 1] = 1;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_read_as_the_recommendation_writes_them() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = parse_traceparent(good).unwrap();
        assert_eq!(hex(&parsed.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&parsed.span_id), "00f067aa0ba902b7");
        assert!(parsed.sampled);
        assert_eq!(parsed.traceparent(), good);
        // (case, text, valid)
        let cases = [
            ("not sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true),
            ("a later version with more fields", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", true),
            ("version 00 with more", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", false),
            ("version ff", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false),
            ("upper case", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false),
            ("zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", false),
            ("zero span id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false),
            ("short", "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", false),
            ("not hex", "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01", false),
            ("empty", "", false),
            ("not ascii", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é", false),
        ];
        for (case, text, valid) in cases {
            assert_eq!(parse_traceparent(text).is_some(), valid, "{case}");
        }
    }

    #[test]
    fn a_child_keeps_the_trace_and_gets_its_own_span() {
        let root = SpanContext::root();
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
    }
}
