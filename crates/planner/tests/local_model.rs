//! The real SmolLM2 GGUF, run in-process with schema-constrained decoding: every answer to a
//! short goal is a plan that matches the planner's answer schema. Runs when the `local` feature
//! is on (`make test` turns it on and installs the model with `make models`).

#![cfg(feature = "local")]

use std::path::PathBuf;
use std::time::Instant;

use hermes_core::schema::InputSchema;
use hermes_llm::local::{LocalChat, LocalConfig};
use hermes_llm::{ChatRequest, Message};
use hermes_planner::prompt;
use hermes_proto::{CatalogEntry, PlanRequest};

fn model_path() -> PathBuf {
    std::env::var_os("HERMES_SMOLLM2_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    })
}

fn catalogue() -> Vec<CatalogEntry> {
    hermes_executor::tools::builtin_registry().catalog_entries()
}

#[test]
fn short_goals_always_get_a_schema_valid_plan() {
    let model =
        LocalChat::load(&LocalConfig::new(model_path())).expect("the model loads (run `make models`)");
    let entries = catalogue();
    let offered: Vec<&CatalogEntry> = entries.iter().collect();
    let schema = prompt::answer_schema(&offered);
    let validator = InputSchema::compile(schema.clone()).unwrap();
    // Five kinds of goal, one in Chinese; kept short because every goal is minutes of CPU in
    // `make test` (the embedded default, Qwen, is tested end to end in hermes-cli's processes).
    let goals = [
        "What time is it?",
        "Add 2 and 3",
        "Wait one second",
        "Sum the amounts in sales.csv",
        "计算 6 乘以 7",
    ];
    let mut valid = 0;
    let mut tokens = 0;
    let started = Instant::now();
    for goal in goals {
        let request = ChatRequest {
            messages: vec![
                Message::system(prompt::system_message(&offered)),
                Message::user(prompt::user_message(
                    &PlanRequest { goal_text: goal.into(), ..Default::default() },
                    None,
                )),
            ],
            response_schema: Some(("task_plan".into(), schema.clone())),
            ..Default::default()
        };
        let (response, throughput) = model.generate(&request).expect("generation succeeds");
        let text = response.content.unwrap_or_default();
        tokens += response.usage.output_tokens;
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{goal}: {e}: {text}"));
        let violations = validator.check(&value);
        assert!(violations.is_empty(), "{goal}: {text}: {violations:?}");
        valid += 1;
        println!("{goal} -> {text} ({:.0} tok/s out)", throughput.output_tokens_per_s);
    }
    println!(
        "{valid}/{} schema-valid plans, {tokens} tokens in {:.1} s",
        goals.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(valid, goals.len());
}
