//! A smoke of `make eval-planner`: the real binary plans three goals through the scripted
//! OpenAI-compatible server (one right plan, one wrong, one needs-input), runs the plans with the
//! built-in tools, and prints the table with the shares it measured.

use std::process::Command;

use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_planner_scores_plans_by_what_they_compute() {
    let llm = ScriptedLlm::start().await;
    let plan = |expression: &str| {
        json!({"reasoning": "one product", "nodes": [
            {"id": "p", "task_type": "math.evaluate", "inputs": {"expression": expression}}
        ], "output_node": "p"})
        .to_string()
    };
    llm.push("eval-model", ScriptedResponse::content(plan("6 * 7")));
    // Cut off at the limit first: asked again, and the second answer computes the wrong value.
    llm.push("eval-model", ScriptedResponse::content(plan("8 * 8")).with_finish_reason("length"));
    llm.push("eval-model", ScriptedResponse::content(plan("8 * 9")));
    llm.push("eval-model", ScriptedResponse::content(r#"{"needs_input": "No tool sends email."}"#));
    let dir = tempfile::tempdir().unwrap();
    let goals = dir.path().join("goals.json");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        &goals,
        json!([
            {"id": "six-sevens", "goal": "What is 6 times 7?", "task_types": ["math.evaluate"], "depends": [],
             "expect": {"number": 42, "tolerance": 0.01}},
            {"id": "eight-eights", "goal": "What is 8 times 8?", "task_types": ["math.evaluate"], "depends": [],
             "expect": {"number": 64, "tolerance": 0.01}},
            {"id": "email", "goal": "Email Bob the report", "task_types": [], "depends": [],
             "expect": {"needs_input": true}}
        ])
        .to_string(),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_eval-planner"))
        .arg("--goals")
        .arg(&goals)
        .arg("--data")
        .arg(&data)
        .arg(format!("openai:{}#eval-model", llm.base_url()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("wrong output"), "{stdout}");
    let row =
        stdout.lines().find(|l| l.starts_with("| openai/eval-model")).unwrap_or_else(|| panic!("{stdout}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(&cells[2..6], ["3", "100%", "67%", "1"], "goals, schema-valid, right, corrections: {row}");
    assert_eq!(llm.requests_for("eval-model").len(), 4);
}
