//! A small, bounded YAML reader for the files an operator hands us:
//! kubeconfigs and the pod template (`MCP_K8S_POD_TEMPLATE`). A leaf: it
//! imports only serde.
//!
//! It reads the subset those files are written in, by kubectl, kind,
//! minikube, `aws eks`, `gcloud` and by hand: block mappings and sequences
//! (a sequence may sit at its key's indentation, as kubectl writes it),
//! plain, single- and double-quoted scalars (with escapes, and folded over
//! several lines as PyYAML and go-yaml wrap long ones), literal `|` and
//! folded `>` block scalars, flow collections (`{}`, `[a, b]`, `{k: v}`,
//! nested, over several lines), comments, one document with an optional
//! `---`. It refuses, with a message naming the line, what those files never
//! need and what makes YAML readers dangerous: anchors and aliases (the
//! billion laughs), tags, directives, several documents, complex `?` keys,
//! and duplicate keys. Nesting is bounded (`MAX_DEPTH`) and so is the text
//! (`MAX_TEXT_BYTES`); since there are no aliases the tree is never larger
//! than the text. Nothing here panics on any input.
//!
//! It replaced the serde-saphyr crate, which did the same job in half a
//! megabyte of the static binary (docs/benchmarks.md, "Binary size").
//!
//! `from_str` deserializes the tree with serde, typing scalars as
//! serde-saphyr did: a string field takes any scalar's text (`port: 8080`
//! into a `String` is `"8080"`), a boolean field a boolean word even quoted,
//! and an untyped target (`serde_json::Value`) gets YAML 1.2's core schema
//! for plain scalars (`12`, `1.5`, `null`, `~`) with YAML 1.1's booleans
//! (`true`, `yes`, `on`, `y` and their `false` twins, in any case). Every
//! error carries the line and column of the node it is about.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};

/// Collections nested deeper than this are refused (the parser and the
/// deserializer recurse once per level).
pub const MAX_DEPTH: usize = 64;
/// Texts larger than this are refused; callers read files with smaller caps.
const MAX_TEXT_BYTES: usize = 16 << 20;

/// What went wrong, and where (1-based line and column) when it is known.
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    pub message: String,
    pub position: Option<(u64, u64)>,
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, column)) => write!(formatter, "{} at line {line} column {column}", self.message),
            None => formatter.write_str(&self.message),
        }
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Error { message: message.to_string(), position: None }
    }
}

/// One node of the document and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    pub line: u64,
    pub column: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    /// A scalar's text; `plain` when it was written without quotes or block
    /// indicator, the only kind the core schema gives a type other than string.
    Scalar {
        text: String,
        plain: bool,
    },
    Sequence(Vec<Node>),
    Mapping(Vec<(String, Node)>),
}

/// Parses `text` and deserializes its one document into `T`.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    let node = parse(text)?;
    T::deserialize(&node)
}

/// Parses `text` into its document's tree (`Null` for an empty document).
pub fn parse(text: &str) -> Result<Node, Error> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(Error { message: format!("the YAML text is larger than {MAX_TEXT_BYTES} bytes"), position: None });
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut parser = Parser::new(text);
    parser.document()
}

// ---- lines -----------------------------------------------------------------

/// One line: where its content starts (after the indentation) and its
/// indentation in spaces.
#[derive(Debug, Clone, Copy)]
struct Line {
    /// Byte offset of the line's first byte in the text.
    start: usize,
    /// Byte offset just past the line's content (before `\r\n` or `\n`).
    end: usize,
    indent: usize,
}

struct Parser<'a> {
    text: &'a str,
    lines: Vec<Line>,
    /// The line being read.
    index: usize,
    /// When set, the current line is read from this column on (the rest of
    /// a `- ` item's line, read as a block of its own at that indentation).
    virtual_indent: Option<usize>,
}

type Parsed<T> = Result<T, Error>;

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        let mut lines = Vec::new();
        let mut start = 0;
        // A final line break ends the last line; it starts no empty one.
        while start < text.len() {
            let end_of_line = text[start..].find('\n').map_or(text.len(), |found| start + found);
            let end = if text[start..end_of_line].ends_with('\r') { end_of_line - 1 } else { end_of_line };
            let indent = text[start..end].bytes().take_while(|byte| *byte == b' ').count();
            lines.push(Line { start, end, indent });
            start = end_of_line + 1;
        }
        Parser { text, lines, index: 0, virtual_indent: None }
    }

    fn error<T>(&self, offset: usize, message: impl Into<String>) -> Parsed<T> {
        Err(Error { message: message.into(), position: Some(self.position(offset)) })
    }

    /// Line and column (1-based) of a byte offset.
    fn position(&self, offset: usize) -> (u64, u64) {
        let index = self.lines.partition_point(|line| line.start <= offset).saturating_sub(1);
        let start = self.lines.get(index).map_or(0, |line| line.start);
        let column = self.text.get(start..offset).map_or(offset - start, |before| before.chars().count());
        (index as u64 + 1, column as u64 + 1)
    }

    fn line_index_of(&self, offset: usize) -> usize {
        self.lines.partition_point(|line| line.start <= offset).saturating_sub(1)
    }

    /// The current line's indentation and the offset its content starts at.
    fn current(&self) -> Option<(usize, usize)> {
        let line = self.lines.get(self.index)?;
        let indent = self.virtual_indent.unwrap_or(line.indent);
        Some((indent, line.start + indent))
    }

    fn content(&self, offset: usize) -> &'a str {
        let end = self.lines.get(self.line_index_of(offset)).map_or(offset, |line| line.end);
        self.text.get(offset..end).unwrap_or("")
    }

    /// Moves past lines that hold nothing but spaces or a comment.
    fn skip_blank_lines(&mut self) {
        while let Some((_, offset)) = self.current() {
            if !is_blank(self.content(offset)) {
                return;
            }
            self.next_line();
        }
    }

    /// The current line is `---` or `...` at column 0: the document ends.
    fn at_document_marker(&self) -> bool {
        self.current().is_some_and(|(indent, offset)| {
            indent == 0
                && self.virtual_indent.is_none()
                && (is_marker(self.content(offset), "---") || is_marker(self.content(offset), "..."))
        })
    }

    fn next_line(&mut self) {
        self.index += 1;
        self.virtual_indent = None;
    }

    /// Refuses a tab in the indentation of a structural line.
    fn check_indentation(&self) -> Parsed<()> {
        let Some(line) = self.lines.get(self.index) else { return Ok(()) };
        if self.virtual_indent.is_none() && self.text[line.start + line.indent..line.end].starts_with('\t') {
            return self.error(line.start + line.indent, "a tab indents this line; YAML indents with spaces");
        }
        Ok(())
    }

    // ---- document ----------------------------------------------------------

    fn document(&mut self) -> Parsed<Node> {
        self.skip_blank_lines();
        if let Some((_, offset)) = self.current() {
            let content = self.content(offset);
            if content.starts_with('%') {
                return self.error(offset, "YAML directives (`%`) are not supported");
            }
            if is_marker(content, "---") {
                if !is_blank(&content[3..]) {
                    return self.error(offset, "put the document on the line after `---`");
                }
                self.next_line();
            }
        }
        self.skip_blank_lines();
        let node = match self.current() {
            Some((indent, offset)) if !is_marker(self.content(offset), "---") && !is_marker(self.content(offset), "...") => {
                self.block(indent, 0)?
            }
            _ => Node { value: Value::Null, line: 1, column: 1 },
        };
        self.skip_blank_lines();
        if let Some((_, offset)) = self.current() {
            let content = self.content(offset);
            if is_marker(content, "---") {
                return self.error(offset, "several YAML documents in one file are not supported; keep one");
            }
            if is_marker(content, "...") {
                self.next_line();
                self.skip_blank_lines();
                if let Some((_, offset)) = self.current() {
                    return self.error(offset, "only comments may follow the document end `...`");
                }
                return Ok(node);
            }
            return self.error(offset, "unexpected text; check this line's indentation");
        }
        Ok(node)
    }

    /// A block node whose first line is the current one, indented `indent`.
    fn block(&mut self, indent: usize, depth: usize) -> Parsed<Node> {
        if depth >= MAX_DEPTH {
            let offset = self.current().map_or(0, |(_, offset)| offset);
            return self.error(offset, format!("nested deeper than {MAX_DEPTH} levels"));
        }
        self.check_indentation()?;
        let Some((_, offset)) = self.current() else { return Ok(Node { value: Value::Null, line: 1, column: 1 }) };
        let content = self.content(offset);
        if is_item(content) {
            self.sequence(indent, depth)
        } else if self.key_end(offset)?.is_some() {
            self.mapping(indent, depth)
        } else {
            // A value alone on its lines: continuation lines are indented more
            // than the parent, which is one less than this block.
            self.inline_value(offset, indent.saturating_sub(1), indent == 0, depth)
        }
    }

    fn sequence(&mut self, indent: usize, depth: usize) -> Parsed<Node> {
        let (line, column) = self.current().map_or((1, 1), |(_, offset)| self.position(offset));
        let mut items = Vec::new();
        loop {
            self.skip_blank_lines();
            let Some((line_indent, offset)) = self.current() else { break };
            if self.at_document_marker() || line_indent < indent || (line_indent == indent && !is_item(self.content(offset))) {
                break;
            }
            if line_indent > indent {
                return self.error(offset, "unexpected indentation in a sequence");
            }
            self.check_indentation()?;
            let rest = &self.content(offset)[1..];
            let spaces = rest.bytes().take_while(|byte| *byte == b' ').count();
            if is_blank(rest) {
                self.next_line();
                items.push(self.nested_or_null(indent, offset, true, depth)?);
            } else {
                // The rest of the line is a block of its own at its column.
                self.virtual_indent = Some(indent + 1 + spaces);
                items.push(self.block(indent + 1 + spaces, depth + 1)?);
            }
        }
        Ok(Node { value: Value::Sequence(items), line, column })
    }

    /// The value of a key or item that ended its line: a block on the next
    /// lines indented more than `indent` (or, for a key, a sequence at its
    /// own indentation), else null.
    fn nested_or_null(&mut self, indent: usize, at: usize, is_item: bool, depth: usize) -> Parsed<Node> {
        self.skip_blank_lines();
        if let Some((next_indent, offset)) = self.current() {
            let compact_sequence = !is_item && next_indent == indent && is_item_line(self.content(offset));
            if next_indent > indent || compact_sequence {
                return self.block(next_indent, depth + 1);
            }
        }
        let (line, column) = self.position(at);
        Ok(Node { value: Value::Null, line, column })
    }

    fn mapping(&mut self, indent: usize, depth: usize) -> Parsed<Node> {
        let (line, column) = self.current().map_or((1, 1), |(_, offset)| self.position(offset));
        let mut entries: Vec<(String, Node)> = Vec::new();
        let mut seen = BTreeSet::new();
        loop {
            self.skip_blank_lines();
            let Some((line_indent, offset)) = self.current() else { break };
            if line_indent < indent || self.at_document_marker() {
                break;
            }
            if line_indent > indent {
                return self.error(offset, "unexpected indentation in a mapping");
            }
            self.check_indentation()?;
            if is_item(self.content(offset)) {
                return self.error(offset, "a sequence item where a mapping key belongs; check the indentation");
            }
            let Some((key, after_colon)) = self.key_end(offset)? else {
                return self.error(offset, "expected `key: value`; check the indentation and the colon");
            };
            if !seen.insert(key.clone()) {
                return self.error(offset, format!("the key `{}` is given twice", shown_key(&key)));
            }
            let rest = self.content(after_colon);
            let value = if is_blank(rest) {
                self.next_line();
                self.nested_or_null(indent, offset, false, depth)?
            } else {
                let start = after_colon + (rest.len() - rest.trim_start_matches(' ').len());
                self.inline_value(start, indent, false, depth)?
            };
            entries.push((key, value));
        }
        Ok(Node { value: Value::Mapping(entries), line, column })
    }

    /// If the content at `offset` starts with a mapping key, the key and the
    /// offset just past its colon.
    fn key_end(&self, offset: usize) -> Parsed<Option<(String, usize)>> {
        let content = self.content(offset);
        if content.starts_with("? ") || content == "?" {
            return self.error(offset, "complex mapping keys (`?`) are not supported");
        }
        if content.starts_with(['"', '\'']) {
            let (key, end) = self.quoted(offset)?;
            // The key must end on its line, and a colon must follow.
            if self.line_index_of(end) != self.line_index_of(offset) {
                return Ok(None);
            }
            let after = self.content(end);
            let spaces = after.len() - after.trim_start_matches(' ').len();
            let after = &after[spaces..];
            if after.starts_with(':') && (after.len() == 1 || after[1..].starts_with([' ', '\t'])) {
                return Ok(Some((key, end + spaces + 1)));
            }
            return Ok(None);
        }
        if content.starts_with(['[', '{', '#', '&', '*', '!', '|', '>', '%', '@', '`']) {
            return Ok(None);
        }
        let mut search = 0;
        while let Some(found) = content[search..].find(':') {
            let colon = search + found;
            let after = &content[colon + 1..];
            if after.is_empty() || after.starts_with([' ', '\t']) {
                let key = content[..colon].trim_end();
                if key.is_empty() || key.contains(" #") {
                    return Ok(None);
                }
                return Ok(Some((key.to_string(), offset + colon + 1)));
            }
            if content[..colon].contains(" #") {
                return Ok(None);
            }
            search = colon + 1;
        }
        Ok(None)
    }

    /// A value that starts at `offset` on the current line: a flow
    /// collection, a quoted or plain scalar, or a block scalar. `parent` is
    /// the indentation continuation lines must exceed (`at_top`: or equal,
    /// for a document that is a lone scalar at column 0).
    fn inline_value(&mut self, offset: usize, parent: usize, at_top: bool, depth: usize) -> Parsed<Node> {
        let content = self.content(offset);
        let (line, column) = self.position(offset);
        let node = |value| Node { value, line, column };
        match content.as_bytes().first() {
            Some(b'&') | Some(b'*') => self.error(offset, "YAML anchors and aliases (`&`, `*`) are not supported; write the value out"),
            Some(b'!') => self.error(offset, "YAML tags (`!`) are not supported"),
            Some(b'@') | Some(b'`') | Some(b'%') => self.error(offset, "a plain value cannot start with `@`, `` ` `` or `%`; quote it"),
            Some(b'|') | Some(b'>') => self.block_scalar(offset, parent).map(node),
            Some(b'[') | Some(b'{') => {
                let (value, end) = self.flow(offset, depth + 1)?;
                self.finish_line_at(end)?;
                Ok(value)
            }
            Some(b'"') | Some(b'\'') => {
                let (text, end) = self.quoted(offset)?;
                self.finish_line_at(end)?;
                Ok(node(Value::Scalar { text, plain: false }))
            }
            _ if is_item(content) => self.error(offset, "a sequence cannot start on a key's line; start it on the next line"),
            _ => self.plain(offset, parent, at_top).map(node),
        }
    }

    /// After a value that ended at `end`: the rest of that line must be
    /// blank or a comment; reading goes on at the next line.
    fn finish_line_at(&mut self, end: usize) -> Parsed<()> {
        if !is_blank(self.content(end)) {
            return self.error(end, "unexpected text after the value");
        }
        self.index = self.line_index_of(end) + 1;
        self.virtual_indent = None;
        Ok(())
    }

    /// A plain scalar, possibly folded over more-indented lines.
    fn plain(&mut self, offset: usize, parent: usize, at_top: bool) -> Parsed<Value> {
        let content = self.content(offset);
        let first = plain_part(content);
        if first.contains(": ") || first.ends_with(':') {
            return self.error(offset, "a `: ` inside a plain value; quote the value");
        }
        let mut text = first.to_string();
        self.next_line();
        if content.trim_end_matches([' ', '\t']).len() > first.len() {
            // A comment ends a plain scalar.
            return Ok(Value::Scalar { text, plain: true });
        }
        let mut breaks = 0;
        while let Some(line) = self.lines.get(self.index).copied() {
            let content = &self.text[line.start..line.end];
            if content.trim().is_empty() {
                breaks += 1;
                self.next_line();
                continue;
            }
            let continues = line.indent > parent || (at_top && line.indent == parent);
            let trimmed = content.trim_start_matches([' ', '\t']);
            if !continues || trimmed.starts_with('#') || is_marker(trimmed, "---") || is_marker(trimmed, "...") {
                break;
            }
            if self.key_end(line.start + line.indent)?.is_some() || (at_top && is_item(trimmed)) {
                break;
            }
            let part = plain_part(trimmed);
            if part.contains(": ") || part.ends_with(':') {
                return self.error(line.start + line.indent, "a `: ` inside a plain value; quote the value");
            }
            fold(&mut text, breaks);
            breaks = 0;
            text.push_str(part);
            self.next_line();
            if trimmed.len() > part.len() {
                break; // a comment ends a plain scalar
            }
        }
        Ok(if text.is_empty() { Value::Null } else { Value::Scalar { text, plain: true } })
    }

    /// A literal (`|`) or folded (`>`) block scalar: its header at `offset`,
    /// its lines the following ones indented more than `parent`.
    fn block_scalar(&mut self, offset: usize, parent: usize) -> Parsed<Value> {
        let header = self.content(offset);
        let literal = header.starts_with('|');
        let mut chomp = ' ';
        let mut explicit = None;
        let mut rest = &header[1..];
        for _ in 0..2 {
            match rest.as_bytes().first() {
                Some(b'-') | Some(b'+') if chomp == ' ' => chomp = rest.as_bytes()[0] as char,
                Some(digit @ b'1'..=b'9') if explicit.is_none() => explicit = Some(usize::from(digit - b'0')),
                _ => break,
            }
            rest = &rest[1..];
        }
        if !is_blank(rest) {
            return self.error(offset, "a block scalar's header is `|` or `>`, then `-`, `+` or an indentation digit");
        }
        self.next_line();
        let mut block_indent = explicit.map(|digits| parent + digits);
        let mut lines: Vec<&str> = Vec::new();
        while let Some(line) = self.lines.get(self.index).copied() {
            let content = &self.text[line.start..line.end];
            if content.trim_matches(' ').is_empty() {
                lines.push("");
                self.next_line();
                continue;
            }
            let indent = *block_indent.get_or_insert(line.indent);
            if line.indent < indent || indent <= parent {
                break;
            }
            lines.push(&content[indent..]);
            self.next_line();
        }
        let kept_breaks = lines.iter().rev().take_while(|line| line.is_empty()).count();
        let body = &lines[..lines.len() - kept_breaks];
        let mut text = String::new();
        let mut empty_lines = 0;
        let mut previous: Option<&str> = None;
        for line in body {
            if line.is_empty() {
                empty_lines += 1;
                continue;
            }
            // Folded: a break between two lines of text is a space, an
            // empty line between them one `\n`; more-indented lines keep
            // their breaks.
            let joins = previous.is_some_and(|previous| !literal && !previous.starts_with(' ') && !line.starts_with(' '));
            match previous {
                Some(_) if joins && empty_lines == 0 => text.push(' '),
                Some(_) => (0..empty_lines + usize::from(!joins)).for_each(|_| text.push('\n')),
                None => (0..empty_lines).for_each(|_| text.push('\n')),
            }
            empty_lines = 0;
            text.push_str(line);
            previous = Some(line);
        }
        let trailing = match chomp {
            '-' => 0,
            '+' => kept_breaks + usize::from(previous.is_some()),
            _ => usize::from(previous.is_some()),
        };
        (0..trailing).for_each(|_| text.push('\n'));
        Ok(Value::Scalar { text, plain: false })
    }

    /// A quoted scalar starting at `offset` (its quote); the text and the
    /// offset just past the closing quote. It may span lines.
    fn quoted(&self, offset: usize) -> Parsed<(String, usize)> {
        let bytes = self.text.as_bytes();
        let quote = bytes[offset];
        let mut text = String::new();
        let mut index = offset + 1;
        loop {
            let Some(&byte) = bytes.get(index) else { return self.error(offset, "a quoted value is not closed") };
            match byte {
                b'\'' if quote == b'\'' => {
                    if bytes.get(index + 1) == Some(&b'\'') {
                        text.push('\'');
                        index += 2;
                    } else {
                        return Ok((text, index + 1));
                    }
                }
                b'"' if quote == b'"' => return Ok((text, index + 1)),
                b'\\' if quote == b'"' => index = self.escape(index, &mut text)?,
                b'\n' | b'\r' => index = self.fold_quoted_break(index, &mut text),
                _ => {
                    // At least one character: a quote of the other kind, or
                    // a `\\` in single quotes, is text here.
                    let rest = &self.text[index..];
                    let first = rest.chars().next().map_or(1, char::len_utf8);
                    let end = rest[first..].find(['\'', '"', '\\', '\n', '\r']).map_or(rest.len(), |found| first + found);
                    text.push_str(&rest[..end]);
                    index += end;
                }
            }
        }
    }

    /// A line break inside a quoted scalar: trailing spaces before it and
    /// leading ones after it go; one break is a space, each empty line a `\n`.
    fn fold_quoted_break(&self, mut index: usize, text: &mut String) -> usize {
        let kept = text.trim_end_matches([' ', '\t']).len();
        text.truncate(kept);
        let bytes = self.text.as_bytes();
        let mut breaks: usize = 0;
        while let Some(&byte) = bytes.get(index) {
            match byte {
                b'\n' => breaks += 1,
                b'\r' | b' ' | b'\t' => {}
                _ => break,
            }
            index += 1;
        }
        fold(text, breaks.saturating_sub(1));
        index
    }

    /// A `\` escape in a double-quoted scalar at `index`; the offset after it.
    fn escape(&self, index: usize, text: &mut String) -> Parsed<usize> {
        let bytes = self.text.as_bytes();
        let Some(&code) = bytes.get(index + 1) else { return self.error(index, "a quoted value is not closed") };
        let simple = match code {
            b'0' => Some('\0'),
            b'a' => Some('\u{7}'),
            b'b' => Some('\u{8}'),
            b't' | b'\t' => Some('\t'),
            b'n' => Some('\n'),
            b'v' => Some('\u{b}'),
            b'f' => Some('\u{c}'),
            b'r' => Some('\r'),
            b'e' => Some('\u{1b}'),
            b' ' => Some(' '),
            b'"' => Some('"'),
            b'/' => Some('/'),
            b'\\' => Some('\\'),
            b'N' => Some('\u{85}'),
            b'_' => Some('\u{a0}'),
            b'L' => Some('\u{2028}'),
            b'P' => Some('\u{2029}'),
            _ => None,
        };
        if let Some(character) = simple {
            text.push(character);
            return Ok(index + 2);
        }
        let digits = match code {
            b'x' => 2,
            b'u' => 4,
            b'U' => 8,
            b'\n' | b'\r' => {
                // An escaped line break joins the lines without a space.
                let mut next = index + 1;
                while matches!(bytes.get(next), Some(b'\n' | b'\r' | b' ' | b'\t')) {
                    next += 1;
                }
                return Ok(next);
            }
            _ => return self.error(index, "an unknown escape in a double-quoted value"),
        };
        let hex = self.text.get(index + 2..index + 2 + digits).filter(|hex| hex.bytes().all(|byte| byte.is_ascii_hexdigit()));
        match hex.and_then(|hex| u32::from_str_radix(hex, 16).ok()).and_then(char::from_u32) {
            Some(character) => {
                text.push(character);
                Ok(index + 2 + digits)
            }
            None => self.error(index, "a `\\x`, `\\u` or `\\U` escape that is not a character"),
        }
    }

    // ---- flow collections ----------------------------------------------------

    /// Skips spaces, line breaks and comments inside a flow collection.
    fn skip_flow_space(&self, mut index: usize) -> usize {
        let bytes = self.text.as_bytes();
        while let Some(&byte) = bytes.get(index) {
            match byte {
                b' ' | b'\t' | b'\n' | b'\r' => index += 1,
                b'#' if index == 0 || matches!(bytes[index - 1], b' ' | b'\t' | b'\n' | b'\r') => {
                    index = self.text[index..].find('\n').map_or(self.text.len(), |found| index + found);
                }
                _ => break,
            }
        }
        index
    }

    /// A flow node at `index`; the node and the offset just past it.
    fn flow(&self, index: usize, depth: usize) -> Parsed<(Node, usize)> {
        if depth >= MAX_DEPTH {
            return self.error(index, format!("nested deeper than {MAX_DEPTH} levels"));
        }
        let (line, column) = self.position(index);
        let node = |value| Node { value, line, column };
        let bytes = self.text.as_bytes();
        match bytes.get(index) {
            Some(b'[') => {
                let mut items = Vec::new();
                let mut at = self.skip_flow_space(index + 1);
                loop {
                    if bytes.get(at) == Some(&b']') {
                        return Ok((node(Value::Sequence(items)), at + 1));
                    }
                    let (item, end) = self.flow(at, depth + 1)?;
                    items.push(item);
                    at = self.skip_flow_space(end);
                    match bytes.get(at) {
                        Some(b',') => at = self.skip_flow_space(at + 1),
                        Some(b']') => {}
                        Some(b':') => return self.error(at, "a `key: value` pair inside `[ ]` is not supported; use `{ }`"),
                        _ => return self.error(at, "expected `,` or `]`"),
                    }
                }
            }
            Some(b'{') => {
                let mut entries: Vec<(String, Node)> = Vec::new();
                let mut seen = BTreeSet::new();
                let mut at = self.skip_flow_space(index + 1);
                loop {
                    if bytes.get(at) == Some(&b'}') {
                        return Ok((node(Value::Mapping(entries)), at + 1));
                    }
                    let (key, end) = self.flow(at, depth + 1)?;
                    let key_text = match key.value {
                        Value::Scalar { text, .. } => text,
                        Value::Null => String::new(),
                        _ => return self.error(at, "a mapping key must be a scalar"),
                    };
                    if !seen.insert(key_text.clone()) {
                        return self.error(at, format!("the key `{}` is given twice", shown_key(&key_text)));
                    }
                    at = self.skip_flow_space(end);
                    let value = if bytes.get(at) == Some(&b':') {
                        let (value, end) = self.flow_value_after_colon(at + 1, depth)?;
                        at = self.skip_flow_space(end);
                        value
                    } else {
                        let (line, column) = self.position(at);
                        Node { value: Value::Null, line, column }
                    };
                    entries.push((key_text, value));
                    match bytes.get(at) {
                        Some(b',') => at = self.skip_flow_space(at + 1),
                        Some(b'}') => {}
                        _ => return self.error(at, "expected `,` or `}`"),
                    }
                }
            }
            Some(b'"') | Some(b'\'') => {
                let (text, end) = self.quoted(index)?;
                Ok((node(Value::Scalar { text, plain: false }), end))
            }
            Some(b'&') | Some(b'*') => self.error(index, "YAML anchors and aliases (`&`, `*`) are not supported; write the value out"),
            Some(b'!') => self.error(index, "YAML tags (`!`) are not supported"),
            Some(b',' | b']' | b'}' | b'|' | b'>' | b'@' | b'`' | b'%' | b'#') | None => self.error(index, "expected a value"),
            Some(_) => {
                let rest = &self.text[index..];
                let mut end = rest.len();
                for (position, character) in rest.char_indices() {
                    let after = rest[position + character.len_utf8()..].chars().next();
                    let ends = match character {
                        ',' | '[' | ']' | '{' | '}' | '\n' | '\r' => true,
                        ':' => matches!(after, None | Some(' ' | '\t' | '\n' | '\r' | ',' | ']' | '}')),
                        '#' => position > 0 && rest[..position].ends_with([' ', '\t']),
                        _ => false,
                    };
                    if ends {
                        end = position;
                        break;
                    }
                }
                let text = rest[..end].trim_end_matches([' ', '\t']);
                let value = if text.is_empty() { Value::Null } else { Value::Scalar { text: text.to_string(), plain: true } };
                Ok((node(value), index + text.len()))
            }
        }
    }

    /// A flow mapping's value after its `:` (null when none follows).
    fn flow_value_after_colon(&self, index: usize, depth: usize) -> Parsed<(Node, usize)> {
        let at = self.skip_flow_space(index);
        if matches!(self.text.as_bytes().get(at), Some(b',' | b'}')) {
            let (line, column) = self.position(at);
            return Ok((Node { value: Value::Null, line, column }, at));
        }
        self.flow(at, depth + 1)
    }
}

/// Adds a folded line break: one break is a space, each further one a `\n`.
fn fold(text: &mut String, breaks: usize) {
    if breaks == 0 {
        text.push(' ');
    } else {
        (0..breaks).for_each(|_| text.push('\n'));
    }
}

/// The plain scalar text of a line: up to a ` #` comment, trimmed.
fn plain_part(content: &str) -> &str {
    let end = content.find(" #").or_else(|| content.find("\t#")).unwrap_or(content.len());
    content[..end].trim_matches([' ', '\t'])
}

/// Nothing but spaces, or a comment.
fn is_blank(content: &str) -> bool {
    let trimmed = content.trim_start_matches([' ', '\t']);
    trimmed.is_empty() || trimmed.starts_with('#')
}

/// `---` or `...` alone (or before spaces or a comment).
fn is_marker(content: &str, marker: &str) -> bool {
    content.strip_prefix(marker).is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// A block sequence item: `-` then a space or the end of the line.
fn is_item(content: &str) -> bool {
    content.strip_prefix('-').is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

fn is_item_line(content: &str) -> bool {
    is_item(content.trim_start_matches(' '))
}

/// A key as an error may show it: short plain keys only, since a key
/// written by mistake may be a secret.
fn shown_key(key: &str) -> &str {
    let plain = !key.is_empty() && key.len() <= 64 && key.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte));
    if plain { key } else { "…" }
}

// ---- core schema -------------------------------------------------------------

fn is_null(text: &str) -> bool {
    matches!(text, "null" | "Null" | "NULL" | "~")
}

/// YAML 1.1's booleans in any case (`yes`, `On`, `n`…), as go-yaml v2, which
/// kubectl reads kubeconfigs with, and serde-saphyr take them.
fn as_bool(text: &str) -> Option<bool> {
    const TRUE: [&str; 4] = ["true", "yes", "on", "y"];
    const FALSE: [&str; 4] = ["false", "no", "off", "n"];
    if TRUE.iter().any(|word| word.eq_ignore_ascii_case(text)) {
        Some(true)
    } else if FALSE.iter().any(|word| word.eq_ignore_ascii_case(text)) {
        Some(false)
    } else {
        None
    }
}

enum Number {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
}

fn as_number(text: &str) -> Option<Number> {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let radix = |prefix: &str, radix: u32| {
        let digits = text.strip_prefix(prefix)?;
        (!digits.is_empty()).then(|| u64::from_str_radix(digits, radix).ok()).flatten().map(Number::Unsigned)
    };
    if let Some(number) = radix("0x", 16).or_else(|| radix("0o", 8)).or_else(|| radix("0b", 2)) {
        return Some(number);
    }
    // YAML 1.1 (go-yaml v2, serde-saphyr) allows `_` between digits: `1_000`.
    if digits.starts_with(|c: char| c.is_ascii_digit()) && digits.bytes().all(|byte| byte.is_ascii_digit() || byte == b'_') {
        let digits: String = digits.chars().filter(|c| *c != '_').collect();
        return if negative { format!("-{digits}").parse().ok().map(Number::Signed) } else { digits.parse().ok().map(Number::Unsigned) };
    }
    match digits {
        ".inf" | ".Inf" | ".INF" => return Some(Number::Float(if negative { f64::NEG_INFINITY } else { f64::INFINITY })),
        ".nan" | ".NaN" | ".NAN" if text == digits => return Some(Number::Float(f64::NAN)),
        _ => {}
    }
    // The core schema's floats: digits with a `.` and/or an exponent.
    let float_shaped = digits.bytes().any(|byte| byte.is_ascii_digit())
        && digits.bytes().all(|byte| byte.is_ascii_digit() || matches!(byte, b'.' | b'e' | b'E' | b'+' | b'-'))
        && digits.bytes().next().is_some_and(|byte| byte.is_ascii_digit() || byte == b'.');
    if float_shaped { text.parse().ok().map(Number::Float) } else { None }
}

// ---- serde -------------------------------------------------------------------

impl Node {
    fn position(&self) -> Option<(u64, u64)> {
        Some((self.line, self.column))
    }

    /// Gives an error that has no position yet this node's.
    fn place<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        result.map_err(|mut error| {
            error.position = error.position.or(self.position());
            error
        })
    }

    fn unexpected(&self) -> de::Unexpected<'_> {
        match &self.value {
            Value::Null => de::Unexpected::Unit,
            Value::Scalar { text, .. } => de::Unexpected::Str(text),
            Value::Sequence(_) => de::Unexpected::Seq,
            Value::Mapping(_) => de::Unexpected::Map,
        }
    }
}

impl<'de> de::Deserializer<'de> for &'de Node {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let result = match &self.value {
            Value::Null => visitor.visit_unit(),
            Value::Scalar { text, plain: true } if is_null(text) => visitor.visit_unit(),
            Value::Scalar { text, plain: true } => match (as_bool(text), as_number(text)) {
                (Some(flag), _) => visitor.visit_bool(flag),
                (_, Some(Number::Unsigned(number))) => visitor.visit_u64(number),
                (_, Some(Number::Signed(number))) => visitor.visit_i64(number),
                (_, Some(Number::Float(number))) => visitor.visit_f64(number),
                _ => visitor.visit_str(text),
            },
            Value::Scalar { text, .. } => visitor.visit_str(text),
            Value::Sequence(items) => visitor.visit_seq(de::value::SeqDeserializer::new(items.iter())),
            Value::Mapping(entries) => visitor
                .visit_map(de::value::MapDeserializer::new(entries.iter().map(|(key, value)| (key.as_str().into_deserializer(), value)))),
        };
        self.place(result)
    }

    /// A string field takes any scalar's text, as kubectl's YAML does not
    /// (it types first) but every kubeconfig writer's output reads the same.
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let result = match &self.value {
            Value::Scalar { text, plain } if !(*plain && is_null(text)) => visitor.visit_str(text),
            _ => return self.deserialize_any(visitor),
        };
        self.place(result)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    /// A boolean field takes a quoted boolean word too, as serde-saphyr did.
    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let result = match &self.value {
            Value::Scalar { text, .. } => match as_bool(text) {
                Some(flag) => visitor.visit_bool(flag),
                None => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
            },
            _ => return self.deserialize_any(visitor),
        };
        self.place(result)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let result = match &self.value {
            Value::Null => visitor.visit_none(),
            Value::Scalar { text, plain: true } if is_null(text) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        };
        self.place(result)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
    }
}

impl<'de> IntoDeserializer<'de, Error> for &'de Node {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}
