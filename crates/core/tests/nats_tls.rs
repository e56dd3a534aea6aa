//! TLS and mTLS to NATS (`nats.tls.*`) against a real nats-server that requires TLS and verifies
//! client certificates: a bus with the CA and a client certificate of it connects and uses
//! JetStream; one without a certificate, one with another CA's, and a plaintext one are refused;
//! a certificate without its key is a clear error before any connection.

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
