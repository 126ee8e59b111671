//! The store over TLS (`rediss://`) against a real redis-server with a TLS port: decisions go
//! through it, and the server certificate is verified (its name and its issuer).
//!
//! redis-rs (rustls) builds its root store on every connect from rustls-native-certs, which
//! reads only `SSL_CERT_FILE` when it is set. Each test sets it before its first connection.
//! That is safe under nextest, which runs every test in its own process; `ENV_LOCK`
//! serializes the tests when `cargo test` runs them as threads of one process.

mod common;

use common::{client, rule};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, MutexGuard};
use tollgate_core::{Algorithm, Check};
use tollgate_redis::{RedisConfig, RedisStore, RedisStoreError};
use tollgate_testkit::{redis_cli, RedisCluster, RedisServer};

const HOUR: Duration = Duration::from_secs(3600);
const PASSWORD: &str = "tls-pw-6f2c91";
/// Every network await is bounded by this: a hang fails the test instead of stalling it.
const BOUND: Duration = Duration::from_secs(5);

static ENV_LOCK: Mutex<()> = Mutex::const_new(());

/// A CA, a server certificate it signed and an unrelated CA, as PEM files in a directory
/// removed on drop.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("tollgate-tls-test-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the certificate dir");
        let pki = Self { dir };
        let ca = new_ca("tollgate test CA");
        let other = new_ca("tollgate unrelated CA");
        let mut params = CertificateParams::default();
        // The only name: IP 127.0.0.1. The CN says localhost, which a verifier must ignore.
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // Client too: a Cluster's nodes present it to each other on their TLS bus.
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &*ca).expect("server certificate");
        pki.write("ca.pem", &ca.pem());
        pki.write("other-ca.pem", &other.pem());
        pki.write("server.pem", &cert.pem());
        pki.write("server.key", &key.serialize_pem());
        pki
    }

    fn write(&self, name: &str, pem: &str) {
        std::fs::write(self.dir.join(name), pem).expect("write a PEM file");
    }

    fn path(&self, name: &str) -> String {
        self.dir
            .join(name)
            .to_str()
            .expect("a UTF-8 temp path")
            .to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA")
}

/// Takes the lock, then makes `ca_file` the only root redis-rs trusts.
async fn trust_only(ca_file: &str) -> MutexGuard<'static, ()> {
    let guard = ENV_LOCK.lock().await;
    std::env::set_var("SSL_CERT_FILE", ca_file);
    std::env::remove_var("SSL_CERT_DIR");
    guard
}

/// A server with a password, its plain port and a TLS port serving `server.pem`; the server
/// and its TLS port.
fn start_tls_server(pki: &Pki) -> (RedisServer, u16) {
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let server = RedisServer::start_with_args(&[
        "--requirepass",
        PASSWORD,
        "--tls-port",
        "{tls}",
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-auth-clients",
        "no",
    ]);
    let tls_port = server.tls_port().expect("started with {tls}");
    (server, tls_port)
}

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {BOUND:?}"),
    }
}

/// Connects and pings, so a lazy connection cannot hide a failure.
async fn connect_and_ping(url: &str) -> Result<RedisStore, RedisStoreError> {
    let store = bounded("connect", RedisStore::connect(RedisConfig::standalone(url))).await?;
    bounded("ping", store.ping()).await?;
    Ok(store)
}

fn assert_no_password(err: &RedisStoreError) {
    for shown in [format!("{err}"), format!("{err:?}")] {
        assert!(
            !shown.contains(PASSWORD),
            "errors do not print passwords: {shown}"
        );
    }
}

/// Connecting to `url` fails with an error that says `why`, and shows no password.
async fn assert_refused(url: &str, why: &str) {
    let Err(err) = connect_and_ping(url).await else {
        panic!("connected; expected a refusal: {why}");
    };
    let shown = format!("{err}");
    assert!(shown.contains(why), "{why:?} in {shown}");
    assert_no_password(&err);
}

#[tokio::test]
async fn decisions_go_through_the_tls_port() {
    let pki = Pki::new("decisions");
    let _env = trust_only(&pki.path("ca.pem")).await;
    let (mut server, tls_port) = start_tls_server(&pki);
    assert_ne!(tls_port, server.port());
    assert_eq!(
        server.tls_url(),
        Some(format!("rediss://127.0.0.1:{tls_port}"))
    );
    let url = format!("rediss://:{PASSWORD}@127.0.0.1:{tls_port}");
    let store = connect_and_ping(&url)
        .await
        .expect("the store connects over TLS");

    let r = rule("tls", Algorithm::Gcra, 2, HOUR);
    let who = client(1);
    let mut allowed = Vec::new();
    for _ in 0..3 {
        let v = bounded("check", store.check(&[Check::new(who, &r, 1)], 0))
            .await
            .expect("check over TLS");
        allowed.push(v.allowed);
    }
    assert_eq!(allowed, [true, true, false], "limit 2 per hour");

    // Through the plain port: the state the checks wrote, and the store's connection
    // accepted on the TLS port.
    let cli = |args: &[&str]| server.cli(&[&["-a", PASSWORD, "--no-auth-warning"], args].concat());
    let key = store.key(&who, r.name());
    assert_eq!(cli(&["exists", &key]).trim(), "1", "the state key exists");
    let pttl: i64 = cli(&["pttl", &key]).trim().parse().expect("pttl");
    assert!(pttl > 0, "the state key expires: pttl {pttl}");
    let clients = cli(&["client", "list"]);
    assert!(
        clients.contains(&format!("laddr=127.0.0.1:{tls_port} ")),
        "a client on the TLS port: {clients}"
    );

    // The TLS port speaks only TLS: a plain client fails, and fast.
    let err = connect_and_ping(&format!("redis://:{PASSWORD}@127.0.0.1:{tls_port}"))
        .await
        .expect_err("plain RESP to the TLS port fails");
    assert_no_password(&err);

    // A restart keeps the TLS port, and the store reconnects over TLS by itself.
    server.restart();
    assert_eq!(server.tls_port(), Some(tls_port));
    let mut last = None;
    for _ in 0..50 {
        match bounded("ping", store.ping()).await {
            Ok(()) => {
                last = None;
                break;
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last.is_none(), "no reconnect over TLS: {last:?}");
    let v = bounded("check", store.check(&[Check::new(who, &r, 1)], 0))
        .await
        .expect("check after the restart");
    assert!(v.allowed, "the restarted server is empty");
}

#[tokio::test]
async fn a_name_the_certificate_does_not_carry_is_refused() {
    let pki = Pki::new("name");
    let _env = trust_only(&pki.path("ca.pem")).await;
    let (_server, port) = start_tls_server(&pki);
    // Same roots, the certificate's own name: this connects.
    connect_and_ping(&format!("rediss://:{PASSWORD}@127.0.0.1:{port}"))
        .await
        .expect("127.0.0.1 is the certificate's name");
    // localhost is 127.0.0.1 too, but only the CN says localhost, not a SAN: refused.
    assert_refused(
        &format!("rediss://:{PASSWORD}@localhost:{port}"),
        "certificate not valid for name \"localhost\"",
    )
    .await;
}

#[tokio::test]
async fn a_certificate_from_an_untrusted_ca_is_refused() {
    let pki = Pki::new("issuer");
    let _env = trust_only(&pki.path("other-ca.pem")).await;
    let (_server, port) = start_tls_server(&pki);
    // The server's TLS works for a client that trusts its CA (redis-cli, OpenSSL).
    let pong = redis_cli(
        port,
        &[
            "--tls",
            "--cacert",
            &pki.path("ca.pem"),
            "-a",
            PASSWORD,
            "--no-auth-warning",
            "ping",
        ],
    );
    assert_eq!(pong.trim(), "PONG", "redis-cli over TLS with the right CA");
    // The server's CA is not trusted.
    assert_refused(
        &format!("rediss://:{PASSWORD}@127.0.0.1:{port}"),
        "UnknownIssuer",
    )
    .await;
}

/// A Redis Cluster over TLS (`tls-cluster yes`: each node gives a TLS client the TLS ports of
/// its peers). Every master's coalesced calls go on the store's own connection to the address
/// the node table gives, over TLS with the node's certificate verified (its IP is the name the
/// table gives), and concurrent plans of one client are decided exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_cluster_gives_each_master_its_own_tls_connection() {
    let pki = Pki::new("cluster");
    let _env = trust_only(&pki.path("ca.pem")).await;
    let (cert, key, ca) = (
        pki.path("server.pem"),
        pki.path("server.key"),
        pki.path("ca.pem"),
    );
    let cluster = RedisCluster::start_with_args(
        3,
        0,
        &[
            "--tls-port",
            "{tls}",
            "--tls-cluster",
            "yes",
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ],
    );
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.tls_url().expect("a TLS port"))
        .collect();
    let store = bounded("connect", RedisStore::connect(RedisConfig::cluster(urls)))
        .await
        .expect("the store connects to the Cluster over TLS");
    let store = Arc::new(store);
    let r = rule("tls-cluster", Algorithm::TokenBucket, 10, HOUR);
    let masters = cluster.master_indices();
    for &m in &masters {
        let who = common::clients_of(&cluster, m, 1)
            .next()
            .expect("a client of this master");
        // Forty at once on a limit of ten: they queue behind the first and leave in batches.
        let calls: Vec<_> = (0..40)
            .map(|_| {
                let (store, r) = (Arc::clone(&store), r.clone());
                tokio::spawn(async move { store.check(&[Check::new(client(who), &r, 1)], 0).await })
            })
            .collect();
        let mut allowed = 0;
        for call in calls {
            let v = bounded("check", call)
                .await
                .expect("the task ran")
                .expect("a decision over TLS");
            allowed += usize::from(v.allowed);
        }
        assert_eq!(allowed, 10, "master {m}: exactly the limit of client {who}");
    }
    for &m in &masters {
        let node = &cluster.nodes()[m];
        let tls = node.tls_port().expect("a TLS port");
        let clients = node.cli(&["client", "list"]);
        assert!(
            clients.lines().any(|l| l.contains(" name=tollgate-batch ")
                && l.contains(&format!(" laddr=127.0.0.1:{tls} "))
                && l.contains("cmd=eval")),
            "master {m}: its plans ran on the store's own connection, on its TLS port: {clients}"
        );
    }
}
