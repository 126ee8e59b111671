//! Configuration errors that point at the file, line and key, and say what is allowed.

use std::ops::Range;

/// One problem in a configuration file, and every problem found: the RLS crate's types, so a
/// problem in the TOML file and one in an RLS YAML file it names are reported alike.
pub use tollgate_rls::{RlsConfigError as ConfigError, RlsConfigErrors as ConfigErrors};

/// Collects errors against one source text.
pub(crate) struct Reporter<'a> {
    pub file: &'a str,
    pub text: &'a str,
    pub errors: Vec<ConfigError>,
}

impl<'a> Reporter<'a> {
    pub fn new(file: &'a str, text: &'a str) -> Self {
        Self {
            file,
            text,
            errors: Vec::new(),
        }
    }

    /// Records an error at byte `span` for `key`. A value quoted in the message is cut (see
    /// [`ConfigError::at`]), so a 50 MB value is not echoed back whole.
    pub fn at(&mut self, span: Range<usize>, key: impl Into<String>, message: impl Into<String>) {
        let (line, col) = line_col(self.text, span.start);
        self.errors
            .push(ConfigError::at(self.file, line, col, key, message));
    }

    /// A parse error from the TOML deserializer: the key is recovered from the text.
    pub fn parse_error(&mut self, err: &toml::de::Error) {
        let span = err.span().unwrap_or(0..0);
        let key = key_at(self.text, span.clone());
        let message = without_value(&err.message().trim().replace('\n', " "));
        self.at(span, key, message);
    }
}

/// A deserializer's message without the value it quotes: serde says `invalid type: integer
/// `98765432109876543`, expected a string`, and the key may be a secret (`admin_token`), so
/// only the kind of value written is kept. Errors name the key and say what is allowed; they
/// never repeat what the key held.
pub(crate) fn without_value(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let kind = rest.split(['`', '"', ',']).next().unwrap_or("").trim();
            return match rest.rsplit_once(", expected ") {
                Some((_, expected)) => format!("{prefix}{kind}, expected {expected}"),
                None => format!("{prefix}{kind}"),
            };
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        return match rest.rsplit_once(", expected ") {
            Some((_, expected)) => format!("unknown variant, expected {expected}"),
            None => "unknown variant".to_string(),
        };
    }
    message.to_string()
}

/// 1-based line and column of byte `offset`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, col)
}

/// The dotted key at `span`, recovered from the text: the table header above it (with an
/// index for arrays of tables) and the key on its line.
pub(crate) fn key_at(text: &str, span: Range<usize>) -> String {
    let start = span.start.min(text.len());
    let line_start = text
        .get(..start)
        .and_then(|t| t.rfind('\n'))
        .map_or(0, |i| i + 1);
    let line_end = text
        .get(start..)
        .and_then(|t| t.find('\n'))
        .map_or(text.len(), |i| start + i);
    let line = text.get(line_start..line_end).unwrap_or("").trim();
    let mut table = String::new();
    // How many entries of each array of tables (`[[policy]]`, `[[override]]`) came so far.
    let mut seen: Vec<(String, usize)> = Vec::new();
    for l in text.get(..line_end).unwrap_or("").lines() {
        let t = l.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            let name = name.trim();
            let index = match seen.iter_mut().find(|(n, _)| n == name) {
                Some((_, count)) => {
                    *count += 1;
                    *count - 1
                }
                None => {
                    seen.push((name.to_string(), 1));
                    0
                }
            };
            table = format!("{name}[{index}]");
        } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.split(']').next()) {
            table = name.trim().to_string();
        }
    }
    let spanned = text.get(span.clone()).unwrap_or("").trim();
    let bare = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    let key = if line.starts_with('[') {
        if bare(spanned) {
            spanned.to_string()
        } else {
            String::new()
        }
    } else if bare(spanned) && line.starts_with(spanned) {
        spanned.to_string()
    } else {
        line.split('=').next().unwrap_or("").trim().to_string()
    };
    match (table.is_empty(), key.is_empty()) {
        (true, true) => "(top level)".to_string(),
        (true, false) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_columns_are_one_based() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn keys_are_recovered_with_their_table() {
        let text = "[server]\nlisten = 1\n[[policy]]\nname='a'\n[[policy]]\nlimt = 5\n";
        let at = text.find("limt").unwrap_or(0);
        assert_eq!(key_at(text, at..at + 4), "policy[1].limt");
        let at = text.find('1').unwrap_or(0);
        assert_eq!(key_at(text, at..at + 1), "server.listen");
    }

    #[test]
    fn every_array_of_tables_is_counted_on_its_own() {
        let text =
            "[[override]]\nlimit = 1\n[[override]]\nlimit = 2\n[[override]]\nlimit = \"x\"\n";
        let at = text.find("\"x\"").unwrap_or(0);
        assert_eq!(key_at(text, at..at + 3), "override[2].limit");
    }

    #[test]
    fn a_type_error_names_the_kind_of_value_never_the_value() {
        let m = without_value("invalid type: integer `98765432109876543`, expected a string");
        assert_eq!(m, "invalid type: integer, expected a string");
        let m = without_value("invalid type: string \"hunter2, expected x\", expected a boolean");
        assert_eq!(m, "invalid type: string, expected a boolean");
        let m = without_value("unknown variant `s3cr3t`, expected one of `a`, `b`");
        assert_eq!(m, "unknown variant, expected one of `a`, `b`");
        assert_eq!(
            without_value("missing field `name`"),
            "missing field `name`"
        );
    }
}
