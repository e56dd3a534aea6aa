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

/// The claims' columns (docs/evaluation.md): a first answer that parses only after JSON repair
/// (a trailing comma) and computes nothing (`6 *`), a replan that computes 42, and a direct
/// answer that says 42, measured with `--direct --replans 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_planner_measures_repair_replans_and_the_direct_answer() {
    let llm = ScriptedLlm::start().await;
    let broken = r#"{"reasoning": "one product", "nodes": [{"id": "p", "task_type": "math.evaluate", "inputs": {"expression": "6 *"}},], "output_node": "p"}"#;
    llm.push("eval-model", ScriptedResponse::content(broken));
    let fixed = json!({"reasoning": "fixed", "nodes": [
        {"id": "p", "task_type": "math.evaluate", "inputs": {"expression": "6 * 7"}}
    ], "output_node": "p"});
    llm.push("eval-model", ScriptedResponse::content(fixed.to_string()));
    llm.push("eval-model", ScriptedResponse::content("42"));
    let dir = tempfile::tempdir().unwrap();
    let goals = dir.path().join("goals.json");
    std::fs::write(
        &goals,
        json!([{"id": "six-sevens", "goal": "What is 6 times 7?", "task_types": ["math.evaluate"], "depends": [],
                "expect": {"number": 42, "tolerance": 0.01}}])
        .to_string(),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_eval-planner"))
        .args([
            "--goals",
            goals.to_str().unwrap(),
            "--data",
            dir.path().to_str().unwrap(),
            "--direct",
            "--replans",
            "1",
        ])
        .arg(format!("openai:{}#eval-model", llm.base_url()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| l.starts_with("| openai/eval-model"))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    // Two raw answers: one parses as it came, both after repair.
    assert_eq!(&rows[1][2..5], ["2", "50%", "100%"], "{stdout}");
    // Right after one replan (not at the first plan), and the direct answer right too.
    assert_eq!(&rows[2][2..7], ["1", "100%", "0%", "1", "100%"], "{stdout}");
    // Every table's header names each of its row's cells.
    let headers: Vec<usize> =
        stdout.lines().filter(|l| l.starts_with("| model |")).map(|l| l.split('|').count()).collect();
    assert_eq!(headers, rows.iter().map(Vec::len).collect::<Vec<_>>(), "{stdout}");
    assert_eq!(llm.requests_for("eval-model").len(), 3);
}
