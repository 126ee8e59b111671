//! Configuration errors that point at the file, line and key, and say what is allowed.

use std::fmt;
use std::ops::Range;

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `<built-in>`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// The key, e.g. `policy[0].limit`.
    pub key: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "error: {}:{}:{}: {}: {}",
            self.file, self.line, self.col, self.key, self.message
        )
    }
}

/// An RLS YAML problem is reported like a TOML one: same file, line, column, key, message.
impl From<tollgate_rls::RlsConfigError> for ConfigError {
    fn from(e: tollgate_rls::RlsConfigError) -> Self {
        let tollgate_rls::RlsConfigError {
            file,
            line,
            col,
            key,
            message,
        } = e;
        Self {
            file,
            line,
            col,
            key,
            message,
        }
    }
}

/// Every problem found in one file.
#[derive(Debug, Clone)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

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
    /// [`cut`]), so a 50 MB value is not echoed back whole.
    pub fn at(&mut self, span: Range<usize>, key: impl Into<String>, message: impl Into<String>) {
        let (line, col) = line_col(self.text, span.start);
        self.errors.push(ConfigError {
            file: self.file.to_string(),
            line,
            col,
            key: cut(&key.into(), MAX_QUOTED, 0),
            message: cut(&message.into(), MAX_QUOTED, MAX_HELP),
        });
    }

    /// A parse error from the TOML deserializer: the key is recovered from the text.
    pub fn parse_error(&mut self, err: &toml::de::Error) {
        let span = err.span().unwrap_or(0..0);
        let key = key_at(self.text, span.clone());
        let message = err.message().trim().replace('\n', " ");
        self.at(span, key, message);
    }
}

/// The most characters of a value an error repeats.
pub(crate) const MAX_QUOTED: usize = 200;
/// The most characters kept after the cut: the end of a message says what is allowed.
const MAX_HELP: usize = 300;

/// `message` unchanged when it is short; otherwise its first `head` characters (where a
/// quoted value starts), a note of how much was left out, and what follows the quoted value
/// when that is at most `tail` characters (the help: what is allowed).
pub(crate) fn cut(message: &str, head: usize, tail: usize) -> String {
    let chars: Vec<char> = message.chars().collect();
    let n = chars.len();
    if n <= head + tail + 40 {
        return message.to_string();
    }
    // The end of the last quoted value: a `"` followed by `;`, `:`, `,` or a space.
    let from = n.saturating_sub(tail);
    let rest = (from.max(head)..n.saturating_sub(1))
        .rev()
        .find(|&i| chars[i] == '"' && matches!(chars[i + 1], ';' | ':' | ',' | ' '))
        .map_or(n, |i| i);
    let first: String = chars[..head].iter().collect();
    let last: String = chars[rest..].iter().collect();
    format!("{first}... ({} characters cut){last}", rest - head)
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
    let mut policy_index: i64 = -1;
    for l in text.get(..line_end).unwrap_or("").lines() {
        let t = l.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            let name = name.trim();
            if name == "policy" {
                policy_index += 1;
            }
            table = format!("{name}[{}]", policy_index.max(0));
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
}
