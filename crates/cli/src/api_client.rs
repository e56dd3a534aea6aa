//! The dispatcher client of the `hermes` commands: a gRPC channel that sends the API token
//! (`--token`, `HERMES_TOKEN`) as `authorization: Bearer <token>` on every call, when one is given.

use hermes_proto::dispatcher_client::DispatcherClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The client every dispatcher command uses.
pub type Client = DispatcherClient<InterceptedService<Channel, Credentials>>;

/// Adds the caller's credentials to each request.
#[derive(Clone, Default)]
pub struct Credentials(Option<MetadataValue<Ascii>>);

impl Credentials {
    /// `Bearer <token>`, or nothing when `token` is empty or absent.
    pub fn bearer(token: Option<&str>) -> anyhow::Result<Credentials> {
        match token.map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(Credentials(None)),
            Some(token) => {
                let value = format!("Bearer {token}").parse().map_err(|_| {
                    anyhow::anyhow!("the API token (--token, HERMES_TOKEN) is not printable ASCII")
                })?;
                Ok(Credentials(Some(value)))
            }
        }
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A dispatcher client over `channel` with `credentials`.
pub fn client(channel: Channel, credentials: Credentials) -> Client {
    DispatcherClient::with_interceptor(channel, credentials)
}
