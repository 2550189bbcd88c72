fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc keeps the build free of a system protobuf-compiler.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded.
    unsafe { std::env::set_var("PROTOC", protoc) };
    // Only the client side of etcd's API is needed: the load generator drives etcd with it.
    tonic_prost_build::configure().build_server(false).compile_protos(&["proto/etcd.proto"], &["proto"])?;
    Ok(())
}
