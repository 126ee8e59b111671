//! Property-based fuzzing of the config parser and validator: arbitrary text and mutated valid
//! files never panic, and every error carries the file, a line inside the text, a column, a
//! key and a bounded message. 256 cases per property in the normal suite; more with
//! `PROPTEST_CASES=100000 cargo nextest run -p tollgate-config fuzz`.
//!
//! The generators are public behind the `fuzz` feature: the gateway runs the same corpus
//! through `assemble` to show that whatever `check-config` accepts, `serve` can build.

#[cfg(test)]
use super::error::ConfigError;
#[cfg(test)]
use super::validate::validate;
use proptest::prelude::*;

/// The number of cases per property: 256, or `PROPTEST_CASES`.
pub fn cases() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// A file beside docs/tollgate.example.toml, so that its `[rls] config` (relative to the file)
/// resolves to docs/ratelimit.example.yaml.
pub const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/fuzz.toml");

/// The environment the corpus is validated in: `SET` (and the example's variables) set.
pub fn env(name: &str) -> Option<String> {
    match name {
        "SET" | "TOLLGATE_SECRET" => Some("v".to_string()),
        "ADMIN_TOKEN" => Some("an-admin-token-of-some-length".to_string()),
        _ => None,
    }
}

/// Validates `text` and checks the shape of the outcome.
#[cfg(test)]
fn check(text: &str) -> Result<(), TestCaseError> {
    let lines = text.split('\n').count();
    match validate(FILE, text, env) {
        Ok(c) => {
            prop_assert_eq!(c.origin.as_str(), FILE);
            for p in &c.policies {
                prop_assert!(p.spec.cost >= 1);
                prop_assert!(p.path_prefix.starts_with('/'));
            }
        }
        Err(errors) => {
            prop_assert!(!errors.0.is_empty());
            for e in &errors.0 {
                check_error(e, lines)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
fn check_error(e: &ConfigError, lines: usize) -> Result<(), TestCaseError> {
    if e.file != FILE {
        // An error inside a file the config names (the [rls] YAML, the overrides file) carries
        // that file's name and its own lines; such files sit beside the config.
        let dir = std::path::Path::new(FILE).parent();
        prop_assert_eq!(std::path::Path::new(&e.file).parent(), dir, "{}", e);
        let own = std::fs::read_to_string(&e.file).map_or(1, |t| t.split('\n').count());
        prop_assert!(e.line >= 1 && e.line <= own.max(1), "{e}");
        prop_assert!(!e.key.is_empty() && !e.message.is_empty(), "{e}");
        return Ok(());
    }
    prop_assert_eq!(e.file.as_str(), FILE);
    prop_assert!(
        e.line >= 1 && e.line <= lines,
        "line {} of {lines}: {e}",
        e.line
    );
    prop_assert!(e.col >= 1, "{e}");
    prop_assert!(!e.key.is_empty(), "{e}");
    prop_assert!(!e.message.is_empty(), "{e}");
    let shown = e.to_string();
    let prefix = format!("error: {FILE}:{}:{}: ", e.line, e.col);
    prop_assert!(shown.starts_with(&prefix), "{shown}");
    prop_assert!(shown.chars().count() < 1_200, "{} characters", shown.len());
    Ok(())
}

/// Pieces that TOML is made of and values that probe the rules; the key names come from the
/// schema ([`crate::schema::words`]), so a new key is fuzzed without touching this list.
const PIECES: &[&str] = &[
    "[server]",
    "[store]",
    "[identity]",
    "[[policy]]",
    "[policy]",
    "[[server]]",
    "\n",
    "\n",
    " ",
    "=",
    " = ",
    "\"",
    "'",
    "[",
    "]",
    "{",
    "}",
    ",",
    "#",
    "\"\"\"",
    "\"redis-sentinel\"",
    "\"redis://h:1\"",
    "\"redis://%%%\"",
    "\"0.0.0.0/0\"",
    "\"::/0\"",
    "\"gcra\"",
    "\"1m\"",
    "\"0s\"",
    "\"99999999h\"",
    "0",
    "-1",
    "1",
    "9223372036854775807",
    "1e9",
    "true",
    "\"${SET}\"",
    "\"${UNSET}\"",
    "\"${",
    "é",
    "\u{0}",
    "\u{feff}",
    "😀",
    "\\",
    "\r\n",
    "\t",
    "\"lease\"",
    "\"500us\"",
    "\"1us\"",
    "\"local\"",
    "\"header:x-plan\"",
    "\"sliding_window_log\"",
    "[rls]",
    "[overrides]",
    "tiers.pro",
    "{ limit = 1 }",
];

/// The fuzzer's tokens: the fixed pieces (`PIECES`) and every word of the schema's keys.
pub fn tokens() -> Vec<&'static str> {
    let mut out = PIECES.to_vec();
    out.extend(crate::schema::words());
    out
}

/// Text made of [`tokens`].
pub fn token_text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(tokens()), 0..80).prop_map(|t| t.concat())
}

/// Valid files the mutations start from.
pub const VALID: &[&str] = &[
    include_str!("../../../docs/tollgate.example.toml"),
    "[[policy]]\nname = \"l\"\nalgorithm = \"gcra\"\nlimit = 50\nperiod = \"1s\"\nburst = 10\ncost = 2\nsync = \"lease\"\nlease_ttl = \"2ms\"\nlease_max = 5\non_failure = \"local\"\nlocal_divisor = 3\ntier = \"header:x-plan\"\ntiers.pro = { limit = 500, burst = 40 }\n",
    "[store]\nbackend = \"redis-sentinel\"\nurls = [\"redis://a:1\", \"redis://:p@b:2\"]\nmaster_name = \"m\"\n[identity]\ntrusted_proxies = [\"10.0.0.0/8\"]\nsecret = \"${SET}\"\n[[policy]]\nname = \"a\"\nalgorithm = \"token_bucket\"\nlimit = 5\nperiod = \"1s\"\ncost = 2\n",
];

/// One edit of a valid file: at a position (a fraction of its length), delete some
/// characters, insert a token, or both.
#[derive(Debug, Clone)]
pub struct Edit {
    at: f64,
    delete: usize,
    insert: Option<&'static str>,
}

/// A few edits.
pub fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(
        (
            0.0..1.0f64,
            0..6usize,
            prop::option::of(prop::sample::select(tokens())),
        )
            .prop_map(|(at, delete, insert)| Edit { at, delete, insert }),
        1..6,
    )
}

/// `base` with `edits` applied.
pub fn apply(base: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = base.chars().collect();
    for e in edits {
        // Truncation is the point: a fraction of the length picks the position.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let at = ((chars.len() as f64) * e.at) as usize;
        let at = at.min(chars.len());
        let end = (at + e.delete).min(chars.len());
        chars.drain(at..end);
        if let Some(t) = e.insert {
            for (i, c) in t.chars().enumerate() {
                chars.insert(at + i, c);
            }
        }
    }
    chars.into_iter().collect()
}

/// Valid files with a few edits: most stay near validity, where the rules are probed.
pub fn near_valid() -> impl Strategy<Value = String> {
    (prop::sample::select(VALID), edits()).prop_map(|(base, e)| apply(base, &e))
}

/// The whole corpus: near-valid files and token soup.
pub fn corpus() -> impl Strategy<Value = String> {
    prop_oneof![near_valid(), token_text()]
}

#[cfg(test)]
proptest! {
    #![proptest_config(cases())]

    #[test]
    fn arbitrary_text_never_panics_and_errors_carry_file_and_line(text in "(?s).{0,300}") {
        check(&text)?;
    }

    #[test]
    fn token_soup_never_panics_and_errors_carry_file_and_line(text in token_text()) {
        check(&text)?;
    }

    #[test]
    fn mutated_valid_configs_never_panic_and_errors_carry_file_and_line(
        base in prop::sample::select(VALID),
        edits in edits(),
    ) {
        check(&apply(base, &edits))?;
    }

    #[test]
    fn huge_values_are_cut_in_errors(len in 300..20_000usize, key in prop::sample::select(&["listen", "upstream", "upstream_timeout"][..])) {
        let text = format!("[server]\n{key} = \"{}\"\n", "z".repeat(len));
        check(&text)?;
        // The value is echoed at most 200 characters long, whatever its length.
        let env = |_: &str| None;
        let errors = validate(FILE, &text, env).expect_err("not a valid value");
        let longest = errors
            .0
            .iter()
            .flat_map(|e| e.message.split(|c: char| c != 'z'))
            .map(str::len)
            .max()
            .unwrap_or(0);
        prop_assert!(longest <= 200, "{longest} characters of the value echoed");
    }
}

#[test]
fn the_valid_bases_are_valid() {
    for text in VALID {
        let v = validate(FILE, text, env);
        assert!(v.is_ok(), "{text}: {:?}", v.err());
    }
}
