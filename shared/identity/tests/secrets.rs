//! `write_secret`: every seed and `.creds` file palisade writes ends up readable by its owner
//! only, whether or not the file existed.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_secret_written_over_a_readable_file_is_readable_by_its_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker.creds");
    std::fs::write(&path, "an older, longer text that must not survive").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();

    identity::write_secret(&path, "the seed").unwrap();

    assert_eq!(mode(&path), 0o600, "mode {:o}", mode(&path));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "the seed");
    // No temporary file is left beside it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn a_new_secret_is_readable_by_its_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("operator.nk");
    identity::write_secret(&path, "the seed").unwrap();
    assert_eq!(mode(&path), 0o600, "mode {:o}", mode(&path));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "the seed");
}

#[test]
fn a_secret_in_a_missing_directory_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent").join("client.creds");
    let error = identity::write_secret(&path, "the seed").unwrap_err();
    assert!(error.to_string().contains("client.creds"), "{error}");
}
