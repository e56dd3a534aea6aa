//! TLS on the API doors (gRPC and HTTP), from PEM files: a certificate chain and its key, and
//! optionally the CAs whose client certificates are required (mutual TLS). rustls with ring.
//!
//! Every service's gRPC server reads `[grpc.tls]` (`HERMES_GRPC_TLS_CERT_FILE`, ...); the
//! dispatcher's HTTP server reads `[dispatcher.http.tls]`. A file that cannot be read or parsed
//! stops the service at start, naming the setting: a server never falls back to plaintext.
//!
//! A serving server follows its files ([`TlsFiles::follow`]): on SIGHUP, and when their content
//! changes (looked at every [`crate::reload::POLL`]), they are read again, and new connections
//! get the new certificate, key and client CAs; connections already open keep theirs. Files
//! that no longer make a server identity are refused, logged, and the ones before stay in use.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use crate::{Error, Result};

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS of one server: off when no certificate is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// The server's certificate chain (PEM).
    pub cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// CA certificates (PEM): when set, clients must present a certificate they signed (mTLS).
    pub client_ca_file: Option<PathBuf>,
}

/// The PEM contents of [`TlsSettings`], read and checked, and where they were read from.
#[derive(Clone, PartialEq)]
pub struct TlsFiles {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    client_ca_pem: Option<Vec<u8>>,
    /// The files, read again by [`TlsFiles::follow`].
    settings: TlsSettings,
    /// The settings' name in errors (`grpc.tls`).
    prefix: String,
}

fn invalid(setting: &str, reason: String) -> Error {
    Error::InvalidArgument { field: setting.to_owned(), reason }
}

/// The certificates of a PEM file's contents, at least one; errors name `setting`.
pub(crate) fn pem_certificates(setting: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| invalid(setting, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(setting, "holds no certificate".into()));
    }
    Ok(certs)
}

/// The private key of a PEM file's contents; errors name `setting`.
pub(crate) fn pem_private_key(setting: &str, pem: &[u8]) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| invalid(setting, format!("no private key: {e}")))
}

fn read(setting: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| invalid(setting, format!("cannot read {}: {e}", path.display())))
}

impl TlsSettings {
    /// The files, read and parsed, or `None` when TLS is off; `prefix` names the settings
    /// (`grpc.tls`) in errors.
    pub fn load(&self, prefix: &str) -> Result<Option<TlsFiles>> {
        let (cert, key) = match (&self.cert_file, &self.key_file) {
            (None, None) if self.client_ca_file.is_none() => return Ok(None),
            (Some(cert), Some(key)) => (cert, key),
            _ => {
                return Err(invalid(
                    prefix,
                    "TLS needs both cert_file and key_file (and client_ca_file only with them)".into(),
                ));
            }
        };
        let files = TlsFiles {
            cert_pem: read(&format!("{prefix}.cert_file"), cert)?,
            key_pem: read(&format!("{prefix}.key_file"), key)?,
            client_ca_pem: match &self.client_ca_file {
                Some(path) => Some(read(&format!("{prefix}.client_ca_file"), path)?),
                None => None,
            },
            settings: self.clone(),
            prefix: prefix.to_owned(),
        };
        // Parse now, so a bad file stops the start rather than every handshake.
        files.server_config(&[])?;
        Ok(Some(files))
    }
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsFiles").field("mutual", &self.mutual()).finish_non_exhaustive()
    }
}

impl TlsFiles {
    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.client_ca_pem.is_some()
    }

    /// A rustls server config of these files, offering `alpn` protocols, that follows the
    /// files until `shutdown`: read again on SIGHUP and when they change, a new config for new
    /// connections when they make one, the one before kept (and the problem logged) when not.
    pub fn follow(
        &self,
        alpn: &[&[u8]],
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<tokio::sync::watch::Receiver<Arc<rustls::ServerConfig>>> {
        let first = self.server_config(alpn)?;
        let (tx, rx) = tokio::sync::watch::channel(first);
        let settings = &self.settings;
        let mut files: Vec<PathBuf> =
            [&settings.cert_file, &settings.key_file].into_iter().flatten().cloned().collect();
        files.extend(settings.client_ca_file.clone());
        let read_at_start = vec![Some(self.cert_pem.clone()), Some(self.key_pem.clone())]
            .into_iter()
            .chain(self.client_ca_pem.clone().map(Some))
            .collect();
        let (before, alpn): (TlsFiles, Vec<Vec<u8>>) =
            (self.clone(), alpn.iter().map(|p| p.to_vec()).collect());
        let watched = crate::reload::Watched { what: "TLS certificate", event: "tls", files, read_at_start };
        crate::reload::follow(watched, shutdown, move |contents| {
            let [Some(cert_pem), Some(key_pem), ca @ ..] = contents else {
                anyhow::bail!("cannot read the certificate or its key")
            };
            let client_ca_pem = match ca {
                [] => None,
                [Some(ca)] => Some(ca.clone()),
                _ => anyhow::bail!("cannot read the client CAs"),
            };
            let files = TlsFiles {
                cert_pem: cert_pem.clone(),
                key_pem: key_pem.clone(),
                client_ca_pem,
                ..before.clone()
            };
            let alpn: Vec<&[u8]> = alpn.iter().map(Vec::as_slice).collect();
            let config = files.server_config(&alpn)?;
            tx.send_replace(config);
            Ok(format!("{} serves the files read again", files.prefix))
        });
        Ok(rx)
    }

    /// A rustls server config, offering `alpn` protocols; errors name the files' settings.
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<Arc<rustls::ServerConfig>> {
        let prefix = self.prefix.as_str();
        let certs = pem_certificates(&format!("{prefix}.cert_file"), &self.cert_pem)?;
        let key = pem_private_key(&format!("{prefix}.key_file"), &self.key_pem)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(prefix, e.to_string()))?;
        let builder = match &self.client_ca_pem {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for ca in CertificateDer::pem_slice_iter(pem) {
                    let ca = ca.map_err(|e| {
                        invalid(&format!("{prefix}.client_ca_file"), format!("not PEM certificates: {e}"))
                    })?;
                    roots.add(ca).map_err(|e| invalid(&format!("{prefix}.client_ca_file"), e.to_string()))?;
                }
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| invalid(&format!("{prefix}.client_ca_file"), e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            invalid(prefix, format!("the certificate and key do not make a server identity: {e}"))
        })?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

/// A listener that hands out connections once their TLS handshake is done. Handshakes run in
/// their own tasks under [`HANDSHAKE_TIMEOUT`], so a slow or silent client holds up nobody;
/// failed handshakes are logged and dropped.
pub struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Handshakes each connection with the config `config` holds when it arrives
    /// ([`TlsFiles::follow`]).
    pub fn new(
        listener: TcpListener,
        config: tokio::sync::watch::Receiver<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = tx.closed() => return,
                    accepted = listener.accept() => accepted,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let acceptor = tokio_rustls::TlsAcceptor::from(config.borrow().clone());
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl TlsListener {
    /// The connections, as a stream a tonic server serves.
    pub fn into_stream(self) -> impl futures::Stream<Item = std::io::Result<TlsStream<TcpStream>>> {
        futures::stream::unfold(self.ready, |mut ready| async move {
            let (stream, _) = ready.recv().await?;
            Some((Ok(stream), ready))
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop ended (it only does when this listener is dropped).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
