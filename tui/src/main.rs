//! `sparkrt-top`: the monitor's binary. `sparkrt top FLAGS` runs it with
//! `--probe-bin` naming the `sparkrt` binary, whose probe reads the host; it
//! also runs on its own. Exit codes as `sparkrt`'s: 0 ok, 1 runtime failure,
//! 2 bad input.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sparkrt_tui::probe::{ProbeCommand, ProbeTarget};
use sparkrt_tui::{TopError, TopOptions, parse_interval};

const EXIT_BAD_INPUT: u8 = 2;

/// Live unified-memory monitor of a sparkrt server: the pool, the ledger,
/// serving, the host and its processes (`sparkrt top` runs this).
#[derive(Parser)]
#[command(name = "sparkrt-top", version)]
struct Args {
    /// Base URL of a running `sparkrt serve` (host panels only without one).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Read the host below this directory instead of `/` (fake trees in tests).
    #[arg(long, value_name = "DIR", default_value = "/")]
    host_root: PathBuf,
    /// Kubelet configuration file [default: <host-root>/var/lib/kubelet/config.yaml if present].
    #[arg(long, value_name = "FILE")]
    kubelet_config: Option<PathBuf>,
    /// Time between samples, e.g. 500ms or 2s.
    #[arg(long, default_value = "500ms", value_parser = parse_interval)]
    interval: Duration,
    /// Profile whose [host] reserves draw the usable line [default: built-in reserves].
    #[arg(long)]
    profile: Option<String>,
    /// The `sparkrt` binary that reads the host (`sparkrt probe --json
    /// --snapshot`) [default: `sparkrt` beside this binary, else on PATH].
    #[arg(long, value_name = "PATH")]
    probe_bin: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let target = ProbeTarget {
        host_root: args.host_root,
        kubelet_config: args.kubelet_config,
        profile: args.profile,
    };
    let probe = ProbeCommand::new(args.probe_bin.unwrap_or_else(default_probe_bin), &target);
    // Fail fast on a bad host tree or a missing probe rather than inside the
    // full-screen UI.
    if let Err(error) = probe.snapshot() {
        eprintln!("error: {error}");
        let code = error.exit_code().and_then(|c| u8::try_from(c).ok());
        return code.map_or(ExitCode::FAILURE, ExitCode::from);
    }
    let options = TopOptions {
        server_url: args.url,
        interval: args.interval,
        ..TopOptions::default()
    };
    match sparkrt_tui::run(options, Box::new(probe)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            match error {
                TopError::Url(_) => ExitCode::from(EXIT_BAD_INPUT),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// `sparkrt` beside this binary (both are built into one target folder and
/// installed into one `bin/`), else plain `sparkrt`, looked up on PATH.
fn default_probe_bin() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name("sparkrt"));
    beside
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("sparkrt"))
}
