//! Wildcard values: `*` anywhere in a descriptor's `value` matches any run of characters,
//! the empty one included (envoyproxy/ratelimit's rule: trailing, in the middle, several).
//!
//! Matched in time linear in the value, whatever the pattern: the first literal part must
//! start the value and the last end it; each part between is found leftmost, in order, in
//! what is left (taking the leftmost occurrence never loses a match when `*` is the only
//! operator), with `str::find`, which does not backtrack. No allocation per match.

/// A `value` with at least one `*`, split on it when loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    /// The literal parts around each `*` (empty parts included): `a*b*` is `["a", "b", ""]`.
    parts: Vec<String>,
    /// The sum of the parts' lengths: a value shorter than this cannot match.
    fixed: usize,
}

impl Pattern {
    /// The pattern of `value`; `None` when it holds no `*` (an exact value).
    pub fn new(value: &str) -> Option<Self> {
        if !value.contains('*') {
            return None;
        }
        let parts: Vec<String> = value.split('*').map(str::to_string).collect();
        let fixed = parts.iter().map(String::len).sum();
        Some(Self {
            text: value.to_string(),
            parts,
            fixed,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        if value.len() < self.fixed || !value.starts_with(first.as_str()) {
            return false;
        }
        if !value.ends_with(last.as_str()) {
            return false;
        }
        // `fixed <= len` makes this range valid: first and last do not overlap.
        let Some(mut rest) = value.get(first.len()..value.len() - last.len()) else {
            return false;
        };
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, v: &str) -> bool {
        Pattern::new(p).expect("a pattern").matches(v)
    }

    #[test]
    fn stars_match_anywhere_and_may_match_nothing() {
        assert!(Pattern::new("foo").is_none());
        assert!(m("foo*", "foo") && m("foo*", "foo1") && !m("foo*", "fo"));
        assert!(m("bar*b", "barab") && m("bar*b", "bar123b") && m("bar*b", "barb"));
        assert!(!m("bar*b", "bara") && !m("bar*b", "xbarb"));
        assert!(m("foo*bar*baz", "foo123bar456baz") && m("foo*bar*baz", "foobarbaz"));
        assert!(!m("foo*bar*baz", "foo123baz") && !m("foo*bar*baz", "bar456baz"));
        assert!(m("*", "") && m("*", "anything") && m("**", "x"));
        assert!(m("/api/*/action", "/api/v1/action") && !m("/api/*/action", "/api/v1/other"));
        // The prefix and the suffix may not share characters.
        assert!(!m("ab*ba", "aba") && m("ab*ba", "abba"));
        assert!(m("*a*a*", "aa") && !m("*a*a*", "a"));
        // Multi-byte characters: parts are found on character boundaries.
        assert!(m("é*ü", "éxü") && !m("é*ü", "éx"));
    }

    #[test]
    fn a_long_value_against_many_stars_is_matched_without_backtracking() {
        // 64 KiB of `a` with no `b`: a backtracking matcher tries every split of `*a*a*a*a*b`.
        let value = "a".repeat(64 << 10);
        assert!(!m("*a*a*a*a*b", &value));
        assert!(m("*a*a*a*a*", &value));
        let mut almost = "ab".repeat(32 << 10);
        almost.push('c');
        assert!(!m("*a*b*a*b*a*b*d", &almost));
        assert!(m("*a*b*a*b*a*b*c", &almost));
    }
}
