fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc keeps the build free of a system protobuf-compiler.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure().compile_protos(&["proto/node.proto"], &["proto"])?;
    Ok(())
}
