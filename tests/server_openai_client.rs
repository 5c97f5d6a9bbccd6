//! The official `openai` Python client against `sparkrt serve`:
//! `scripts/openai_client_check.py` run on a live server. Skips, saying why,
//! where python3 or the package is missing (CI installs it through
//! `scripts/ci-deps.sh`).

use crate::common;
use crate::server;

use server::Server;

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
    let stdout = server.run_script("openai_client_check.py", &[]);
    assert!(stdout.contains("openai client check passed"), "{stdout}");
}
