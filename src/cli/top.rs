//! `sparkrt top`: runs the monitor, the `sparkrt-top` binary of the `tui/`
//! crate, so that this binary links no terminal code. The flags go to it
//! as given, with `--probe-bin` naming this binary: each interval the
//! monitor runs `sparkrt probe --json --snapshot` (the probe and headroom
//! formula the plan uses, in `probe.rs`) for its host reading.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, anyhow};

/// The monitor's binary, installed beside `sparkrt`.
pub const MONITOR_BINARY: &str = "sparkrt-top";

#[derive(Debug, clap::Args)]
#[command(disable_help_flag = true)]
pub struct TopArgs {
    /// The monitor's flags, passed to sparkrt-top as given (`sparkrt top
    /// --help` lists them).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "FLAGS"
    )]
    pub flags: Vec<OsString>,
}

/// Replaces this process with the monitor; returns only if that fails.
pub fn run(args: &TopArgs) -> Result<ExitCode> {
    let this = std::env::current_exe()
        .context("cannot find the path of this sparkrt binary")
        .map_err(super::RuntimeFailure)?;
    let monitor = monitor_program(&this);
    let error = Command::new(&monitor)
        .arg("--probe-bin")
        .arg(&this)
        .args(&args.flags)
        .exec();
    let failure = if error.kind() == ErrorKind::NotFound {
        anyhow!(
            "`sparkrt top` runs the monitor binary {MONITOR_BINARY}, found neither beside {} nor on PATH: \
             build it with `cargo build --release` in the source tree (it lands beside \
             target/release/sparkrt), or install both with install.sh",
            this.display()
        )
    } else {
        anyhow!("cannot run the monitor {}: {error}", monitor.display())
    };
    Err(super::RuntimeFailure(failure).into())
}

/// `sparkrt-top` beside this binary (one target folder, one `bin/`), else
/// the bare name, which `exec` looks up on PATH.
fn monitor_program(this: &Path) -> PathBuf {
    let beside = this.with_file_name(MONITOR_BINARY);
    if beside.is_file() {
        beside
    } else {
        PathBuf::from(MONITOR_BINARY)
    }
}
