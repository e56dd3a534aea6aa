//! `hermes eval` against a real stack: the shipped suite passes and writes valid JUnit XML; a
//! deliberately broken case fails for its reason, in the table and in the JUnit XML; and
//! `--baseline` flags the case whose success rate fell. `hermes eval show` lists both runs.

use std::process::{Command, Output};

use hermes_tests::{Sandbox, hermes_bin, repo_root};

fn eval(args: &[&str], server: &str) -> Output {
    Command::new(hermes_bin())
        .arg("eval")
        .args(args)
        .args(["--server", server])
        .current_dir(repo_root())
        .output()
        .unwrap()
}

/// The test cases of a JUnit document, each with its failure text if it has one.
fn junit_cases(path: &std::path::Path) -> Vec<(String, Option<String>)> {
    let text = std::fs::read_to_string(path).unwrap();
    let doc =
        roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("invalid JUnit XML ({e}):\n{text}"));
    let suites = doc.root_element();
    assert_eq!(suites.tag_name().name(), "testsuites");
    suites
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|case| {
            let failure = case.children().find(|n| n.has_tag_name("failure")).map(|f| {
                format!("{} {}", f.attribute("message").unwrap_or_default(), f.text().unwrap_or_default())
            });
            (case.attribute("name").unwrap().to_owned(), failure)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_eval_suite_passes_writes_junit_and_a_broken_case_fails_and_regresses() {
    let t = Sandbox::start().await;
    let server = t.stack.as_ref().unwrap().grpc_url();
    let out = tempfile::tempdir().unwrap();
    let store = out.path().join("store");
    let (run_json, run_xml) = (out.path().join("run.json"), out.path().join("run.xml"));

    let first = eval(
        &[
            "examples/evals/tools.yaml",
            "--json",
            run_json.to_str().unwrap(),
            "--junit",
            run_xml.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ],
        &server,
    );
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(first.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&first.stderr));
    assert!(stdout.contains("total: 100% of runs passed, 4 of 4 cases passed"), "{stdout}");
    let cases = junit_cases(&run_xml);
    assert_eq!(cases.len(), 4, "{cases:?}");
    assert!(cases.iter().all(|(_, failure)| failure.is_none()), "{cases:?}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&run_json).unwrap()).unwrap();
    assert_eq!(report["cases"][0]["runs"].as_array().unwrap().len(), 3, "three runs a case");

    // The same suite with one expectation wrong.
    let suite = std::fs::read_to_string(repo_root().join("examples/evals/tools.yaml")).unwrap();
    let plan = repo_root().join("examples/plans/sales-report.yaml");
    let broken = suite
        .replacen("equals: 42", "equals: 43", 1)
        .replace("plan_file: ../plans/sales-report.yaml", &format!("plan_file: {}", plan.display()));
    assert_ne!(broken, suite);
    let broken_path = out.path().join("broken.yaml");
    std::fs::write(&broken_path, broken).unwrap();
    let broken_xml = out.path().join("broken.xml");
    let second = eval(
        &[
            broken_path.to_str().unwrap(),
            "--baseline",
            run_json.to_str().unwrap(),
            "--junit",
            broken_xml.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ],
        &server,
    );
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert_eq!(second.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&second.stderr));
    assert!(stdout.contains("output.value: expected 43, got 42"), "{stdout}");
    assert!(
        stdout.contains("regression against the baseline: arithmetic: success rate 0%, was 100%"),
        "{stdout}"
    );
    let cases = junit_cases(&broken_xml);
    for (name, failure) in &cases {
        match name.as_str() {
            "arithmetic" => {
                let failure =
                    failure.as_deref().unwrap_or_else(|| panic!("no failure for arithmetic: {cases:?}"));
                assert!(
                    failure.contains("expected 43, got 42") && failure.contains("regression"),
                    "{failure}"
                );
            }
            _ => assert!(failure.is_none(), "{name} failed: {failure:?}"),
        }
    }

    // Both runs are stored.
    let shown = Command::new(hermes_bin())
        .args(["eval", "show", "--store", store.to_str().unwrap()])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{listing}");
    assert_eq!(listing.lines().filter(|l| l.contains(" tools ")).count(), 2, "{listing}");
    assert!(listing.contains("passed") && listing.contains("FAILED"), "{listing}");
    t.stop().await;
}

#[test]
fn a_suite_with_a_case_of_two_goals_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "name: bad\ncases:\n  - name: both\n    text: add two numbers\n    plan: {nodes: [{id: a, task_type: math.evaluate, inputs: {expression: \"1\"}}]}\n",
    )
    .unwrap();
    let out = Command::new(hermes_bin())
        .args(["eval", path.to_str().unwrap(), "--server", "127.0.0.1:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("case `both`: give exactly one of `text`, `plan` and `plan_file`"), "{stderr}");
}

/// Every shipped suite is valid (the slow ones run by hand: docs/evaluation.md): checked before
/// any connection, so with no server the only error left is the connection's.
#[test]
fn every_shipped_suite_is_valid() {
    let dir = repo_root().join("examples/evals");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        seen += 1;
        let out = Command::new(hermes_bin())
            .args(["eval", path.to_str().unwrap(), "--server", "127.0.0.1:1"])
            .current_dir(repo_root())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", path.display());
        assert!(stderr.contains("127.0.0.1:1"), "{} failed before connecting: {stderr}", path.display());
    }
    assert!(seen >= 2, "no suites in {}", dir.display());
}
