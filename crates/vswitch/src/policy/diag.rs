//! Diagnostics for TOML configuration files: where in the text a field is, and how much of the
//! input an error may echo. The policy file, a testbed file (`spillway-rt`) and every other
//! config reader use these, so that all errors read alike: `file:line:column: field: ...`,
//! and no error repeats an unbounded piece of its input (a 200 KB line stays in the file).
//!
//! Positions are found by a line scanner that follows `[table]` and `[[array]]` headers,
//! dotted keys and multi-line arrays; it is best effort (it does not parse TOML), which is all
//! an error message needs: the parser has already accepted or rejected the document.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// Most characters of an input value an error repeats (the rest becomes `…`).
pub const ECHO_CHARS_MAX: usize = 64;

/// Most characters of a parser message an error repeats (serde's messages quote the value).
pub const MESSAGE_CHARS_MAX: usize = 240;

/// `s` cut to `max_chars` characters; a cut string ends in `…` and says how long it was.
pub fn bounded(s: &str, max_chars: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max_chars) {
        None => Cow::Borrowed(s),
        Some((cut, _)) => Cow::Owned(format!("{}… ({} bytes in all)", &s[..cut], s.len())),
    }
}

/// An input value as errors show it: quoted and escaped like `{:?}`, at most
/// [`ECHO_CHARS_MAX`] characters of it.
pub fn echo(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS_MAX) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes in all)", &s[..cut], s.len()),
    }
}

/// A position in a TOML text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TomlPlace {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// Dotted path of the key (or table) there, e.g. `tenant[1].route[0].prefix`, bounded by
    /// [`bounded`] to [`MESSAGE_CHARS_MAX`] characters.
    pub field: String,
}

/// One line of the scan: where it starts, and the key or table it defines. The table's path
/// is an index into the scan's list of tables rather than a copy, so that a long header above
/// many keys costs its length once, not once per key (the scan runs on hostile input).
struct Entry {
    /// Byte offset of the line.
    start: usize,
    /// Byte offset of the key (or header) on it.
    key_at: usize,
    /// The table the line is in (or, for a header line, defines).
    table: usize,
    /// What the line defines; `None` for blank lines, comments and continuation lines.
    what: Option<What>,
}

enum What {
    /// A `[table]` or `[[array]]` header: the path is the table's.
    Header,
    /// A `key = value` line: the path is the table's, a dot, and this key (dotted keys joined).
    Key(String),
}

/// The lines of a text and the tables they are in.
struct Scan {
    tables: Vec<String>,
    entries: Vec<Entry>,
}

impl Scan {
    /// Whether entry `e` defines exactly `path`.
    fn defines(&self, e: &Entry, path: &str) -> bool {
        let table = &self.tables[e.table];
        match &e.what {
            None => false,
            Some(What::Header) => table == path,
            Some(What::Key(k)) if table.is_empty() => k == path,
            Some(What::Key(k)) => path
                .strip_prefix(table.as_str())
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|rest| rest == k),
        }
    }

    /// The path entry `e` defines, if any.
    fn path(&self, e: &Entry) -> Option<String> {
        let table = &self.tables[e.table];
        match e.what.as_ref()? {
            What::Header => Some(table.clone()),
            What::Key(k) if table.is_empty() => Some(k.clone()),
            What::Key(k) => Some(format!("{table}.{k}")),
        }
    }
}

/// Scans `text` line by line, recording what each line defines.
fn scan(text: &str) -> Scan {
    // Arrays of tables seen so far, by indexed path ("tenant[0].route"), with their lengths.
    let mut arrays: BTreeMap<String, usize> = BTreeMap::new();
    let mut tables = vec![String::new()];
    // Open brackets of a value spanning lines, and whether a `"""`/`'''` string is open.
    let mut depth: i64 = 0;
    let mut in_multiline: Option<&str> = None;
    let mut out = Vec::new();
    let mut start = 0;
    for raw in text.split_inclusive('\n') {
        let line_start = start;
        start += raw.len();
        let line = raw.trim_end_matches(['\n', '\r']);
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        let mut entry = Entry {
            start: line_start,
            key_at: line_start + indent,
            table: tables.len() - 1,
            what: None,
        };
        if let Some(delim) = in_multiline {
            if t.contains(delim) {
                in_multiline = None;
            }
            out.push(entry);
            continue;
        }
        if depth > 0 {
            depth = (depth + bracket_balance(t)).max(0);
            out.push(entry);
            continue;
        }
        if let Some(rest) = t.strip_prefix("[[") {
            let name = rest.split("]]").next().unwrap_or("").trim();
            let (parent, last) = match name.rsplit_once('.') {
                Some((p, l)) => (resolve(p, &arrays), unquote(l)),
                None => (String::new(), unquote(name)),
            };
            let key = if parent.is_empty() {
                last.to_string()
            } else {
                format!("{parent}.{last}")
            };
            let n = arrays.entry(key.clone()).or_insert(0);
            *n += 1;
            tables.push(format!("{key}[{}]", *n - 1));
            entry.table = tables.len() - 1;
            entry.what = Some(What::Header);
        } else if let Some(rest) = t.strip_prefix('[') {
            tables.push(resolve(rest.split(']').next().unwrap_or(""), &arrays));
            entry.table = tables.len() - 1;
            entry.what = Some(What::Header);
        } else if !t.starts_with('#')
            && let Some((k, v)) = t.split_once('=')
        {
            let key: Vec<&str> = k.split('.').map(unquote).collect();
            entry.what = Some(What::Key(key.join(".")));
            let v = v.trim_start();
            for delim in ["\"\"\"", "'''"] {
                if let Some(after) = v.strip_prefix(delim)
                    && !after.contains(delim)
                {
                    in_multiline = Some(delim);
                }
            }
            if in_multiline.is_none() {
                depth = bracket_balance(v).max(0);
            }
        }
        out.push(entry);
    }
    Scan {
        tables,
        entries: out,
    }
}

/// Opening minus closing brackets and braces outside strings and comments (best effort).
fn bracket_balance(s: &str) -> i64 {
    let mut n = 0i64;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in s.chars() {
        match quote {
            Some(q) => {
                if q == '"' && c == '\\' && !escaped {
                    escaped = true;
                    continue;
                }
                if c == q && !escaped {
                    quote = None;
                }
                escaped = false;
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '#' => break,
                '[' | '{' => n += 1,
                ']' | '}' => n -= 1,
                _ => {}
            },
        }
    }
    n
}

fn unquote(s: &str) -> &str {
    s.trim().trim_matches('"').trim_matches('\'')
}

/// A table name with the array indices in force: `tenant.route` after two `[[tenant]]` is
/// `tenant[1].route`.
fn resolve(name: &str, arrays: &BTreeMap<String, usize>) -> String {
    // Each segment looks its prefix up: quadratic in the name, so a hostile one is left as is.
    if name.len() > 1024 {
        return bounded(name, MESSAGE_CHARS_MAX).into_owned();
    }
    let mut path = String::new();
    for seg in name.split('.').map(unquote) {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(seg);
        if let Some(n) = arrays.get(&path) {
            path = format!("{path}[{}]", n.saturating_sub(1));
        }
    }
    path
}

fn place(text: &str, line: usize, at: usize, field: &str) -> TomlPlace {
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    TomlPlace {
        line,
        column: text[line_start..at].chars().count() + 1,
        field: bounded(field, MESSAGE_CHARS_MAX).into_owned(),
    }
}

/// The place of byte `offset` (clamped to the text, moved back to a character boundary) and
/// the path of the key on its line; on a line without a key, the path of the table it is in
/// (or of the key whose multi-line value it continues).
pub fn toml_place_at(text: &str, offset: usize) -> TomlPlace {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let scan = scan(text);
    let upto = scan.entries.partition_point(|e| e.start <= offset);
    let field = scan.entries[..upto]
        .iter()
        .rev()
        .find_map(|e| scan.path(e))
        .unwrap_or_default();
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..line_start].matches('\n').count() + 1;
    place(text, line, offset, &field)
}

/// Where the field `path` (e.g. `policy.port[1].mac`) is defined: the line of its key, or of
/// its nearest ancestor that has a line of its own (an inline table's key, a table header).
/// `None` when no prefix of the path appears (a field left to its default).
pub fn toml_place_of(text: &str, path: &str) -> Option<TomlPlace> {
    let scan = scan(text);
    let mut want = path;
    loop {
        let found = scan
            .entries
            .iter()
            .enumerate()
            .find(|(_, e)| scan.defines(e, want));
        if let Some((i, e)) = found {
            return Some(place(text, i + 1, e.key_at, path));
        }
        // Drop the last segment: `a.b[2].c` -> `a.b[2]` -> `a.b` -> `a`.
        let cut = match (want.rfind('.'), want.ends_with(']')) {
            (_, true) => want.rfind('[')?,
            (Some(dot), false) => dot,
            (None, false) => return None,
        };
        want = &want[..cut];
        if want.is_empty() {
            return None;
        }
    }
}

/// One line for a TOML parse error in `text`: `line L, column C, field F: message`, the
/// parser's message bounded to [`MESSAGE_CHARS_MAX`] characters (serde quotes the value it
/// rejects, which may be a 200 KB string). For loaders that report the position in words (the
/// simulator's scenarios); the policy and testbed loaders keep line and column in their own
/// error types.
pub fn describe(text: &str, err: &toml::de::Error) -> String {
    let message = bounded(err.message().trim(), MESSAGE_CHARS_MAX);
    match err.span() {
        Some(span) => {
            let p = toml_place_at(text, span.start);
            if p.field.is_empty() {
                format!("line {}, column {}: {message}", p.line, p.column)
            } else {
                format!(
                    "line {}, column {}, field {}: {message}",
                    p.line, p.column, p.field
                )
            }
        }
        None => message.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[host]\nuplink_port = 0\n\n[[tenant]]\nid = 1\nsubnets = [\n  \"[x]\",\n]\nsnat = { public_ip = \"1.2.3.4\", port_min = 0 }\n[[tenant]]\nid = 2\n[[tenant.route]]\nprefix = \"0.0.0.0/0\"\n";

    #[test]
    fn places_follow_headers_arrays_and_multiline_values() {
        let at = |needle: &str| toml_place_at(TEXT, TEXT.find(needle).unwrap());
        assert_eq!(at("uplink_port").field, "host.uplink_port");
        let p = at("id = 2");
        assert_eq!(
            (p.line, p.column, p.field.as_str()),
            (11, 1, "tenant[1].id")
        );
        assert_eq!(at("\"[x]\"").field, "tenant[0].subnets");
        assert_eq!(at("prefix").field, "tenant[1].route[0].prefix");
        let p = toml_place_of(TEXT, "tenant[0].snat.port_min").unwrap();
        assert_eq!((p.line, p.column), (9, 1));
        assert_eq!(p.field, "tenant[0].snat.port_min");
        assert_eq!(
            toml_place_of(TEXT, "tenant[1].route[0].target")
                .unwrap()
                .line,
            12
        );
        assert_eq!(toml_place_of(TEXT, "port[0].mac"), None);
        // Offsets past the end or inside a character are clamped, not a panic.
        toml_place_at("é", 1);
        toml_place_at("", 10);
        // A long header above many keys: each key's path is not a copy of the header.
        let long = format!("[{}]\n{}", "a".repeat(10_000), "k = 1\n".repeat(10_000));
        let p = toml_place_at(&long, long.len() - 3);
        assert_eq!(p.line, 10_001);
        assert!(p.field.len() < 400, "{}", p.field.len());
    }

    #[test]
    fn echo_is_bounded_and_says_how_much_was_cut() {
        assert_eq!(echo("ab"), "\"ab\"");
        let long = "é".repeat(100_000);
        let e = echo(&long);
        assert!(e.chars().count() < ECHO_CHARS_MAX + 40, "{e}");
        assert!(e.ends_with("… (200000 bytes in all)"), "{e}");
        assert_eq!(bounded("abc", 3), "abc");
        assert_eq!(bounded("abcd", 3), "abc… (4 bytes in all)");
    }

    #[test]
    fn describe_names_line_column_and_field_and_bounds_the_value() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)] // only parsed, to provoke errors
        struct Doc {
            top: u32,
            vm: Vec<Vm>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Vm {
            port: u32,
        }
        let err = |text: &str| describe(text, &toml::from_str::<Doc>(text).unwrap_err());
        let e = err("top = 1\n[[vm]]\nport = 1\n[[vm]]\nport = \"x\"\n");
        assert!(
            e.starts_with("line 5, column 8, field vm[1].port: invalid type"),
            "{e}"
        );
        let big = "A".repeat(200_000);
        let e = err(&format!("top = \"{big}\"\nvm = []\n"));
        assert!(e.len() < 600, "{} bytes", e.len());
        assert!(e.contains("field top") && e.contains("bytes in all"), "{e}");
        assert!(err("top = 1\nvm = [\n").starts_with("line "));
    }
}
