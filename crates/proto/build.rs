//! Compiles `proto/hermes/v1/*.proto` once for the whole workspace, with the vendored protoc so no
//! system protoc is needed, writes the descriptor set that gRPC reflection serves, and derives the
//! canonical JSON mapping (pbjson) that the HTTP API speaks.

use std::path::PathBuf;

use prost::Message as _;

mod strings;

const PROTO_FILES: &[&str] = &[
    "hermes/v1/common.proto",
    "hermes/v1/plan.proto",
    "hermes/v1/task.proto",
    "hermes/v1/goal.proto",
    "hermes/v1/event.proto",
    "hermes/v1/agent.proto",
    "hermes/v1/approval.proto",
    "hermes/v1/memory.proto",
    "hermes/v1/record.proto",
    "hermes/v1/planner.proto",
    "hermes/v1/webhook.proto",
    "hermes/v1/dispatcher.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: checkouts that share a target
    // directory share the compiled script, and each must read its own protos.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let paths: Vec<PathBuf> = PROTO_FILES.iter().map(|f| root.join(f)).collect();
    println!("cargo:rerun-if-changed=strings.rs");
    for path in &paths {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let descriptor_path = out_dir.join("hermes_descriptor.bin");
    tonic_prost_build::configure().file_descriptor_set_path(&descriptor_path).compile_with_config(
        config,
        &paths,
        &[root],
    )?;
    // serde impls in protobuf's canonical JSON mapping, for the HTTP API.
    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new().register_descriptors(&descriptors)?.build(&[".hermes.v1"])?;
    // A visitor of every string of every message, for redaction (src/strings.rs).
    let set = prost_types::FileDescriptorSet::decode(descriptors.as_slice())?;
    std::fs::write(out_dir.join("hermes.v1.strings.rs"), strings::generate(&set))?;
    Ok(())
}
