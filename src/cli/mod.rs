//! One module per subcommand. Each `run` returns the process exit code; an
//! error is bad input (exit 2) unless wrapped in [`RuntimeFailure`] (exit 1).

pub mod bench;
mod bench_prefix;
pub mod common;
pub mod cors_args;
pub mod generate;
pub mod inspect;
pub mod k8s;
pub mod kernels;
pub mod make_checkpoint;
pub mod plan;
pub mod probe;
pub mod profile;
pub mod serve;
pub mod summary;
pub mod top;
pub mod vllm_compat;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, bail};

/// Exit code of a plan that does not fit.
pub const EXIT_DOES_NOT_FIT: u8 = 3;
/// Exit code of bad input: a malformed file, flag or checkpoint.
pub const EXIT_BAD_INPUT: u8 = 2;

/// An error that is the runtime's failure, not the user's input (exit 1).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RuntimeFailure(#[from] pub anyhow::Error);

/// Maps an error to the process exit code.
pub fn exit_code_for(error: &anyhow::Error) -> ExitCode {
    if error.downcast_ref::<RuntimeFailure>().is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::from(EXIT_BAD_INPUT)
    }
}

/// The message printed for `error`: its chain joined with ": ", leaving out
/// a cause whose text the message already holds (an error that prints its
/// source and also returns it from `source()` would otherwise say
/// everything twice).
pub fn error_message(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if message.is_empty() {
            message = text;
        } else if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
    }
    message
}

/// Finds a profile: a path, or a name looked up in `./profiles`,
/// `/etc/sparkrt/profiles` and the source tree's `profiles/`.
pub fn find_profile(name_or_path: &str) -> Result<PathBuf> {
    let as_path = Path::new(name_or_path);
    if as_path.is_file() {
        return Ok(as_path.to_path_buf());
    }
    let file_name = if name_or_path.ends_with(".toml") {
        name_or_path.to_string()
    } else {
        format!("{name_or_path}.toml")
    };
    let dirs = [
        PathBuf::from("profiles"),
        PathBuf::from("/etc/sparkrt/profiles"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles"),
    ];
    for dir in &dirs {
        let candidate = dir.join(&file_name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "no profile {name_or_path:?}: not a file, and no {file_name} in {}",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A progress bar on stderr for long work (hidden when stderr is not a terminal).
pub fn progress_bar(message: &'static str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0).with_message(message);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading x: {source}")]
    struct Repeats {
        source: std::io::Error,
    }

    #[test]
    fn error_message_says_each_cause_once() {
        let inner = std::io::Error::other("disk on fire");
        let error = anyhow::Error::from(Repeats { source: inner }).context("loading the model");
        assert_eq!(
            error_message(&error),
            "loading the model: reading x: disk on fire"
        );
        let error = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_message(&error), "outer: inner");
    }
}
