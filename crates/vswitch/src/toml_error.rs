//! Where a TOML error is, in words an operator can act on: the line and column, the dotted path
//! of the field (`vm[1].port`, `fabric.host.heartbeat`) and the parser's message with every value
//! it quotes bounded in length.
//!
//! `toml`'s own error carries a byte span and, for a type error, a message such as
//! `invalid type: string "...", expected u32` that names neither the field nor the line, and
//! quotes a string value whole (a 200 KB value becomes a 200 KB error). Every loader of a config
//! file (policy, testbed, scenario) formats its parse errors with [`describe`], so the rule is
//! written once.
//!
//! Pure functions on the text: no I/O.

use std::borrow::Cow;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// Longest excerpt of user input an error quotes, in bytes (see [`excerpt`]).
pub const EXCERPT_MAX: usize = 80;

/// `s` if it is at most `max` bytes, else its first `max` bytes (cut at a character boundary)
/// followed by `... (N bytes)`: an error names a value without echoing all of it.
pub fn excerpt(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}... ({} bytes)", &s[..end], s.len()))
}

/// The position of a byte offset in a TOML text and the field there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TomlPosition {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// Dotted path of the innermost key or value that holds the offset (`vm[0].port`), if the
    /// document parses as TOML and one does.
    pub field: Option<String>,
}

/// Where byte `offset` of `text` is: line, column and the field there.
pub fn locate(text: &str, offset: usize) -> TomlPosition {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..offset].chars().count() + 1;
    let field = DeTable::parse(text).ok().and_then(|doc| {
        let mut best = None;
        walk_table(doc.get_ref(), offset, String::new(), &mut best);
        best.map(|(_, path)| path)
    });
    TomlPosition {
        line,
        column,
        field,
    }
}

/// The narrowest span that holds `offset`, with its path, is kept in `best`.
type Best = Option<(usize, String)>;

fn consider(span: std::ops::Range<usize>, offset: usize, path: &str, best: &mut Best) {
    // An empty span (a missing field at the end of the document) holds its own start.
    let holds = span.start <= offset && (offset < span.end || offset == span.start);
    if holds && best.as_ref().is_none_or(|(len, _)| span.len() <= *len) {
        *best = Some((span.len(), path.to_string()));
    }
}

fn walk_table(table: &DeTable<'_>, offset: usize, prefix: String, best: &mut Best) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{prefix}.{}", key.get_ref())
        };
        consider(key.span(), offset, &path, best);
        walk_value(value, offset, path, best);
    }
}

fn walk_value(value: &Spanned<DeValue<'_>>, offset: usize, path: String, best: &mut Best) {
    consider(value.span(), offset, &path, best);
    match value.get_ref() {
        DeValue::Table(t) => walk_table(t, offset, path, best),
        DeValue::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                walk_value(v, offset, format!("{path}[{i}]"), best);
            }
        }
        _ => {}
    }
}

/// One line for a TOML error in `text`: `line L, column C, field a.b: message`, the message's
/// quoted values shortened to [`EXCERPT_MAX`] bytes (see [`bound_quotes`]).
pub fn describe(text: &str, err: &toml::de::Error) -> String {
    let message = bound_quotes(err.message().trim_end(), EXCERPT_MAX);
    match err.span() {
        Some(span) => {
            let at = locate(text, span.start);
            match at.field {
                Some(field) => format!(
                    "line {}, column {}, field {field}: {message}",
                    at.line, at.column
                ),
                None => format!("line {}, column {}: {message}", at.line, at.column),
            }
        }
        None => message.into_owned(),
    }
}

/// `message` with each double-quoted or back-quoted part longer than `max` bytes shortened by
/// [`excerpt`], and the whole bounded to a few times `max`: serde quotes the value it rejects.
pub fn bound_quotes(message: &str, max: usize) -> Cow<'_, str> {
    if message.len() <= max {
        return Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(4 * max);
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        let quote = rest.as_bytes()[open];
        out.push_str(&rest[..=open]);
        let after = &rest[open + 1..];
        match after.find(char::from(quote)) {
            Some(close) => {
                out.push_str(&excerpt(&after[..close], max));
                out.push(char::from(quote));
                rest = &after[close + 1..];
            }
            None => {
                out.push_str(&excerpt(after, max));
                rest = "";
            }
        }
    }
    out.push_str(rest);
    match excerpt(&out, 4 * max) {
        Cow::Borrowed(_) => Cow::Owned(out),
        Cow::Owned(short) => Cow::Owned(short),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // only parsed, to provoke errors
    struct Doc {
        top: u32,
        vm: Vec<Vm>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Vm {
        name: String,
        port: u32,
    }

    fn err(text: &str) -> String {
        let e = toml::from_str::<Doc>(text).unwrap_err();
        describe(text, &e)
    }

    #[test]
    fn a_type_error_names_the_dotted_field_line_and_column() {
        let text = "top = 1\n[[vm]]\nname = \"a\"\nport = 1\n[[vm]]\nname = \"b\"\nport = \"x\"\n";
        let e = err(text);
        assert!(
            e.starts_with("line 7, column 8, field vm[1].port: invalid type"),
            "{e}"
        );
    }

    #[test]
    fn a_huge_quoted_value_is_shortened() {
        let big = "A".repeat(200_000);
        let text = format!("top = \"{big}\"\nvm = []\n");
        let e = err(&text);
        assert!(e.len() < 400, "{} bytes: {}", e.len(), &e[..200]);
        assert!(
            e.contains("field top") && e.contains("(200000 bytes)"),
            "{e}"
        );
    }

    #[test]
    fn a_syntax_error_still_has_line_and_column() {
        let e = err("top = 1\nvm = [\n");
        assert!(e.starts_with("line "), "{e}");
    }

    #[test]
    fn excerpt_cuts_at_a_character_boundary() {
        assert_eq!(excerpt("ééé", 3), "é... (6 bytes)");
        assert_eq!(excerpt("abc", 3), "abc");
    }
}
