//! Compiles `proto/` with protox, so no `protoc` binary is needed to build palisade.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["palisade/v1/palisade.proto"], ["proto"])?;
    prost_build::Config::new()
        // A lease token is a secret: `LeaseRef`'s Debug (src/lib.rs) never shows it, so no
        // `?message` in a log line or span can leak one.
        .skip_debug(["palisade.v1.LeaseRef"])
        .compile_fds(descriptors)?;
    Ok(())
}
