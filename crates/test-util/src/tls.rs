//! Certificates for TLS tests, made at run time: a CA, a server certificate for `localhost` and
//! `127.0.0.1` signed by it, a client certificate signed by it, and a client certificate of
//! another CA that the server must refuse. Written as PEM files in a temporary dir.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// The files of a test PKI; removed when dropped.
pub struct TestPki {
    dir: tempfile::TempDir,
}

impl TestPki {
    pub fn new() -> TestPki {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ca, ca_key) = authority("Hermes test CA");
        let (other_ca, other_key) = authority("Some other CA");
        let write =
            |name: &str, text: String| std::fs::write(dir.path().join(name), text).expect("write pem");
        write("ca.pem", ca.pem());
        write("other-ca.pem", other_ca.pem());
        let leaf =
            |names: Vec<String>, purpose: ExtendedKeyUsagePurpose, by: &rcgen::Certificate, key: &KeyPair| {
                let mut params = CertificateParams::new(names).expect("leaf params");
                params.distinguished_name.push(DnType::CommonName, "hermes test");
                params.extended_key_usages = vec![purpose];
                let own = KeyPair::generate().expect("key");
                let cert = params.signed_by(&own, by, key).expect("sign");
                (cert.pem(), own.serialize_pem())
            };
        let (cert, key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
            &ca,
            &ca_key,
        );
        write("server.pem", cert);
        write("server.key", key);
        let (cert, key) = leaf(vec!["client".into()], ExtendedKeyUsagePurpose::ClientAuth, &ca, &ca_key);
        write("client.pem", cert);
        write("client.key", key);
        let (cert, key) =
            leaf(vec!["stranger".into()], ExtendedKeyUsagePurpose::ClientAuth, &other_ca, &other_key);
        write("stranger.pem", cert);
        write("stranger.key", key);
        TestPki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA that signed the server and the client.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }
    pub fn server_cert(&self) -> PathBuf {
        self.path("server.pem")
    }
    pub fn server_key(&self) -> PathBuf {
        self.path("server.key")
    }
    pub fn client_cert(&self) -> PathBuf {
        self.path("client.pem")
    }
    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }
    /// The other CA, which signed the stranger's certificate.
    pub fn other_ca(&self) -> PathBuf {
        self.path("other-ca.pem")
    }
    /// A client certificate of another CA.
    pub fn stranger_cert(&self) -> PathBuf {
        self.path("stranger.pem")
    }
    pub fn stranger_key(&self) -> PathBuf {
        self.path("stranger.key")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for TestPki {
    fn default() -> Self {
        TestPki::new()
    }
}

fn authority(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("ca key");
    let cert = params.self_signed(&key).expect("self-signed ca");
    (cert, key)
}
