//! The Hermes wire contract, generated from `proto/hermes/v1`. This is the only crate that runs
//! protobuf code generation; everything else imports the types from here.

#![allow(clippy::all, missing_docs)]

/// Version 1 of the contract.
pub mod v1 {
    tonic::include_proto!("hermes.v1");
    // serde in protobuf's canonical JSON mapping (pbjson).
    include!(concat!(env!("OUT_DIR"), "/hermes.v1.serde.rs"));
    // Every message's strings, for a visitor (build.rs, strings.rs).
    use super::{StringVisitor, VisitStrings};
    include!(concat!(env!("OUT_DIR"), "/hermes.v1.strings.rs"));
}

/// Sees, and may change, every string a message holds: what redaction is built on
/// (`hermes_core::redact::message`), so no field of the contract can be missed by a list.
pub trait StringVisitor {
    /// A singular string field (or a oneof's string variant) named `field`.
    fn field(&mut self, field: &str, value: &mut String);
    /// A string field holding JSON (its name ends in `_json`); `marked` is the message's
    /// `secret_inputs` when it has that field (the keys whose values are secret).
    fn json(&mut self, field: &str, value: &mut String, marked: &[String]);
    /// An element of a repeated string field, or the key of a map whose values are messages.
    fn element(&mut self, field: &str, value: &mut String);
    /// An entry of a `map<string, string>` field.
    fn entry(&mut self, field: &str, key: &mut String, value: &mut String);
}

/// Implemented for every `hermes.v1` message, generated from the descriptor set: hands every
/// string the message holds, nested messages' included, to `visitor`.
pub trait VisitStrings {
    fn visit_strings(&mut self, visitor: &mut dyn StringVisitor);
}

/// The encoded `FileDescriptorSet` of every Hermes proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hermes_descriptor");

pub use v1::*;
