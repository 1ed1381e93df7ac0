//! A Redis idem cannot connect to: the call fails with an `Unreachable` naming the
//! server (or the Cluster's nodes, or the Sentinel service) and the cause, and never the
//! password of the URL. Closed ports, a name that does not resolve, and private servers
//! (a password-protected one, a sentinel that knows no service).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/redis_harness.rs"]
mod harness;

use std::time::Duration;

use harness::{RedisServer, free_port};
use idem_runtime::store::redis::{Cause, Unreachable};
use idem_runtime::{Error, Key, RedisStore, Store};

const SECRET: &str = "s3cr3t-pw";

/// The error of one call on `store`, with its `Unreachable` source.
fn fail(store: RedisStore) -> (String, Cause, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let key = Key::from_str("unreachable", "probe", "k");
    let err = rt
        .block_on(store.issue(&key, Duration::from_secs(5)))
        .expect_err("the call cannot succeed");
    let Error::Store(source) = &err else {
        panic!("not a store error: {err:?}")
    };
    let u = source
        .downcast_ref::<Unreachable>()
        .unwrap_or_else(|| panic!("no Unreachable in {err:?}"));
    let msg = err.to_string();
    assert!(!msg.contains(SECRET), "the password leaked: {msg}");
    (msg, u.cause(), u.server().to_owned())
}

fn builder() -> idem_runtime::store::redis::RedisStoreBuilder {
    RedisStore::builder().timeout(Duration::from_secs(3))
}

#[test]
fn a_closed_port_is_refused_and_named_without_the_password() {
    let port = free_port(false);
    let url = format!("redis://app:{SECRET}@127.0.0.1:{port}/0");
    let (msg, cause, server) = fail(builder().connect(&url).unwrap());
    println!("{msg}");
    assert_eq!(cause, Cause::Refused, "{msg}");
    assert_eq!(server, format!("127.0.0.1:{port}"));
    assert!(
        msg.contains(&format!("cannot connect to Redis at 127.0.0.1:{port}"))
            && msg.contains("refused"),
        "{msg}"
    );
}

#[test]
fn a_host_that_does_not_resolve_is_named() {
    let (msg, cause, server) = fail(
        builder()
            .connect("redis://no-such-host.invalid:6379")
            .unwrap(),
    );
    println!("{msg}");
    assert_eq!(cause, Cause::Dns, "{msg}");
    assert_eq!(server, "no-such-host.invalid:6379");
}

#[test]
fn a_wrong_password_is_an_authentication_failure() {
    let server = RedisServer::start();
    server.cli(&["CONFIG", "SET", "requirepass", "the-right-one"]);
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", server.port);
    let (msg, cause, _) = fail(builder().connect(&url).unwrap());
    println!("{msg}");
    assert_eq!(cause, Cause::Auth, "{msg}");
}

#[test]
fn a_certificate_the_client_does_not_trust_is_a_tls_failure() {
    // A server with a self-signed certificate (no CA the client knows).
    let dir = std::env::temp_dir().join(format!("idem-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=127.0.0.1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(made.status.success(), "{made:?}");
    let tls_port = free_port(false).to_string();
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let _server = RedisServer::start_with(
        free_port(false),
        &[
            "--save",
            "",
            "--appendonly",
            "no",
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &cert,
            "--tls-auth-clients",
            "no",
        ],
    );
    let url = format!("rediss://:{SECRET}@127.0.0.1:{tls_port}");
    let (msg, cause, _) = fail(builder().connect(&url).unwrap());
    println!("{msg}");
    assert_eq!(cause, Cause::Tls, "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{tls_port}")), "{msg}");
}

#[test]
fn tls_to_a_plain_server_has_no_answer_and_says_why() {
    let server = RedisServer::start();
    let url = format!("rediss://:{SECRET}@127.0.0.1:{}", server.port);
    let store = RedisStore::builder()
        .timeout(Duration::from_millis(500))
        .connect(&url)
        .unwrap();
    let (msg, cause, _) = fail(store);
    println!("{msg}");
    assert_eq!(cause, Cause::Timeout, "{msg}");
    assert!(msg.contains("does not speak TLS"), "{msg}");
}

#[test]
fn a_cluster_with_no_reachable_node_names_its_nodes() {
    let (a, b) = (free_port(false), free_port(false));
    let urls = [
        format!("redis://:{SECRET}@127.0.0.1:{a}"),
        format!("redis://:{SECRET}@127.0.0.1:{b}"),
    ];
    let (msg, cause, server) = fail(builder().connect_cluster(&urls).unwrap());
    println!("{msg}");
    assert_eq!(cause, Cause::NoNode, "{msg}");
    assert_eq!(server, format!("127.0.0.1:{a}, 127.0.0.1:{b}"));
    assert!(msg.contains("Redis Cluster"), "{msg}");
}

#[test]
fn a_sentinel_that_knows_no_primary_says_so() {
    let sentinel = RedisServer::start_with_conf(
        free_port(false),
        Some("sentinel resolve-hostnames no\n"),
        &["--sentinel"],
    );
    let url = format!(
        "redis+sentinel://:{SECRET}@127.0.0.1:{}/no-such-service",
        sentinel.port
    );
    let (msg, cause, _) = fail(builder().connect(&url).unwrap());
    println!("{msg}");
    assert_eq!(cause, Cause::NoPrimary, "{msg}");
    assert!(msg.contains("\"no-such-service\""), "{msg}");
}

#[test]
fn sentinels_that_refuse_are_named() {
    let port = free_port(false);
    let store = builder()
        .connect_sentinel([format!("127.0.0.1:{port}")], "shop")
        .unwrap();
    let (msg, cause, server) = fail(store);
    println!("{msg}");
    assert_eq!(cause, Cause::Refused, "{msg}");
    assert_eq!(server, format!("127.0.0.1:{port}"));
}
