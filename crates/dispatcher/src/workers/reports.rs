//! The agent reports worker: answers agents' `AgentReport` requests on `hermes.agent.report`
//! (core NATS request/reply, in the dispatchers' queue group). Agents may not publish goal events
//! or write approvals on the bus; they ask a dispatcher, which checks the attempt's token and acts
//! for them through [`GoalService::agent_report`].

use std::sync::Arc;

use futures::StreamExt;
use hermes_core::{Error, now_unix_ms};
use hermes_proto::{AgentReport, AgentReportReply};
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::goals::GoalService;

/// Reports handled at once by one dispatcher; more wait in the subscription.
const CONCURRENCY: usize = 64;

/// Answers reports until `shutdown`.
pub(crate) async fn run(service: Arc<GoalService>, shutdown: CancellationToken) {
    let topology = service.bus().topology().clone();
    let client = service.bus().client().clone();
    let mut reports = match client.queue_subscribe(topology.agent_report(), topology.dispatcher_queue()).await
    {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot subscribe to agent reports; agents cannot ask for approvals");
            return;
        }
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => return,
            msg = reports.next() => match msg { Some(m) => m, None => return },
        };
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let service = service.clone();
        let client = client.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let answer = match AgentReport::decode(msg.payload.clone()) {
                Ok(report) => match service.agent_report(&report).await {
                    Ok(approval) => AgentReportReply { approval, error: None },
                    Err(e) => AgentReportReply { approval: None, error: Some(e.to_proto()) },
                },
                Err(e) => {
                    let reason = format!("undecodable AgentReport: {e}");
                    let origin = format!("{}:{}", msg.subject, now_unix_ms());
                    let bus = service.bus();
                    if let Err(e) = bus
                        .publish_dead_letter(
                            "agent_report",
                            &msg.subject,
                            &origin,
                            &reason,
                            msg.payload.clone(),
                        )
                        .await
                    {
                        warn!(error = %e, "cannot dead-letter an undecodable agent report");
                    }
                    let error = Error::InvalidArgument { field: "AgentReport".into(), reason };
                    AgentReportReply { approval: None, error: Some(error.to_proto()) }
                }
            };
            if let Some(reply) = msg.reply
                && let Err(e) = client.publish(reply, answer.encode_to_vec().into()).await
            {
                warn!(error = %e, "cannot answer an agent report");
            }
        });
    }
}
