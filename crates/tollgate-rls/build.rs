//! Compiles the vendored .proto files with protox (a protobuf compiler in Rust, so the build
//! needs no `protoc` on the machine) and generates prost messages and tonic clients.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/envoy/service/ratelimit/v3/rls.proto",
        "proto/grpc/health/v1/health.proto",
    ];
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        // The server side is hand-written on hyper (src/calls.rs); only clients are generated.
        .build_server(false)
        // Small per-call buffers (src/codec.rs): a stream held open by the peer keeps less.
        .codec_path("crate::codec::SmallCodec")
        .compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
