//! TLS and mTLS to NATS (`nats.tls.*`) against a real nats-server that requires TLS and verifies
//! client certificates: a bus with the CA and a client certificate of it connects and uses
//! JetStream; one without a certificate, one with another CA's, and a plaintext one are refused;
//! a certificate without its key is a clear error before any connection. A running bus follows
//! its files: a renewed certificate is presented after SIGHUP, a broken pair is not taken.

use hermes_core::bus::NatsTls;
use hermes_core::{Bus, BusConfig, Error};
use hermes_test_util::NatsServer;
use hermes_test_util::tls::TestPki;

fn bus_config(server: &NatsServer, tls: NatsTls) -> BusConfig {
    let mut config = BusConfig::new(server.url());
    config.connect_timeout = std::time::Duration::from_secs(3);
    config.tls = tls;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_speaks_mtls_to_nats_and_refuses_plaintext_or_a_stranger() {
    let pki = TestPki::new();
    let server = NatsServer::start_with_config(&format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 2\n}}\n",
        pki.server_cert().display(),
        pki.server_key().display(),
        pki.ca().display()
    ));
    let mutual = NatsTls {
        ca_file: Some(pki.ca()),
        cert_file: Some(pki.client_cert()),
        key_file: Some(pki.client_key()),
    };
    let bus = Bus::connect(bus_config(&server, mutual.clone())).await.expect("mTLS connects");
    bus.goals().put("g-tls", "x".into()).await.expect("JetStream over TLS");
    assert_eq!(bus.goals().get("g-tls").await.unwrap().as_deref(), Some(&b"x"[..]));

    let refused = [
        ("no client certificate", NatsTls { ca_file: Some(pki.ca()), ..Default::default() }),
        (
            "another CA's certificate",
            NatsTls {
                ca_file: Some(pki.ca()),
                cert_file: Some(pki.stranger_cert()),
                key_file: Some(pki.stranger_key()),
            },
        ),
        ("plaintext", NatsTls::default()),
        (
            "a server certificate of an unknown CA",
            NatsTls {
                cert_file: Some(pki.client_cert()),
                key_file: Some(pki.client_key()),
                ..Default::default()
            },
        ),
    ];
    for (what, tls) in refused {
        assert!(Bus::connect(bus_config(&server, tls)).await.is_err(), "{what} was let in");
    }

    let half = NatsTls { cert_file: Some(pki.client_cert()), ..Default::default() };
    match Bus::connect(bus_config(&server, half)).await {
        Err(Error::InvalidArgument { field, reason }) => {
            assert!(field.contains("nats.tls.key_file"), "{field}");
            assert!(reason.contains("needs its key"), "{reason}");
        }
        other => panic!("a certificate without its key: {:?}", other.err()),
    }
    let missing = NatsTls { ca_file: Some(pki.dir().join("nope.pem")), ..Default::default() };
    match Bus::connect(bus_config(&server, missing)).await {
        Err(Error::InvalidArgument { field, .. }) => assert!(field.contains("nats.tls.ca_file"), "{field}"),
        other => panic!("a missing CA file: {:?}", other.err()),
    }
}

/// The sha256 of the certificate in `pem`, as the server's `/connz?auth=true` names a peer's.
fn cert_sha256(pem: &std::path::Path) -> String {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    use sha2::Digest as _;
    let der = CertificateDer::from_pem_file(pem).expect("a PEM certificate");
    sha2::Sha256::digest(der.as_ref()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The certificate the connection named `name` presented to `server`, by its sha256.
fn presented(server: &NatsServer, name: &str) -> Option<String> {
    let connz = server.monitor("/connz?auth=true")?;
    let conn = connz["connections"].as_array()?.iter().find(|c| c["name"] == name)?.clone();
    conn["tls_peer_certs"][0]["cert_sha256"].as_str().map(str::to_owned)
}

/// Replaces `path`'s content whole (a rename), as a Secret's volume or a renewal does.
fn replace(path: &std::path::Path, from: &std::path::Path) {
    let staged = path.with_extension("new");
    std::fs::copy(from, &staged).expect("stage the file");
    std::fs::rename(&staged, path).expect("replace the file");
}

fn hangup() {
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
}

/// A running bus follows its TLS files: on SIGHUP it reconnects presenting the certificate read
/// again (the server sees the new one, and the bus goes on working); a certificate that does not
/// match its key is refused and the connection stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_reconnects_with_certificates_read_again_and_keeps_its_connection_on_a_broken_pair() {
    // A handler of its own first: SIGHUP must not end the test before the bus listens for it.
    let _hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).unwrap();
    let pki = TestPki::new();
    let cas = pki.dir().join("both-cas.pem");
    let both = [std::fs::read(pki.ca()).unwrap(), std::fs::read(pki.other_ca()).unwrap()].concat();
    std::fs::write(&cas, both).unwrap();
    let server = NatsServer::start_with_config(&format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 2\n}}\n",
        pki.server_cert().display(),
        pki.server_key().display(),
        cas.display()
    ));
    let mounted = pki.dir().join("mounted");
    std::fs::create_dir(&mounted).unwrap();
    let (cert, key) = (mounted.join("tls.crt"), mounted.join("tls.key"));
    replace(&cert, &pki.client_cert());
    replace(&key, &pki.client_key());
    let tls = NatsTls { ca_file: Some(pki.ca()), cert_file: Some(cert.clone()), key_file: Some(key.clone()) };
    let bus = Bus::connect(bus_config(&server, tls).with_name("reloading")).await.expect("mTLS connects");
    assert_eq!(presented(&server, "reloading"), Some(cert_sha256(&pki.client_cert())));

    replace(&key, &pki.stranger_key());
    replace(&cert, &pki.stranger_cert());
    hangup();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while presented(&server, "reloading") != Some(cert_sha256(&pki.stranger_cert())) {
        assert!(std::time::Instant::now() < deadline, "the new certificate was not presented within 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    bus.goals().put("g-renewed", "y".into()).await.expect("JetStream after the reconnect");
    let connects = bus.client().statistics().connects.load(std::sync::atomic::Ordering::Relaxed);

    // The client's certificate with the stranger's key: not a pair.
    replace(&cert, &pki.client_cert());
    hangup();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        bus.client().statistics().connects.load(std::sync::atomic::Ordering::Relaxed),
        connects,
        "a broken pair made the bus reconnect"
    );
    assert_eq!(presented(&server, "reloading"), Some(cert_sha256(&pki.stranger_cert())));
    assert_eq!(bus.goals().get("g-renewed").await.unwrap().as_deref(), Some(&b"y"[..]));
}
