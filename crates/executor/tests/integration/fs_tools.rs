//! The file tools stay inside the workspace: every traversal attempt is denied, for reading,
//! writing, listing and table.aggregate alike.

use hermes_executor::{ToolContext, ToolRegistry};
use serde_json::json;

fn tools() -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    for tool in hermes_executor::tools::builtin_tools() {
        registry.register(tool).unwrap();
    }
    registry
}

struct Dirs {
    workspace: tempfile::TempDir,
    outside: tempfile::TempDir,
}

fn dirs() -> Dirs {
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join("notes")).unwrap();
    std::fs::write(workspace.path().join("notes/a.txt"), "hello").unwrap();
    std::fs::write(outside.path().join("secret.txt"), "a,b\n1,2\n").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), workspace.path().join("link.txt")).unwrap();
    std::os::unix::fs::symlink(outside.path(), workspace.path().join("outdir")).unwrap();
    Dirs { workspace, outside }
}

#[tokio::test]
async fn read_write_and_list_work_inside_the_workspace() {
    let d = dirs();
    let ctx = ToolContext { workspace: d.workspace.path().to_path_buf(), task: None };
    let t = tools();
    let out = t.call("fs.read", json!({"path": "notes/a.txt"}), &ctx).await.unwrap();
    assert_eq!(out["text"], "hello");
    t.call("fs.write", json!({"path": "notes/b.txt", "content": "one"}), &ctx).await.unwrap();
    t.call("fs.write", json!({"path": "notes/b.txt", "content": "+two", "append": true}), &ctx)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(d.workspace.path().join("notes/b.txt")).unwrap(), "one+two");
    let listing = t.call("fs.list", json!({"path": "notes"}), &ctx).await.unwrap();
    assert_eq!(
        listing["entries"],
        json!([{"name": "a.txt", "kind": "file", "size": 5}, {"name": "b.txt", "kind": "file", "size": 7}])
    );
}

#[tokio::test]
async fn every_traversal_attempt_is_denied() {
    let d = dirs();
    let ctx = ToolContext { workspace: d.workspace.path().to_path_buf(), task: None };
    let t = tools();
    let absolute_outside = d.outside.path().join("secret.txt").to_str().unwrap().to_owned();
    let attempts = [
        "../secret.txt",
        "notes/../../secret.txt",
        "/etc/passwd",
        absolute_outside.as_str(),
        "link.txt",
        "outdir/secret.txt",
        "%2e%2e/secret.txt",
        "..%2fsecret.txt",
        "%2E%2E%2Fsecret.txt",
        "notes/a.txt\0.png",
        "notes\\..\\..\\secret.txt",
    ];
    for path in &attempts {
        for (tool, args) in [
            ("fs.read", json!({"path": path})),
            ("fs.list", json!({"path": path})),
            ("table.aggregate", json!({"path": path, "op": "count"})),
        ] {
            let err = t.call(tool, args, &ctx).await.unwrap_err();
            assert_eq!(err.code.as_str(), "INVALID_ARGUMENT", "{tool} {path:?}: {}", err.message);
            assert!(err.message.contains("denied"), "{tool} {path:?} was not denied: {}", err.message);
            assert!(!err.message.contains("a,b"), "{tool} {path:?} leaked the file");
        }
        let err = t.call("fs.write", json!({"path": path, "content": "pwned"}), &ctx).await.unwrap_err();
        assert_eq!(err.code.as_str(), "INVALID_ARGUMENT", "fs.write {path:?}: {}", err.message);
        assert!(err.message.contains("denied"), "fs.write {path:?} was not denied: {}", err.message);
    }
    // Nothing outside was read or changed.
    assert_eq!(std::fs::read_to_string(d.outside.path().join("secret.txt")).unwrap(), "a,b\n1,2\n");
    assert_eq!(std::fs::read_dir(d.outside.path()).unwrap().count(), 1);
}
