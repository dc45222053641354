//! Text on the page: numbers in fixed precision (never "-0", "n/a" for what is not a number),
//! HTML escaping, and phase names as CSS class names. Every string the page shows goes through
//! here, which is what keeps the page a pure function of the reports.

/// A tick label in fixed precision, never "-0".
pub(super) fn fmt_tick(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    match s.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_string(),
        _ => s,
    }
}

/// A summary value in fixed precision, or "n/a" when it is not a number.
pub(super) fn fmt_f(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        fmt_tick(v, decimals)
    } else {
        "n/a".to_string()
    }
}

/// An optional summary value; `None` is shown as "n/a".
pub(super) fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| fmt_f(v, decimals))
}

/// Escapes text for HTML element content and double- or single-quoted attribute values.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A phase name reduced to the characters safe in a CSS class name.
pub(super) fn class_slug(phase: &str) -> String {
    phase
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}
