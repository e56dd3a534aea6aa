//! Recording and `hermes replay`: a text goal run against the scripted model has its model
//! exchanges recorded (planner and summarizer); `hermes replay` runs it again in a fresh stack
//! with the scripted model gone, and finds no divergence; with a tool's output changed (a file
//! the plan reads), it exits 1 and names what differs. `--against` runs it again in a named
//! stack, and `--model live` compares a live model's answers with the record. An `agent.run`
//! goal's loop is recorded from inside the agent, and `--tools recorded` replays it without
//! repeating its side effect.

use std::process::Command;

use hermes_proto::ListModelExchangesRequest;
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use hermes_tests::{Sandbox, hermes_bin, kind_name};
use serde_json::json;

use crate::planning::{PLANNER, SUMMARIZER, answer, submit_text};

/// `hermes replay <goal_id> --server <server> --workspace <dir>`, and `extra`, run to its end.
fn replay_in(goal_id: &str, server: &str, dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(hermes_bin())
        .args(["replay", goal_id, "--server", server, "--workspace", dir.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recorded_text_goal_replays_without_a_model_and_a_changed_tool_output_diverges() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("notes.txt"), "alpha beta gamma").unwrap();
    let llm = ScriptedLlm::start().await;
    let plan = json!({
        "reasoning": "read the notes, then quote them",
        "nodes": [
            {"id": "read", "task_type": "fs.read", "inputs": {"path": "notes.txt"}},
            {"id": "quote", "task_type": "text.template",
             "inputs": {"template": "The notes say: {{ t }}", "values": {"t": {"$ref": "read.text"}}}}
        ],
        "output_node": "quote"
    });
    llm.push(PLANNER, ScriptedResponse::content(plan.to_string()).with_usage(300, 80));
    llm.push(SUMMARIZER, answer("The notes say alpha beta gamma.", &["quote"]));
    let mut t = Sandbox::builder().llm(llm.base_url()).workspace(workspace.path()).start().await;
    let goal_id = submit_text(&mut t, "What do my notes say?").await;
    let events = t.events(&goal_id).await;
    assert_eq!(
        kind_name(events.last().unwrap()),
        "completed",
        "{:?}",
        events.iter().map(kind_name).collect::<Vec<_>>()
    );

    // Recorded: the planner's exchange and the summarizer's, in order.
    let records = t
        .client
        .list_model_exchanges(ListModelExchangesRequest { goal_id: goal_id.clone() })
        .await
        .unwrap()
        .into_inner()
        .exchanges;
    let purposes: Vec<&str> = records.iter().map(|r| r.purpose.as_str()).collect();
    assert_eq!(purposes, ["plan", "summary"], "{records:?}");
    assert!(
        records.iter().all(|r| r.goal_id == goal_id && r.request_digest.len() == 64 && r.tokens.is_some())
    );
    assert!(records[0].content.contains("read the notes"), "{}", records[0].content);
    assert!(records[0].request_json.contains("What do my notes say?"));

    let grpc = t.stack.as_ref().unwrap().grpc_url();
    let hermes = |args: &[&str]| {
        Command::new(hermes_bin()).args(["replay", &goal_id, "--server", &grpc]).args(args).output().unwrap()
    };

    // In a named stack (here the same one), its own model answers: the same answers, no divergence.
    llm.push(PLANNER, ScriptedResponse::content(plan.to_string()));
    llm.push(SUMMARIZER, answer("The notes say alpha beta gamma.", &["quote"]));
    let against = hermes(&["--against", &grpc]);
    let stdout = String::from_utf8_lossy(&against.stdout);
    assert!(against.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&against.stderr));
    assert!(
        stdout.contains("no divergence") && stdout.contains("the named stack's model and tools answered"),
        "{stdout}"
    );

    // `--model live`: a live model that plans the same but answers differently is named where it differs.
    // (Twice: the first replay finds the recorded planner saw agents with a model, and runs again.)
    for _ in 0..2 {
        llm.push("live", ScriptedResponse::content(plan.to_string()));
        llm.push("live", answer("Something else entirely.", &["quote"]));
    }
    let dir = workspace.path().to_str().unwrap();
    let live = hermes(&[
        "--workspace",
        dir,
        "--model",
        "live",
        "--llm-base-url",
        &llm.base_url(),
        "--llm-model",
        "live",
    ]);
    let stdout = String::from_utf8_lossy(&live.stdout);
    assert_eq!(live.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&live.stderr));
    assert!(stdout.contains("the first: model request 2 (summary): the record answered"), "{stdout}");
    assert!(stdout.contains("Something else entirely."), "{stdout}");

    // No model from here on.
    drop(llm);
    let replay = |dir: &std::path::Path| replay_in(&goal_id, &grpc, dir, &[]);
    let same = replay(workspace.path());
    let stdout = String::from_utf8_lossy(&same.stdout);
    assert!(same.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&same.stderr));
    assert!(stdout.contains("no divergence") && stdout.contains("2 model exchanges served"), "{stdout}");

    // The file the plan reads says something else now: the tool's output differs.
    let changed = tempfile::tempdir().unwrap();
    std::fs::write(changed.path().join("notes.txt"), "delta").unwrap();
    let diverged = replay(changed.path());
    let stdout = String::from_utf8_lossy(&diverged.stdout);
    assert_eq!(diverged.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&diverged.stderr));
    // The summarizer's prompt carries the outputs, so its request is the first to differ, named.
    assert!(stdout.contains("the first: model request 2 (summary) does not match its record"), "{stdout}");
    assert!(stdout.contains("node `read` output was"), "{stdout}");
    assert!(stdout.contains("delta"), "{stdout}");
    t.stop().await;
}

/// An `agent.run` node whose model appends to a file: its model exchanges and its tool call are
/// recorded from inside the agent, and `hermes replay --tools recorded` runs the loop again from
/// the record, with no model, without appending again. A live replay appends again, which is what
/// the recorded one must not do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_goal_replays_with_recorded_tools_and_its_side_effect_does_not_happen_again() {
    let workspace = tempfile::tempdir().unwrap();
    let log = workspace.path().join("log.txt");
    let llm = ScriptedLlm::start().await;
    llm.push(
        "agent-model",
        ScriptedResponse::tool_call(
            "fs__write",
            r#"{"path": "log.txt", "content": "shipped\n", "append": true}"#,
        ),
    );
    llm.push("agent-model", ScriptedResponse::content("Logged the shipment."));
    let mut t = Sandbox::builder().llm(llm.base_url()).workspace(workspace.path()).start().await;
    let plan = hermes_proto::TaskPlan {
        nodes: vec![hermes_tests::node(
            "log",
            "agent.run",
            json!({"instruction": "Append `shipped` to log.txt", "tools": ["fs.write"]}),
            &[],
        )],
        ..Default::default()
    };
    let goal_id = t.submit(plan).await.unwrap();
    let events = t.events(&goal_id).await;
    assert_eq!(
        kind_name(events.last().unwrap()),
        "completed",
        "{:?}",
        events.iter().map(kind_name).collect::<Vec<_>>()
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "shipped\n");

    // Recorded from inside the agent: both model turns of the loop, and the tool call.
    let records = t
        .client
        .list_model_exchanges(ListModelExchangesRequest { goal_id: goal_id.clone() })
        .await
        .unwrap()
        .into_inner();
    let agent: Vec<_> = records.exchanges.iter().filter(|e| e.purpose == "agent").collect();
    assert_eq!(agent.len(), 2, "{:?}", records.exchanges);
    assert!(agent.iter().all(|e| e.node_id == "log" && e.goal_id == goal_id));
    assert_eq!(agent[0].tool_calls[0].name, "fs__write");
    let [call] = records.tool_exchanges.as_slice() else { panic!("{:?}", records.tool_exchanges) };
    assert_eq!((call.node_id.as_str(), call.tool.as_str(), call.ok), ("log", "fs.write", true));
    assert!(call.output_json.contains("bytes_written"), "{}", call.output_json);
    assert_eq!(call.arguments_digest.len(), 64);

    drop(llm);
    let grpc = t.stack.as_ref().unwrap().grpc_url();
    let replay = |tools: &str| replay_in(&goal_id, &grpc, workspace.path(), &["--tools", tools]);
    let recorded = replay("recorded");
    let stdout = String::from_utf8_lossy(&recorded.stdout);
    assert!(recorded.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&recorded.stderr));
    assert!(
        stdout.contains("no divergence") && stdout.contains("1 tool calls served from the record"),
        "{stdout}"
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "shipped\n", "the recorded replay appended again");

    // Live, the tool runs again: the side effect the recorded replay kept from happening.
    let live = replay("live");
    let stdout = String::from_utf8_lossy(&live.stdout);
    assert!(live.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&live.stderr));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "shipped\nshipped\n");
    t.stop().await;
}

/// Outputs over the inline limit are kept as artifacts, whose references are new in each run:
/// `hermes output` prints them read from their artifacts, and `hermes replay` reads each run's
/// from the stack that ran it and compares them by content, so the same large outputs are no
/// divergence and a changed one is named with what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_outputs_kept_as_artifacts_print_and_replay_by_content() {
    let workspace = tempfile::tempdir().unwrap();
    let text: String = (0..3000).map(|i| format!("line {i} of the report\n")).collect();
    assert!(text.len() > hermes_core::artifacts::DEFAULT_INLINE_LIMIT);
    std::fs::write(workspace.path().join("report.txt"), &text).unwrap();
    let mut t = Sandbox::builder()
        .workspace(workspace.path())
        .memory(hermes_memory::MemoryConfig::default())
        .start()
        .await;
    let plan = hermes_proto::TaskPlan {
        nodes: vec![
            hermes_tests::node("read", "fs.read", json!({"path": "report.txt"}), &[]),
            hermes_tests::node(
                "quote",
                "text.template",
                json!({"template": "{{ t }}(end)", "values": {"t": {"$ref": "read.text"}}}),
                &["read"],
            ),
        ],
        output_node: "quote".into(),
        ..Default::default()
    };
    let goal_id = t.submit(plan).await.unwrap();
    let events = t.events(&goal_id).await;
    assert_eq!(kind_name(events.last().unwrap()), "completed");
    let goal = t
        .client
        .get_goal(hermes_proto::GetGoalRequest { goal_id: goal_id.clone() })
        .await
        .unwrap()
        .into_inner();
    for node in &goal.nodes {
        assert!(
            node.memory_ref.starts_with("art-"),
            "{} is not an artifact: {}",
            node.node_id,
            node.output_json
        );
    }

    let grpc = t.stack.as_ref().unwrap().grpc_url();
    // `hermes output`: the goal's output and a node's, whole, though each is a stub in the goal.
    let hermes =
        |args: &[&str]| Command::new(hermes_bin()).args(args).args(["--server", &grpc]).output().unwrap();
    let printed = hermes(&["output", &goal_id]);
    assert!(printed.status.success(), "{}", String::from_utf8_lossy(&printed.stderr));
    let output: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
    assert_eq!(output, json!({"text": format!("{text}(end)")}));
    let file = workspace.path().join("read.json");
    let written = hermes(&["output", &goal_id, "--node", "read", "-o", file.to_str().unwrap()]);
    assert!(written.status.success(), "{}", String::from_utf8_lossy(&written.stderr));
    let read: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(read["text"], text.as_str());
    let missing = hermes(&["output", &goal_id, "--node", "nope"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("has no node `nope`"));

    let replay = |dir: &std::path::Path| replay_in(&goal_id, &grpc, dir, &[]);
    let same = replay(workspace.path());
    let stdout = String::from_utf8_lossy(&same.stdout);
    assert!(same.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&same.stderr));
    assert!(stdout.contains("no divergence"), "{stdout}");
    assert!(!stdout.contains("cannot read"), "{stdout}");

    // One line of the file differs: named by content, though every reference differed anyway.
    let changed = tempfile::tempdir().unwrap();
    std::fs::write(changed.path().join("report.txt"), text.replace("line 0 of", "line zero of")).unwrap();
    let diverged = replay(changed.path());
    let stdout = String::from_utf8_lossy(&diverged.stdout);
    assert_eq!(diverged.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&diverged.stderr));
    assert!(stdout.contains("the first: node `read` output was"), "{stdout}");
    assert!(stdout.contains("line zero of the report"), "{stdout}");
    assert!(!stdout.contains("$artifact"), "{stdout}");
    t.stop().await;
}

/// The tool-result cache and the record: an `agent.run` goal whose tool call was served from the
/// cache is recorded with the same output as the run that computed it, and both replay with no
/// model and no divergence, the replay's agent (which caches nothing) running the tool itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_goal_whose_tool_call_hit_the_cache_replays_like_the_one_that_ran_it() {
    let workspace = tempfile::tempdir().unwrap();
    let llm = ScriptedLlm::start().await;
    for _ in 0..2 {
        llm.push("agent-model", ScriptedResponse::tool_call("math__evaluate", r#"{"expression": "6 * 7"}"#));
        llm.push("agent-model", ScriptedResponse::content("The answer is 42."));
    }
    let mut t = Sandbox::builder()
        .llm(llm.base_url())
        .workspace(workspace.path())
        .cache(&[("math.evaluate", 0)])
        .start()
        .await;
    let plan = || hermes_proto::TaskPlan {
        nodes: vec![hermes_tests::node(
            "ask",
            "agent.run",
            json!({"instruction": "What is six times seven?", "tools": ["math.evaluate"]}),
            &[],
        )],
        ..Default::default()
    };
    let mut runs = Vec::new();
    for _ in 0..2 {
        let goal_id = t.submit(plan()).await.unwrap();
        let events = t.events(&goal_id).await;
        let names: Vec<_> = events.iter().map(kind_name).collect();
        assert_eq!(names.last().map(String::as_str), Some("completed"), "{names:?}");
        let called = events
            .iter()
            .find_map(|e| match &e.kind {
                Some(hermes_proto::event::Kind::ToolCalled(c)) => Some(c.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no tool call in {names:?}"));
        let records = t
            .client
            .list_model_exchanges(ListModelExchangesRequest { goal_id: goal_id.clone() })
            .await
            .unwrap()
            .into_inner();
        let [call] = records.tool_exchanges.as_slice() else { panic!("{:?}", records.tool_exchanges) };
        runs.push((goal_id, called.cached, call.output_json.clone()));
    }
    // The first computed it; the second was served from the cache, recorded alike.
    assert_eq!((runs[0].1, runs[1].1), (false, true), "cached marks of the two runs");
    assert_eq!(runs[0].2, runs[1].2);
    assert!(runs[0].2.contains("42"), "{}", runs[0].2);

    drop(llm);
    let grpc = t.stack.as_ref().unwrap().grpc_url();
    for (goal_id, cached, _) in &runs {
        let replay = replay_in(goal_id, &grpc, workspace.path(), &[]);
        let stdout = String::from_utf8_lossy(&replay.stdout);
        assert!(
            replay.status.success(),
            "cached: {cached}\n{stdout}\n{}",
            String::from_utf8_lossy(&replay.stderr)
        );
        assert!(
            stdout.contains("no divergence") && stdout.contains("2 model exchanges served"),
            "cached: {cached}\n{stdout}"
        );
    }
    t.stop().await;
}
