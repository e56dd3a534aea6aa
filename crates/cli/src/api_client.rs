//! The gRPC clients of the `hermes` commands: the dispatcher's, the registry's and the Memory API, over a
//! channel that sends the API token (`--token`, `HERMES_TOKEN`) as `authorization: Bearer <token>`
//! on every call, when one is given.

use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::memory_client::MemoryClient;
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

/// The registry's client (served on the dispatcher's port by `hermes up`).
pub type RegistryApi =
    hermes_proto::registry_client::RegistryClient<InterceptedService<Channel, Credentials>>;

/// A registry client over `channel` with `credentials`.
pub fn registry(channel: Channel, credentials: Credentials) -> RegistryApi {
    hermes_proto::registry_client::RegistryClient::with_interceptor(channel, credentials)
}

/// The Memory API's client (served on the dispatcher's port by `hermes up`).
pub type MemoryApi = MemoryClient<InterceptedService<Channel, Credentials>>;

/// A Memory API client over `channel` with `credentials`.
pub fn memory(channel: Channel, credentials: Credentials) -> MemoryApi {
    MemoryClient::with_interceptor(channel, credentials).max_decoding_message_size(8 * 1024 * 1024)
}

/// The whole content of an artifact `goal_id` produced (`GetGoalArtifact`).
pub async fn read_goal_artifact(
    client: &mut Client,
    goal_id: &str,
    reference: &str,
) -> Result<Vec<u8>, tonic::Status> {
    use futures::StreamExt as _;
    let request =
        hermes_proto::GoalArtifactRequest { goal_id: goal_id.to_owned(), r#ref: reference.to_owned() };
    let mut chunks = client.get_goal_artifact(request).await?.into_inner();
    let mut content = Vec::new();
    while let Some(chunk) = chunks.next().await {
        content.extend_from_slice(&chunk?.data);
    }
    Ok(content)
}

/// What each artifact among `references` that `goal_id` produced stands for in JSON (its JSON,
/// or its text), read once each; and those that could not be read, each with why.
pub async fn load_goal_artifacts(
    client: &mut Client,
    goal_id: &str,
    references: impl IntoIterator<Item = String>,
) -> (std::collections::HashMap<String, serde_json::Value>, Vec<String>) {
    let mut loaded = std::collections::HashMap::new();
    let mut unread = Vec::new();
    for reference in references {
        if loaded.contains_key(&reference) {
            continue;
        }
        match read_goal_artifact(client, goal_id, &reference).await {
            Ok(bytes) => {
                loaded.insert(reference, hermes_core::artifacts::content_value(&bytes));
            }
            Err(s) => unread.push(format!("{reference} ({:?}: {})", s.code(), s.message())),
        }
    }
    (loaded, unread)
}

/// `text`, an output as a goal holds it (JSON, or text), with each artifact stub in it replaced
/// by what the artifact stands for, read through the goal; an error names those that could not
/// be read.
pub async fn resolve_output(
    client: &mut Client,
    goal_id: &str,
    text: &str,
) -> anyhow::Result<serde_json::Value> {
    let value = serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned()));
    let references = hermes_core::artifacts::stub_references(&value);
    if references.is_empty() {
        return Ok(value);
    }
    let (loaded, unread) = load_goal_artifacts(client, goal_id, references).await;
    if !unread.is_empty() {
        anyhow::bail!("cannot read the output's artifacts: {}", unread.join("; "));
    }
    Ok(hermes_core::artifacts::substitute_stubs(value, &loaded)?)
}

/// The goal, or an error naming it.
pub async fn get_goal(client: &mut Client, goal_id: &str) -> anyhow::Result<hermes_proto::Goal> {
    client
        .get_goal(hermes_proto::GetGoalRequest { goal_id: goal_id.to_owned() })
        .await
        .map(|r| r.into_inner())
        .map_err(|s| anyhow::anyhow!("get {goal_id}: {}", s.message()))
}

/// Every event of the goal from the start until its terminal one (the server ends the stream
/// there), within `timeout`.
pub async fn follow_to_end(
    client: &mut Client,
    goal_id: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<Vec<hermes_proto::Event>> {
    use anyhow::Context as _;
    use futures::StreamExt as _;
    let mut stream = client
        .watch_goal(hermes_proto::WatchGoalRequest { goal_id: goal_id.to_owned(), after_seq: 0 })
        .await
        .map_err(|s| anyhow::anyhow!("watch {goal_id}: {}", s.message()))?
        .into_inner();
    let mut events = Vec::new();
    let read = async {
        while let Some(event) = stream.next().await {
            events.push(event?);
        }
        Ok::<_, tonic::Status>(())
    };
    tokio::time::timeout(timeout, read)
        .await
        .with_context(|| format!("{goal_id} did not end within {timeout:?}"))?
        .map_err(|s| anyhow::anyhow!("watch {goal_id}: {}", s.message()))?;
    Ok(events)
}

/// A goal status as a word: `completed`, `needs_input`, ...
pub fn status_word(status: i32) -> String {
    hermes_proto::GoalStatus::try_from(status)
        .map(|s| s.as_str_name().trim_start_matches("GOAL_STATUS_").to_ascii_lowercase())
        .unwrap_or_else(|_| status.to_string())
}

/// A failed call as the CLI says it: the server's message, or, when it sent none (a service this
/// server does not serve answers `UNIMPLEMENTED` with an empty message), the code and what it
/// means.
pub fn status_error(status: tonic::Status) -> anyhow::Error {
    if !status.message().trim().is_empty() {
        return anyhow::anyhow!("{}", status.message());
    }
    match status.code() {
        tonic::Code::Unimplemented => anyhow::anyhow!(
            "the server does not serve this API (UNIMPLEMENTED): point --server at `hermes up`, or at the \
             service that serves it (the registry for `hermes agents`, the memory service for `hermes memory`)"
        ),
        code => anyhow::anyhow!("the server answered {code:?} with no message"),
    }
}

#[cfg(test)]
mod status_tests {
    use super::status_error;

    #[test]
    fn an_empty_status_still_says_what_went_wrong() {
        let said = status_error(tonic::Status::unimplemented("")).to_string();
        assert!(said.contains("UNIMPLEMENTED") && said.contains("--server"), "{said}");
        let said = status_error(tonic::Status::unavailable("")).to_string();
        assert!(said.contains("Unavailable"), "{said}");
        assert_eq!(status_error(tonic::Status::not_found("no goal g-1")).to_string(), "no goal g-1");
    }
}
