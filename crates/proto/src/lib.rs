//! The Hermes wire contract, generated from `proto/hermes/v1`. This is the only crate that runs
//! protobuf code generation; everything else imports the types from here.

#![allow(clippy::all, missing_docs)]

/// Version 1 of the contract.
pub mod v1 {
    tonic::include_proto!("hermes.v1");
    // serde in protobuf's canonical JSON mapping (pbjson).
    include!(concat!(env!("OUT_DIR"), "/hermes.v1.serde.rs"));
}

/// The encoded `FileDescriptorSet` of every Hermes proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hermes_descriptor");

pub use v1::*;
