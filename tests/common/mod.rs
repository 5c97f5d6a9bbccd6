//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (where `profiles/` and `tests/fixtures/` live).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures").join(name)
}

pub fn profile(name: &str) -> PathBuf {
    repo().join("profiles").join(format!("{name}.toml"))
}

/// Whether a test that needs a tool may run: `missing` is why the tool is
/// not here (`None` when it is). Locally the test then skips, printing the
/// reason; under CI (`CI` set, where `scripts/ci-deps.sh` installs every
/// tool) a missing tool fails the test, so a skip never passes for a check.
pub fn tool_present(test: &str, missing: Option<String>) -> bool {
    let Some(why) = missing else {
        return true;
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: {why}, and CI must have it (scripts/ci-deps.sh installs it)"
    );
    eprintln!("skipped {test}: {why} (scripts/ci-deps.sh installs it)");
    false
}

/// Why the command `program` cannot be run with `--version`, if it cannot.
pub fn missing_command(program: &str) -> Option<String> {
    match Command::new(program).arg("--version").output() {
        Ok(_) => None,
        Err(e) => Some(format!("{program} is not installed ({e})")),
    }
}

/// Why python3 cannot `import MODULES` here (a Python import list:
/// `"openai, jsonschema"`), if it cannot.
pub fn missing_python_modules(modules: &str) -> Option<String> {
    match Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output()
    {
        Err(e) => Some(format!("no python3 ({e})")),
        Ok(o) if !o.status.success() => Some(format!(
            "python3 cannot import {modules}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// Runs the `sparkrt` binary with `args`.
pub fn sparkrt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparkrt"))
        .args(args)
        .output()
        .expect("the sparkrt binary runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Parses the JSON a `--json` run printed.
pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}); stdout: {}\nstderr: {}",
            stdout(o),
            stderr(o)
        )
    })
}

/// Writes a fake host tree below `root`: `/proc/meminfo` with the given kB
/// figures and, optionally, a kubelet config and a kubepods cgroup.
pub struct FakeHost {
    pub mem_total_kb: u64,
    pub mem_available_kb: u64,
    pub kubelet_yaml: Option<String>,
    pub kubepods_current: Option<u64>,
}

impl FakeHost {
    pub fn write(&self, root: &Path) {
        std::fs::create_dir_all(root.join("proc")).unwrap();
        std::fs::write(
            root.join("proc/meminfo"),
            format!(
                "MemTotal: {} kB\nMemFree: {} kB\nMemAvailable: {} kB\nBuffers: 1024 kB\nCached: 4096 kB\nShmem: 0 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n",
                self.mem_total_kb,
                self.mem_available_kb / 2,
                self.mem_available_kb
            ),
        )
        .unwrap();
        if let Some(yaml) = &self.kubelet_yaml {
            std::fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
            std::fs::write(root.join("var/lib/kubelet/config.yaml"), yaml).unwrap();
        }
        if let Some(current) = self.kubepods_current {
            let dir = root.join("sys/fs/cgroup/kubepods.slice");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("memory.current"), format!("{current}\n")).unwrap();
            std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        }
    }
}
