//! `[rls]`: the Envoy rate limit service's listener and its YAML descriptor files. The YAML
//! is loaded and checked here, so `check-config` and `serve` report its problems (file, line
//! and key of the YAML) like the TOML's.

use super::error::Reporter;
use super::fields::{field, one_of};
use super::raw::RawRls;
use super::validate::addr;
use super::{RlsSettings, ServerConfig, StoreConfig};
use crate::schema as key;
use std::path::{Path, PathBuf};
use tollgate_rls::{RlsOptions, RlsService};

pub(super) fn rls(
    r: &mut Reporter<'_>,
    raw: RawRls,
    server: &ServerConfig,
    store: &StoreConfig,
) -> Option<RlsSettings> {
    let listen = field(r, key::RLS_LISTEN, &raw.listen, None, |s| addr(s).map(Some));
    if let (Some(l), Some(s)) = (listen, &raw.listen) {
        if l == server.listen || l == server.admin_listen {
            r.at(
                s.span(),
                key::RLS_LISTEN,
                "must differ from server.listen and server.admin_listen",
            );
        }
    }
    let response_headers = field(
        r,
        key::RLS_RESPONSE_HEADERS,
        &raw.response_headers,
        true,
        |s| one_of(s, &[("draft", true), ("off", false)]),
    );
    let Some(config) = &raw.config else {
        r.at(
            0..0,
            key::RLS_CONFIG,
            "missing; expected the path of envoyproxy/ratelimit YAML file or a directory of them",
        );
        return None;
    };
    let path = resolve(r.file, config.get_ref());
    // A path that names nothing is this file's error (at `rls.config`); what is wrong inside
    // the YAML is the YAML's (its own file, line and key).
    if !path.exists() {
        r.at(
            config.span(),
            key::RLS_CONFIG,
            "does not exist; expected an envoyproxy/ratelimit YAML file or a directory of them (a relative path is relative to this file)",
        );
        return None;
    }
    let flag = |f: &super::raw::S<bool>| f.as_ref().is_some_and(|s| *s.get_ref());
    let load = tollgate_rls::config::LoadOptions {
        merge_domains: flag(&raw.merge_domains),
    };
    let rules = match tollgate_rls::config::load_dir_or_file_with(&path, load) {
        Ok(rules) => rules,
        Err(errors) => {
            r.errors.extend(errors.0);
            return None;
        }
    };
    let options = RlsOptions {
        on_failure: store.on_failure,
        local_divisor: store.local_divisor,
        response_headers,
        quota_mode: flag(&raw.quota_mode),
        shadow_mode: flag(&raw.shadow_mode),
        dynamic_metadata: flag(&raw.dynamic_metadata),
    };
    // The policies the service will register, checked by the library's rules now.
    for spec in RlsService::specs(&rules, &options).flatten() {
        if let Err(e) = spec.validate() {
            r.at(config.span(), key::RLS_CONFIG, e.to_string());
            return None;
        }
    }
    Some(RlsSettings {
        listen,
        config_path: path,
        config: rules,
        options,
        load,
    })
}

/// A relative path is relative to the directory of the TOML file naming it.
pub(super) fn resolve(toml_file: &str, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        return p.to_path_buf();
    }
    match Path::new(toml_file).parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(p),
        _ => p.to_path_buf(),
    }
}
