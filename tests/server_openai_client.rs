//! The official `openai` Python client against `sparkrt serve`:
//! `scripts/openai_client_check.py` run on a live server. Skips, saying why,
//! where python3 or the package is missing (CI installs it through
//! `scripts/ci-deps.sh`).

use crate::common;
use crate::server;

use std::process::Command;

use server::{Server, repo};

/// Why the check cannot run here, if it cannot.
fn missing_client() -> Option<String> {
    common::missing_python_modules("openai")
}

#[test]
fn the_official_openai_client_talks_to_the_server() {
    if !common::tool_present("the official openai client", missing_client()) {
        return;
    }
    let server = Server::start(&[]);
    let output = Command::new("python3")
        .arg(repo().join("scripts/openai_client_check.py"))
        .arg(&server.url)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the openai client check failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
    assert!(stdout.contains("openai client check passed"), "{stdout}");
}
