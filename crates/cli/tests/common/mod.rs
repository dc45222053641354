//! Helpers shared by the CLI's integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (examples/ lives there).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// True when tshark runs. When it does not: under `CI=true` this panics (CI installs tshark, so
/// its absence is a broken CI image, not a reason to skip); elsewhere it prints a skip message
/// naming `test` and returns false.
pub fn tshark_available(test: &str) -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        other => {
            let why = match other {
                Ok(o) => format!("`tshark --version` exited with {}", o.status),
                Err(e) => format!("cannot run tshark: {e}"),
            };
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{test}: {why}; CI=true requires tshark (.ci/run installs it)");
            }
            eprintln!("SKIPPED {test}: {why}; install tshark to run this comparison");
            false
        }
    }
}

/// A tshark command isolated from any personal Wireshark profile (HOME is `home`).
pub fn tshark(home: &Path) -> Command {
    let mut cmd = Command::new("tshark");
    cmd.env("HOME", home).env("XDG_CONFIG_HOME", home);
    cmd
}
