//! Compiles proto/coordinator.proto with protox (pure Rust), so building needs no protoc binary.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/coordinator.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // Shared, not copied: the coordinator sends one verdict to every node of a job that ends.
        .bytes(".hangwatch.coordinator.v1.TerminateOrder.verdict_json")
        .compile_fds(descriptors)?;
    Ok(())
}
