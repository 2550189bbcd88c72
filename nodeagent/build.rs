fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc keeps the build free of a system protobuf-compiler.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded.
    unsafe { std::env::set_var("PROTOC", protoc) };
    // The agent only ever calls the runtime; containerd serves CRI.
    tonic_prost_build::configure().build_server(false).compile_protos(&["proto/cri/api.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/cri/api.proto");
    Ok(())
}
