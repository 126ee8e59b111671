//! envoyproxy/ratelimit's own configuration files (copied unchanged from the workspace's
//! `../shared/fixtures/envoyproxy/` into `tests/fixtures/envoyproxy/`):
//! every one gets envoyproxy's verdict (what its test/config/config_test.go expects), a
//! refusal names the file, the line and the key, and the accepted ones mean what envoyproxy's
//! tests say they mean (which rule a descriptor finds, and the stat key it counts under).

use std::path::PathBuf;
use tollgate_rls::config::{load_str, load_str_with, LoadOptions};
use tollgate_rls::{RlsConfig, RlsConfigErrors};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/envoyproxy")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn load_files(names: &[&str], merge: bool) -> Result<RlsConfig, RlsConfigErrors> {
    let texts: Vec<(String, String)> = names.iter().map(|n| ((*n).to_string(), read(n))).collect();
    load_str_with(
        texts.iter().map(|(n, t)| (n.as_str(), t.as_str())),
        LoadOptions {
            merge_domains: merge,
        },
    )
}

fn load(name: &str) -> Result<RlsConfig, RlsConfigErrors> {
    let text = read(name);
    load_str([(name, text.as_str())])
}

/// Every file alone: accepted, or refused at (line, key).
const VERDICTS: &[(&str, Option<(usize, &str)>)] = &[
    ("example_config.yaml", None),
    ("example_example.yaml", None),
    ("integration_another.yaml", None),
    ("integration_basic.yaml", None),
    ("integration_share_threshold.yaml", None),
    ("readme_01.yaml", None),
    ("readme_02.yaml", None),
    ("readme_03.yaml", None),
    ("readme_04.yaml", None),
    ("readme_05.yaml", None),
    ("readme_06.yaml", None),
    ("readme_07.yaml", None),
    ("readme_08.yaml", None),
    ("readme_09.yaml", None),
    ("readme_10.yaml", None),
    ("readme_11.yaml", None),
    ("readme_12.yaml", None),
    ("readme_13.yaml", None),
    ("readme_14.yaml", None),
    ("readme_15.yaml", None),
    ("readme_16.yaml", None),
    (
        "test_bad_limit_unit.yaml",
        Some((6, "descriptors[0].rate_limit.unit")),
    ),
    ("test_bad_yaml.yaml", Some((1, "(syntax)"))),
    ("test_basic_config.yaml", None),
    // Alone it is fine; next to basic_config it is a second definition of its domain.
    ("test_duplicate_domain.yaml", None),
    ("test_duplicate_key.yaml", Some((6, "descriptors[1]"))),
    ("test_empty_domain.yaml", Some((1, "domain"))),
    ("test_empty_key.yaml", Some((3, "descriptors[0].key"))),
    ("test_merge_domain_key1.yaml", None),
    ("test_merge_domain_key2.yaml", None),
    ("test_metadata.yaml", None),
    (
        "test_misspelled_key.yaml",
        Some((5, "descriptors[0].ratelimit")),
    ),
    (
        "test_misspelled_key2.yaml",
        Some((7, "descriptors[0].rate_limit.requestsperunit")),
    ),
    ("test_non_map_list.yaml", Some((3, "descriptors[0]"))),
    ("test_non_string_key.yaml", Some((1, "0.25"))),
    (
        "test_replaces_empty.yaml",
        Some((
            10,
            "descriptors[0].descriptors[0].rate_limit.replaces[0].name",
        )),
    ),
    (
        "test_replaces_self.yaml",
        Some((
            10,
            "descriptors[0].descriptors[0].rate_limit.replaces[0].name",
        )),
    ),
    ("test_shadowmode_config.yaml", None),
    ("test_share_threshold.yaml", None),
    (
        "test_unlimited_with_unit.yaml",
        Some((6, "descriptors[0].rate_limit.unit")),
    ),
    ("test_wildcard.yaml", None),
];

#[test]
fn every_fixture_gets_envoyproxys_verdict_with_file_line_and_key() {
    let mut on_disk: Vec<String> = std::fs::read_dir(dir())
        .expect("read the fixtures")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    let listed: Vec<String> = VERDICTS.iter().map(|(n, _)| (*n).to_string()).collect();
    assert_eq!(on_disk, listed, "every fixture has a verdict here");
    for (name, verdict) in VERDICTS {
        match (load(name), verdict) {
            (Ok(c), None) => {
                // One domain per file, the one it names.
                let domains: Vec<&str> = c.domains().collect();
                assert_eq!(domains.len(), 1, "{name}");
                let named = read(name)
                    .lines()
                    .find_map(|l| l.strip_prefix("domain:").map(|d| d.trim().to_string()))
                    .unwrap_or_default();
                assert_eq!(domains[0], named, "{name}");
            }
            (Err(e), Some((line, key))) => {
                let first = &e.0[0];
                assert_eq!(first.file, *name);
                assert_eq!(
                    (first.line, first.key.as_str()),
                    (*line, *key),
                    "{name}: {first}"
                );
            }
            (Ok(_), Some(_)) => panic!("{name}: accepted, envoyproxy refuses it"),
            (Err(e), None) => panic!("{name}: refused, envoyproxy accepts it: {e}"),
        }
    }
}

/// The copies are the shared originals, byte for byte, wherever the workspace has them.
#[test]
fn the_copies_equal_the_shared_fixtures() {
    let shared =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/envoyproxy");
    let Ok(entries) = std::fs::read_dir(&shared) else {
        return; // A checkout without the workspace's shared folder: the copies stand alone.
    };
    let mut compared = 0;
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".yaml") {
            continue;
        }
        let original = std::fs::read(e.path()).expect("read the shared fixture");
        let copy = std::fs::read(dir().join(&name)).unwrap_or_else(|_| panic!("{name} not copied"));
        assert_eq!(original, copy, "{name} differs from the shared one");
        compared += 1;
    }
    assert_eq!(compared, VERDICTS.len());
}

#[test]
fn a_domain_in_two_files_is_refused_unless_merged_and_a_merged_duplicate_still_is() {
    let e = load_files(
        &["test_basic_config.yaml", "test_duplicate_domain.yaml"],
        false,
    )
    .expect_err("duplicate domain");
    assert_eq!(
        (e.0[0].file.as_str(), e.0[0].key.as_str()),
        ("test_duplicate_domain.yaml", "domain")
    );
    let two = ["test_merge_domain_key1.yaml", "test_merge_domain_key2.yaml"];
    assert!(load_files(&two, false).is_err());
    let merged = load_files(&two, true).expect("merged");
    for key in ["key1", "key2"] {
        let value = if key == "key1" { "value1" } else { "value2" };
        assert!(
            merged
                .find("test-domain", [(key, value)].into_iter())
                .is_some(),
            "{key} from its own file"
        );
    }
    let e = load_files(
        &["test_merge_domain_key1.yaml", "test_merge_domain_key1.yaml"],
        true,
    )
    .expect_err("a descriptor twice");
    assert!(e.0[0].message.contains("duplicate"), "{}", e.0[0]);
}

fn policy(c: &RlsConfig, entries: &[(&str, &str)]) -> Option<String> {
    c.find("test-domain", entries.iter().copied())
        .map(|f| c.rules()[f.rule].policy_name.clone())
}

/// config_test.go's TestWildcardConfig, by stat key.
#[test]
fn wildcards_mean_what_envoyproxy_says() {
    let c = load("test_wildcard.yaml").expect("ok");
    let wild = Some("test-domain.wild_foo*".to_string());
    assert_eq!(policy(&c, &[("wild", "foo1")]), wild);
    assert_eq!(policy(&c, &[("wild", "foo2")]), wild);
    assert_eq!(
        policy(&c, &[("nestedWild", "val1"), ("wild", "goo2")]).as_deref(),
        Some("test-domain.nestedWild_val1.wild_goo*")
    );
    assert_eq!(policy(&c, &[("wild", "bar")]), None);
    assert_eq!(policy(&c, &[("noWild", "foo1")]), None, "no eager match");
    assert_eq!(
        policy(&c, &[("noVal", "foo1")]).as_deref(),
        Some("test-domain.noVal")
    );
    for v in ["barab", "bar123b", "barb"] {
        assert_eq!(
            policy(&c, &[("midWild", v)]).as_deref(),
            Some("test-domain.midWild_bar*b"),
            "{v}"
        );
    }
    for v in ["bara", "xbarb"] {
        assert_eq!(policy(&c, &[("midWild", v)]), None, "{v}");
    }
    for v in ["foo123bar456baz", "foobarbaz"] {
        assert_eq!(
            policy(&c, &[("multiWild", v)]).as_deref(),
            Some("test-domain.multiWild_foo*bar*baz"),
            "{v}"
        );
    }
    for v in ["foo123baz", "bar456baz"] {
        assert_eq!(policy(&c, &[("multiWild", v)]), None, "{v}");
    }
}

/// config_test.go's TestShareThreshold: which entries share (count as their pattern) and the
/// stat keys of share_threshold with value_to_metric and detailed_metric.
#[test]
fn share_threshold_means_what_envoyproxy_says() {
    let c = load("test_share_threshold.yaml").expect("ok");
    let find = |e: &[(&str, &str)]| c.find("test-domain", e.iter().copied()).expect("a rule");
    let f = find(&[("files", "files/a.txt")]);
    assert_eq!(f.shared, 0b1);
    assert_eq!(c.rules()[f.rule].policy_name, "test-domain.files_files/*");
    // An explicit value wins over a shared wildcard and shares nothing.
    let f = find(&[("file", "test1")]);
    assert_eq!(
        (f.shared, c.rules()[f.rule].policy_name.as_str()),
        (0, "test-domain.file_test1")
    );
    assert_eq!(find(&[("file", "test2")]).shared, 0b1);
    // Both levels shared; the mixed case shares only the level that asks.
    assert_eq!(
        find(&[("user", "user/1"), ("resource", "res/2"), ("action", "get")]).shared,
        0b011
    );
    assert_eq!(
        find(&[("path", "path/1"), ("file", "file/2"), ("type", "x")]).shared,
        0b001
    );
    assert_eq!(find(&[("midpath", "/api/foo/v1")]).shared, 0b1);
    assert_eq!(find(&[("multiroute", "svcXepYrpc")]).shared, 0b1);
    // Stat keys: share_threshold keeps the pattern even with value_to_metric; detailed_metric
    // writes the shared entry as its pattern and the others with their values.
    let entries = [("route", "api/v1"), ("method", "GET")];
    assert_eq!(
        c.metric_key("test-domain", &entries).as_deref(),
        Some("test-domain.route_api/*.method")
    );
    let entries = [("service", "svc/a"), ("endpoint", "/x")];
    assert_eq!(
        c.metric_key("test-domain", &entries).as_deref(),
        Some("test-domain.service_svc/*.endpoint_/x")
    );
    let entries = [("midroute", "/api/foo/v2")];
    assert_eq!(
        c.metric_key("test-domain", &entries).as_deref(),
        Some("test-domain.midroute_/api*v2")
    );
    // A rule without either flag: its policy name is its series, no key of request values.
    assert_eq!(c.metric_key("test-domain", &[("files", "files/a")]), None);
}

/// config_test.go's TestMetadata: the metadata of the matched descriptor's rule.
#[test]
fn metadata_belongs_to_the_rule_of_its_descriptor() {
    let c = load("test_metadata.yaml").expect("ok");
    let meta = |e: &[(&str, &str)]| {
        let f = c.find("test-domain", e.iter().copied()).expect("a rule");
        c.rules()[f.rule].metadata.clone()
    };
    let m = meta(&[("key1", "value1"), ("subkey1", "x")]).expect("metadata");
    assert_eq!(
        m.fields["name"].kind,
        Some(prost_types::value::Kind::StringValue("service_1".into()))
    );
    assert!(meta(&[("key1", "value1"), ("subkey1", "subvalue1")]).is_none());
    let m = meta(&[("key2", "x")]).expect("metadata");
    assert!(matches!(
        m.fields["service_with_quota"].kind,
        Some(prost_types::value::Kind::StructValue(_))
    ));
}

/// README examples with newer features load with their meaning: the ban list and quota mode.
#[test]
fn readme_ban_list_and_quota_examples_load_with_their_meaning() {
    use tollgate_rls::config::RuleLimit;
    let banned = ["readme_03.yaml", "example_example.yaml"]
        .iter()
        .filter_map(|n| load(n).ok())
        .flat_map(|c| c.rules().to_vec())
        .filter(|r| matches!(r.limit, RuleLimit::Blocked { .. }))
        .count();
    assert!(banned >= 2, "requests_per_unit: 0 is a ban: {banned}");
    let quota = VERDICTS
        .iter()
        .filter(|(_, v)| v.is_none())
        .filter_map(|(n, _)| load(n).ok())
        .flat_map(|c| c.rules().to_vec())
        .filter(|r| r.quota)
        .count();
    let written = VERDICTS
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(n, _)| read(n).matches("quota_mode: true").count())
        .sum::<usize>();
    assert_eq!(quota, written, "every quota_mode: true is a quota rule");
}
