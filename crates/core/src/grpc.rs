//! What every Hermes gRPC server shares: server reflection in both protocol versions clients
//! speak, and the request size limit answered with a Hermes error.
//!
//! - Reflection is served as `grpc.reflection.v1` and `grpc.reflection.v1alpha`: grpcurl up to
//!   1.8 (the version the package registries ship), Postman and Python's reflection client speak
//!   only `v1alpha`.
//! - [`MessageLimitLayer`] turns tonic's `OUT_OF_RANGE` "decoded message length too large" into
//!   `INVALID_ARGUMENT` with the Hermes code and the limit in the message, so a client learns
//!   which setting it hit instead of seeing a codec's internals.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Default largest request a Hermes gRPC server decodes (tonic's default, 4 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The reflection services (v1 and v1alpha) over the given encoded descriptor sets, plus the
/// health service's.
pub fn reflection(
    descriptor_sets: &[&'static [u8]],
) -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let builder = || {
        let mut builder = tonic_reflection::server::Builder::configure();
        for set in descriptor_sets {
            builder = builder.register_encoded_file_descriptor_set(set);
        }
        builder
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// A gRPC server to serve: its listener, its services' routes and how to serve them.
pub struct Server {
    pub listener: tokio::net::TcpListener,
    /// The services' own routes, each built with `.max_decoding_message_size(max_message_bytes)`.
    pub routes: tonic::service::RoutesBuilder,
    /// The services' names, reported serving by health.
    pub names: Vec<&'static str>,
    pub max_message_bytes: usize,
    /// Where the limit is set, for the over-limit error.
    pub setting: &'static str,
    /// TLS (mTLS with client CAs), or plaintext.
    pub tls: Option<crate::tls::TlsFiles>,
    /// The check of every request, when one is set.
    pub guard: Option<Guard>,
}

/// Serves `server` until `shutdown`, with what every Hermes server carries: `grpc.health.v1`
/// (the server and each named service serving), reflection v1 and v1alpha over the Hermes and
/// health descriptors, the over-limit answer of [`MessageLimitLayer`], its guard and TLS, and
/// TCP_NODELAY (replies are small; without it they can wait on Nagle's algorithm).
pub async fn serve(server: Server, shutdown: tokio_util::sync::CancellationToken) -> Result<(), ServeError> {
    let Server { listener, mut routes, names: services, max_message_bytes, setting, tls, guard } = server;
    let (health, health_service) = tonic_health::server::health_reporter();
    for service in std::iter::once(&"").chain(&services) {
        health.set_service_status(*service, tonic_health::ServingStatus::Serving).await;
    }
    let (v1, v1alpha) =
        reflection(&[hermes_proto::FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET])?;
    routes.add_service(health_service).add_service(v1).add_service(v1alpha);
    let router = tonic::transport::Server::builder()
        .layer(GuardLayer { guard })
        .layer(MessageLimitLayer::new(max_message_bytes, setting))
        .add_routes(routes.routes());
    match tls {
        // Handshakes by the files as they are when each connection comes (TlsFiles::follow).
        Some(tls) => {
            let config = tls.follow(&[b"h2"], shutdown.clone()).map_err(ServeError::Tls)?;
            let incoming = crate::tls::TlsListener::new(listener, config).map_err(ServeError::Listen)?;
            router.serve_with_incoming_shutdown(incoming.into_stream(), shutdown.cancelled_owned()).await?
        }
        None => {
            router
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                    shutdown.cancelled_owned(),
                )
                .await?
        }
    }
    Ok(())
}

/// Why [`serve`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("cannot set up TLS: {0}")]
    Tls(crate::Error),
    #[error("cannot listen: {0}")]
    Listen(std::io::Error),
    #[error("the gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Decides whether a request may reach its service, from its gRPC path (`/pkg.Service/Method`)
/// and headers (`authorization`); the refusal is answered as the request's status. For services
/// that check no credentials themselves, composed on a server whose other services do. A guard
/// may rewrite the headers: it stamps [`TENANT_HEADER`] with the caller's tenant.
pub type Guard = std::sync::Arc<
    dyn Fn(
            String,
            http::HeaderMap,
        ) -> Pin<Box<dyn Future<Output = Result<http::HeaderMap, tonic::Status>> + Send>>
        + Send
        + Sync,
>;

/// The metadata a [`Guard`] stamps with the authenticated caller's tenant, after removing any the
/// caller sent. Services behind a guard (the Memory API on the dispatcher's port, or on its own
/// with API tokens) scope their data to it; one without a guard trusts the request's `tenant`
/// field.
pub const TENANT_HEADER: &str = "x-hermes-tenant";

/// The metadata a [`Guard`] stamps (`1`) when the authenticated caller lacks the `secrets` role,
/// after removing any the caller sent: the Memory API then redacts goals' artifacts for it, as
/// the goal's own doors do.
pub const REDACT_HEADER: &str = "x-hermes-redact";

/// Applies a [`Guard`], when there is one, before any service sees the request.
#[derive(Clone)]
pub struct GuardLayer {
    guard: Option<Guard>,
}

impl<S> tower::Layer<S> for GuardLayer {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Guarded { inner, guard: self.guard.clone() }
    }
}

/// See [`GuardLayer`].
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    guard: Option<Guard>,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Guarded<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let Some(guard) = self.guard.clone() else { return Box::pin(self.inner.call(request)) };
        // The service made ready is the one called, after the guard's check.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        Box::pin(async move {
            let path = request.uri().path().to_owned();
            let headers = std::mem::take(request.headers_mut());
            match guard(path, headers).await {
                Ok(headers) => {
                    *request.headers_mut() = headers;
                    inner.call(request).await
                }
                Err(status) => Ok(status.into_http::<ResBody>()),
            }
        })
    }
}

/// A layer that answers over-limit requests with `INVALID_ARGUMENT` naming `limit`.
#[derive(Debug, Clone, Copy)]
pub struct MessageLimitLayer {
    limit: usize,
    setting: &'static str,
}

impl MessageLimitLayer {
    /// `setting` names where the limit is configured, for the message.
    pub fn new(limit: usize, setting: &'static str) -> Self {
        Self { limit, setting }
    }
}

impl<S> tower::Layer<S> for MessageLimitLayer {
    type Service = MessageLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MessageLimit { inner, limit: self.limit, setting: self.setting }
    }
}

/// See [`MessageLimitLayer`].
#[derive(Debug, Clone)]
pub struct MessageLimit<S> {
    inner: S,
    limit: usize,
    setting: &'static str,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for MessageLimit<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let (limit, setting) = (self.limit, self.setting);
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            rewrite_over_limit(response.headers_mut(), limit, setting);
            Ok(response)
        })
    }
}

/// Rewrites a trailers-only `OUT_OF_RANGE` for an oversized request (the status tonic answers
/// before the handler runs) into `INVALID_ARGUMENT`.
fn rewrite_over_limit(headers: &mut http::HeaderMap, limit: usize, setting: &str) {
    if headers.get("grpc-status").and_then(|v| v.to_str().ok()) != Some("11") {
        return;
    }
    let message = headers.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let message = message.replace("%20", " ");
    if !message.contains("message length too large") {
        return;
    }
    let found = message
        .split("found ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(|n| format!(" of {n} bytes"))
        .unwrap_or_default();
    let text = format!(
        "INVALID_ARGUMENT: the request{found} is over this server's limit of {limit} bytes ({setting})"
    );
    let encoded: String = text
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b" .,:;()_-/".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    if let Ok(value) = http::HeaderValue::from_str(&encoded) {
        headers.insert("grpc-message", value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_request_becomes_invalid_argument_naming_the_limit() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", http::HeaderValue::from_static("11"));
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_static(
                "Error, decoded message length too large: found 5242890 bytes, the limit is: 4194304 bytes",
            ),
        );
        rewrite_over_limit(&mut headers, 4194304, "HERMES_GRPC_MAX_MESSAGE_BYTES");
        assert_eq!(headers["grpc-status"], "3");
        let message = headers["grpc-message"].to_str().unwrap().replace("%20", " ");
        assert!(message.starts_with("INVALID_ARGUMENT"), "{message}");
        assert!(message.contains("4194304") && message.contains("5242890"), "{message}");
        // Other statuses pass through.
        let mut other = http::HeaderMap::new();
        other.insert("grpc-status", http::HeaderValue::from_static("11"));
        other.insert("grpc-message", http::HeaderValue::from_static("index out of range"));
        rewrite_over_limit(&mut other, 1, "x");
        assert_eq!(other["grpc-status"], "11");
    }
}
