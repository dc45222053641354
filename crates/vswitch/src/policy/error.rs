//! [`ConfigError`]: why a policy file or [`super::PolicyConfig`] was rejected.

/// A rejected policy. Every variant names the source (file name or the `source` string given to
/// [`super::Policy::compile`]) and, where it has one, the field path such as `port[3].mac` or
/// `tenant[0].route[2].prefix`; `Display` reads `file: field: expected X, got Y`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read")]
    Io {
        /// The path.
        file: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// TOML syntax, a wrong type or an unknown field, as reported by the `toml` parser.
    #[error("{file}:{line}:{column}: {}{message}", field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
    Toml {
        /// The file.
        file: String,
        /// Field path at the error, e.g. `tenant[0].route[1].target`, reconstructed from the
        /// table headers above it (best effort: `None` when the error has no position).
        field: Option<String>,
        /// 1-based line of the error's span (0 when the parser gave no span).
        line: usize,
        /// 1-based column.
        column: usize,
        /// Byte range in the input, when known.
        span: Option<core::ops::Range<usize>>,
        /// The parser's message (e.g. "unknown field `foo`, expected one of ...").
        message: String,
    },
    /// A value of the wrong form or out of range.
    #[error("{file}: {field}: expected {expected}, got {found}")]
    Invalid {
        /// The file.
        file: String,
        /// Field path.
        field: String,
        /// What would have been accepted.
        expected: String,
        /// What was there.
        found: String,
    },
    /// An id, VNI, address or prefix defined twice where it must be unique.
    #[error("{file}: {field}: expected a unique {what}, got {value} which {first} already has")]
    Duplicate {
        /// The file.
        file: String,
        /// Field path of the second definition.
        field: String,
        /// What must be unique ("port id", "VNI", ...).
        what: &'static str,
        /// The repeated value.
        value: String,
        /// Field path of the first definition.
        first: String,
    },
    /// A reference to a tenant or security group that is not defined (or, for a group, belongs
    /// to another tenant).
    #[error("{file}: {field}: expected the id of a {what}, got {id}")]
    UnknownReference {
        /// The file.
        file: String,
        /// Field path of the reference.
        field: String,
        /// What it should name, e.g. "defined tenant" or "security group of tenant 1".
        what: String,
        /// The id given.
        id: u32,
    },
    /// A port address outside every subnet of its tenant.
    #[error(
        "{file}: {field}: expected an address inside tenant {tenant}'s subnets [{subnets}], got {ip}"
    )]
    AddressOutsideSubnets {
        /// The file.
        file: String,
        /// Field path.
        field: String,
        /// The port's tenant id.
        tenant: u32,
        /// The tenant's subnets, comma-separated.
        subnets: String,
        /// The address.
        ip: String,
    },
    /// A port carries more security-group rules than the classifier's memory bound allows.
    #[error("{file}: {field}: expected at most {max} rules across a port's groups, got {found}")]
    TooManyRules {
        /// The file.
        file: String,
        /// Field path of the port's group list.
        field: String,
        /// The limit.
        max: usize,
        /// The port's total.
        found: usize,
    },
}

impl ConfigError {
    /// The field path the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Io { .. } => None,
            ConfigError::Toml { field, .. } => field.as_deref(),
            ConfigError::Invalid { field, .. }
            | ConfigError::Duplicate { field, .. }
            | ConfigError::UnknownReference { field, .. }
            | ConfigError::AddressOutsideSubnets { field, .. }
            | ConfigError::TooManyRules { field, .. } => Some(field),
        }
    }

    /// Convert a `toml` error, computing line and column from its span.
    pub(crate) fn from_toml(file: &str, text: &str, e: &toml::de::Error) -> ConfigError {
        let span = e.span();
        let field = span
            .as_ref()
            .map(|r| field_path_at(text, r.start.min(text.len())));
        let (line, column) = match &span {
            Some(r) => {
                let before = &text[..r.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before
                    .rfind('\n')
                    .map_or(before.len(), |nl| before.len() - nl - 1)
                    + 1;
                (line, column)
            }
            None => (0, 0),
        };
        ConfigError::Toml {
            file: file.to_string(),
            field,
            line,
            column,
            span,
            message: e.message().trim().to_string(),
        }
    }
}

/// The field path of the key on the line holding `offset`, from the `[table]` and
/// `[[array]]` headers before it: `[[tenant]]` twice then `[[tenant.route]]` gives
/// `tenant[1].route[0]`. Best effort for error messages: a line without a key (inside a
/// multi-line array, a header) yields the table path alone.
fn field_path_at(text: &str, offset: usize) -> String {
    use std::collections::BTreeMap;
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    // Arrays of tables seen so far, by indexed path ("tenant[0].route"), with their lengths.
    let mut arrays: BTreeMap<String, usize> = BTreeMap::new();
    let mut table = String::new();
    let resolve = |name: &str, arrays: &BTreeMap<String, usize>| {
        let mut path = String::new();
        for seg in name.split('.').map(|s| s.trim().trim_matches('"')) {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(seg);
            if let Some(n) = arrays.get(&path) {
                path = format!("{path}[{}]", n.saturating_sub(1));
            }
        }
        path
    };
    for line in text[..line_start]
        .lines()
        .chain(core::iter::once(&text[line_start..line_end]))
    {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("[[") {
            let name = rest.split("]]").next().unwrap_or("").trim();
            let (parent, last) = match name.rsplit_once('.') {
                Some((p, l)) => (resolve(p, &arrays), l.trim().trim_matches('"')),
                None => (String::new(), name.trim_matches('"')),
            };
            let key = if parent.is_empty() {
                last.to_string()
            } else {
                format!("{parent}.{last}")
            };
            let n = arrays.entry(key.clone()).or_insert(0);
            *n += 1;
            table = format!("{key}[{}]", *n - 1);
        } else if let Some(rest) = t.strip_prefix('[') {
            table = resolve(rest.split(']').next().unwrap_or(""), &arrays);
        }
    }
    let line = text[line_start..line_end].trim();
    let key = if line.starts_with('[') || line.starts_with('#') {
        None
    } else {
        line.split_once('=')
            .map(|(k, _)| k.trim().trim_matches('"').to_string())
    };
    match (table.is_empty(), key) {
        (true, Some(k)) => k,
        (false, Some(k)) => format!("{table}.{k}"),
        (_, None) => table,
    }
}
