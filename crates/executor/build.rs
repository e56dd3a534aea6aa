//! Links the agent binary (`hermes-executor`) with packed relative relocations (DT_RELR, glibc
//! 2.36 and later, which the deployment image has): the dynamic loader reads a table of a few
//! kilobytes at start instead of over a megabyte of `.rela.dyn`, which every process of an agent
//! (its supervisor and its worker) otherwise keeps resident. See `src/lean.rs`.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
