//! What `check-config` accepts, `serve` builds: every file of the config fuzz corpus that
//! validates also assembles (its policies, tiers, overrides and RLS rules registered with a
//! limiter), because the config checks each rule with the library's own constructors instead of
//! a copy of them. Before that was so, `lease_ttl = "500us"` passed check-config and made serve
//! exit 1.

use proptest::prelude::*;
use tollgate_config::fuzz;
use tollgate_gateway::assemble::{assemble, limiter};
use tollgate_gateway::config::Config;

fn assembles(text: &str) -> Result<(), TestCaseError> {
    let Ok(config) = Config::parse_with_env(fuzz::FILE, text, fuzz::env) else {
        return Ok(());
    };
    // A Redis limiter connects lazily; its background tasks need a runtime to be spawned on.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let _in_runtime = rt.enter();
    let limiter = limiter(&config);
    if let Err(e) = assemble(&config, &limiter) {
        return Err(TestCaseError::fail(format!(
            "check-config accepted this, serve refuses it: {e}\n{text}"
        )));
    }
    Ok(())
}

proptest! {
    #![proptest_config(fuzz::cases())]

    #[test]
    fn every_config_check_config_accepts_assembles(text in fuzz::corpus()) {
        assembles(&text)?;
    }
}

#[test]
fn the_corpus_bases_validate_and_assemble() {
    for text in fuzz::VALID {
        assert!(
            Config::parse_with_env(fuzz::FILE, text, fuzz::env).is_ok(),
            "{text}"
        );
        assembles(text).expect("assembles");
    }
}

#[test]
fn a_lease_ttl_below_the_limiters_minimum_is_refused_by_the_check_not_by_serve() {
    let text = "[[policy]]\nname = \"api\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1s\"\nsync = \"lease\"\nlease_ttl = \"500us\"\n";
    let errors = Config::parse_with_env("t.toml", text, |_| None).expect_err("refused");
    let shown = errors.to_string();
    assert!(
        shown.starts_with("error: t.toml:7:13: policy[0].lease_ttl: "),
        "{shown}"
    );
}

/// The property above holds only as far as the corpus reaches valid files: with a fixed seed,
/// a fair share of the mutated files must validate (and each of them must assemble), or the
/// property would pass on a corpus of nothing but errors.
#[test]
fn the_corpus_reaches_valid_configs_and_each_assembles() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config as RunnerConfig, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        RunnerConfig::default(),
        TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let strategy = fuzz::near_valid();
    let mut valid = 0;
    for _ in 0..200 {
        let text = strategy.new_tree(&mut runner).expect("a sample").current();
        if Config::parse_with_env(fuzz::FILE, &text, fuzz::env).is_ok() {
            valid += 1;
            assembles(&text).expect("assembles");
        }
    }
    assert!(valid >= 10, "only {valid} of 200 mutated files validate");
}
