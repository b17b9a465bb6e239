//! `RedisStore::connect("rediss://...")`: TLS to a private `redis-server` with a certificate from
//! a CA generated for the test. Alone in its binary, because it sets `SSL_CERT_FILE` (where the
//! client finds its trusted roots) for the process.

use jobguard::store::redis::RedisStore;
use jobguard::testing::{Claim, PlainClaim};
use jobguard::{Error, Store, StoreKey};
use jobguard_testkit::redis::{Options, RedisServer, TlsFiles};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::path::Path;
use std::time::Duration;

/// Writes a CA and a server certificate for 127.0.0.1 signed by it into `dir`.
fn certificates(dir: &Path) -> TlsFiles {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let files = TlsFiles {
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        ca: dir.join("ca.pem"),
    };
    std::fs::write(&files.cert, server.pem()).unwrap();
    std::fs::write(&files.key, server_key.serialize_pem()).unwrap();
    std::fs::write(&files.ca, ca_cert.pem()).unwrap();
    files
}

#[test]
fn a_rediss_url_connects_over_tls_and_verifies_the_server() {
    let dir = std::env::temp_dir().join(format!("jobguard-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tls = certificates(&dir);
    let Some(server) = RedisServer::start_with(Options {
        password: Some("tls-pw".into()),
        tls: Some(tls.clone()),
    }) else {
        return;
    };
    let url = server.tls_url().unwrap();
    assert!(url.starts_with("rediss://:tls-pw@127.0.0.1:"), "{url}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // Our CA is not trusted yet: the handshake is refused, as a store error, not a panic.
    let other_dir = dir.join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let untrusted = certificates(&other_dir).ca; // a valid CA, but not the one that signed
    // SAFETY: the only test in this binary, and no other thread of ours runs yet.
    unsafe { std::env::set_var("SSL_CERT_FILE", &untrusted) };
    let refused = rt.block_on(RedisStore::connect(&url));
    let Err(Error::Store(why)) = refused else {
        panic!("{refused:?}");
    };
    assert!(why.to_lowercase().contains("certificate"), "{why}");

    // SAFETY: as above; the runtime's threads are idle between calls.
    unsafe { std::env::set_var("SSL_CERT_FILE", &tls.ca) };
    rt.block_on(async {
        let store = RedisStore::connect(&url).await.expect("TLS connect");
        let k = StoreKey {
            scope: "tests.redis_tls",
            key: "k",
        };
        let lease = Duration::from_secs(60);
        assert_eq!(
            store.claim_plain(k, "t", None, lease).await,
            Ok(Claim::Acquired)
        );
        store.complete(k, "t", b"over tls", lease).await.unwrap();
        assert_eq!(
            store.claim_plain(k, "u", None, lease).await,
            Ok(Claim::Completed(b"over tls".to_vec()))
        );
    });
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
