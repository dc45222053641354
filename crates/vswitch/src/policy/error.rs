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

    /// What was expected and what was found, for a variant that has them (not `Io`/`Toml`),
    /// worded as the `Display` form words them; a configuration that embeds a policy (a
    /// testbed file) uses it to report the error under its own field path and line.
    pub fn expected_found(&self) -> Option<(String, String)> {
        match self {
            ConfigError::Io { .. } | ConfigError::Toml { .. } => None,
            ConfigError::Invalid {
                expected, found, ..
            } => Some((expected.clone(), found.clone())),
            ConfigError::Duplicate {
                what, value, first, ..
            } => Some((
                format!("a unique {what}"),
                format!("{value} which {first} already has"),
            )),
            ConfigError::UnknownReference { what, id, .. } => {
                Some((format!("the id of a {what}"), id.to_string()))
            }
            ConfigError::AddressOutsideSubnets {
                tenant,
                subnets,
                ip,
                ..
            } => Some((
                format!("an address inside tenant {tenant}'s subnets [{subnets}]"),
                ip.clone(),
            )),
            ConfigError::TooManyRules { max, found, .. } => Some((
                format!("at most {max} rules across a port's groups"),
                found.to_string(),
            )),
        }
    }

    /// Convert a `toml` error, computing line, column and field path from its span (see
    /// [`super::diag`]); the parser's message is bounded, since serde's quote the value.
    pub(crate) fn from_toml(file: &str, text: &str, e: &toml::de::Error) -> ConfigError {
        let span = e.span();
        let (field, line, column) = match &span {
            Some(r) => {
                let p = super::diag::toml_place_at(text, r.start);
                (Some(p.field).filter(|f| !f.is_empty()), p.line, p.column)
            }
            None => (None, 0, 0),
        };
        ConfigError::Toml {
            file: file.to_string(),
            field,
            line,
            column,
            span,
            message: super::diag::bounded(e.message().trim(), super::diag::MESSAGE_CHARS_MAX)
                .into_owned(),
        }
    }
}
