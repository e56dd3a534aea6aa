//! `hermes memory ...`: sessions, artifacts and semantic search through the gRPC `Memory` API
//! (served on the dispatcher's port by `hermes up`, or by `hermes-memory` on its own).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use futures::StreamExt;
use hermes_proto::{
    ArtifactRequest, ListArtifactsRequest, ListCollectionsRequest, ListSessionsRequest, SearchRequest,
    SessionRequest,
};

use crate::api_client::MemoryApi;

/// What to show.
#[derive(clap::Subcommand, Debug)]
pub enum MemoryCommand {
    /// List sessions, most recent first.
    Sessions,
    /// Show one session: its summary and recent turns.
    Session { session_id: String },
    /// List artifacts (optionally of one goal).
    Artifacts {
        #[arg(long, default_value = "")]
        goal: String,
    },
    /// Write an artifact's content to a file, or to stdout with `-o -`.
    Artifact {
        reference: String,
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Search long-term memory.
    Search {
        query: String,
        #[arg(long, default_value = "")]
        collection: String,
        #[arg(long, default_value_t = 5)]
        top_k: u32,
    },
    /// List memory collections with their embedding model and size.
    Collections,
}

use crate::api_client::status_error;

pub async fn run(mut client: MemoryApi, command: MemoryCommand) -> anyhow::Result<i32> {
    match command {
        MemoryCommand::Sessions => {
            let sessions = client
                .list_sessions(ListSessionsRequest::default())
                .await
                .map_err(status_error)?
                .into_inner()
                .sessions;
            println!("{:<32} {:>6}  LAST TURN", "SESSION", "TURNS");
            for s in sessions {
                let last = s
                    .turns
                    .last()
                    .map(|t| format!("{}: {}", t.role, one_line(&t.content, 60)))
                    .unwrap_or_default();
                println!("{:<32} {:>6}  {last}", s.session_id, s.total_turns);
            }
        }
        MemoryCommand::Session { session_id } => {
            let s = client
                .get_session(SessionRequest { session_id, ..Default::default() })
                .await
                .map_err(status_error)?
                .into_inner();
            println!("session {} ({} turns, {} shown)", s.session_id, s.total_turns, s.turns.len());
            if let Some(summary) = &s.summary {
                println!("summary ({}):", summary.method);
                for (title, items) in [
                    ("preferences", &summary.preferences),
                    ("facts", &summary.facts),
                    ("open items", &summary.open_items),
                ] {
                    for item in items {
                        println!("  {title}: {item}");
                    }
                }
            }
            for t in &s.turns {
                println!("  [{}] {}: {}", t.goal_id, t.role, one_line(&t.content, 200));
            }
        }
        MemoryCommand::Artifacts { goal } => {
            let list = client
                .list_artifacts(ListArtifactsRequest { goal_id: goal, ..Default::default() })
                .await
                .map_err(status_error)?
                .into_inner()
                .artifacts;
            println!("{:<36} {:>12} {:<24} {:<30} PREVIEW", "REF", "BYTES", "TYPE", "GOAL");
            for a in list {
                println!(
                    "{:<36} {:>12} {:<24} {:<30} {}",
                    a.r#ref,
                    a.size_bytes,
                    a.content_type,
                    a.goal_id,
                    one_line(&a.preview, 40)
                );
            }
        }
        MemoryCommand::Artifact { reference, output } => {
            let mut chunks = client
                .get_artifact(ArtifactRequest { r#ref: reference, ..Default::default() })
                .await
                .map_err(status_error)?
                .into_inner();
            let mut sink: Box<dyn std::io::Write> = if output.as_os_str() == "-" {
                Box::new(std::io::stdout().lock())
            } else {
                Box::new(
                    std::fs::File::create(&output)
                        .with_context(|| format!("cannot create {}", output.display()))?,
                )
            };
            while let Some(chunk) = chunks.next().await {
                sink.write_all(&chunk.map_err(status_error)?.data)?;
            }
            sink.flush()?;
        }
        MemoryCommand::Search { query, collection, top_k } => {
            let hits = client
                .search(SearchRequest { collection, query, top_k, ..Default::default() })
                .await
                .map_err(status_error)?
                .into_inner()
                .hits;
            for hit in hits {
                let doc = hit.doc.unwrap_or_default();
                println!("{:.3}  {:<36} {}", hit.score, doc.id, one_line(&doc.text, 100));
            }
        }
        MemoryCommand::Collections => {
            let list = client
                .list_collections(ListCollectionsRequest::default())
                .await
                .map_err(status_error)?
                .into_inner()
                .collections;
            println!("{:<20} {:>10} {:>5}  MODEL", "COLLECTION", "DOCUMENTS", "DIM");
            for c in list {
                println!("{:<20} {:>10} {:>5}  {}", c.name, c.documents, c.dimension, c.embedding_model);
            }
        }
    }
    Ok(0)
}

fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        format!("{}...", flat.chars().take(max).collect::<String>())
    }
}
