//! Caller input quoted back in error messages, shortened (an
//! earlier build echoed 1 MB of input whole). Errors name the offending
//! value so the caller can find it; the first `MAX_ECHO_CHARS` characters
//! do that. Knows nothing of where the text came from.

use std::borrow::Cow;

/// Characters of caller input an error message quotes at most.
pub const MAX_ECHO_CHARS: usize = 100;

/// `text` itself when short enough, else its first `MAX_ECHO_CHARS`
/// characters, an ellipsis and the full length in bytes.
pub fn shorten(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(MAX_ECHO_CHARS) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}… ({} bytes)", &text[..cut], text.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        assert_eq!(shorten("abc"), "abc");
        let exact = "x".repeat(MAX_ECHO_CHARS);
        assert_eq!(shorten(&exact), exact);
        assert_eq!(shorten(&"é".repeat(1000)), format!("{}… (2000 bytes)", "é".repeat(MAX_ECHO_CHARS)));
    }
}
