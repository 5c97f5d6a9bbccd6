//! The checkpoint module's error: every variant names the file, and the
//! tensor where there is one, so a user can find what is broken.

use std::fmt;
use std::path::PathBuf;

use super::dtype::Dtype;
use super::header::HeaderError;
use super::quant::QuantError;
use crate::limits::LimitExceeded;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}: the file is {found} bytes, shorter than the {expected} its header describes \
         (truncated after it was opened?)",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error("loading the weights was stopped (shutdown)")]
    Cancelled,
    #[error("{}: no model.safetensors or model.safetensors.index.json", dir.display())]
    NoWeights { dir: PathBuf },
    #[error("{}: {source}", path.display())]
    Header { path: PathBuf, source: HeaderError },
    #[error("{}: not a valid safetensors index: {reason}", path.display())]
    Index { path: PathBuf, reason: String },
    #[error(
        "{}: tensor `{tensor}` points at `{file}`, which is not a file inside the model folder",
        index.display()
    )]
    IndexEscape {
        index: PathBuf,
        tensor: String,
        file: String,
    },
    #[error("{}: shard is missing (the index puts tensor `{tensor}` there)", path.display())]
    MissingShard { path: PathBuf, tensor: String },
    #[error("{}: file changed while opening ({validated} bytes validated, {mapped} mapped)", path.display())]
    FileChanged {
        path: PathBuf,
        validated: u64,
        mapped: u64,
    },
    #[error("{}: index puts tensor `{tensor}` here, but the file does not hold it", path.display())]
    NotInShard { path: PathBuf, tensor: String },
    #[error("{}: holds tensor `{tensor}`, which the index {}", path.display(), listed_elsewhere(listed))]
    NotInIndex {
        path: PathBuf,
        tensor: String,
        listed: Option<PathBuf>,
    },
    #[error("tensor `{tensor}` appears in both {} and {}", first.display(), second.display())]
    DuplicateTensor {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },
    /// A tensor whose values break its format's rules (an INT4 zero point
    /// of a symmetric checkpoint other than 8, a permuting `g_idx`).
    #[error("{}: tensor `{tensor}`: {reason}", path.display())]
    BadValues {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("no tensor named `{0}` in the checkpoint")]
    NoSuchTensor(String),
    #[error("{}: tensor `{tensor}` is {found}, expected {expected}", path.display())]
    WrongDtype {
        path: PathBuf,
        tensor: String,
        found: Dtype,
        expected: String,
    },
    #[error("{}: tensor `{tensor}` has shape {found:?}, expected {expected}", path.display())]
    WrongShape {
        path: PathBuf,
        tensor: String,
        found: Vec<usize>,
        expected: String,
    },
    #[error("{}: tensor `{tensor}`: {source}", path.display())]
    Quant {
        path: PathBuf,
        tensor: String,
        source: QuantError,
    },
    #[error("`{prefix}`: expert {expert} out of range (the tensor holds {num_experts})")]
    ExpertOutOfRange {
        prefix: String,
        expert: usize,
        num_experts: usize,
    },
    #[error("{}: {source}", path.display())]
    ConfigJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    /// A size above its limit in `crate::limits` (not a `source`: the
    /// message already says it, and a source would print it twice).
    #[error("{}: {limit}", path.display())]
    Limit { path: PathBuf, limit: LimitExceeded },
    #[error("{}: {count} {what}, above the limit of {limit}", path.display())]
    TooMany {
        path: PathBuf,
        what: &'static str,
        count: usize,
        limit: usize,
    },
    #[error("{}: model_type `{model_type}` is not supported (qwen3_moe, gpt_oss, qwen3_5_moe, qwen3_5, qwen3_next)", path.display())]
    UnsupportedArchitecture { path: PathBuf, model_type: String },
    /// `supported` lists what sparkrt reads (`quant_config::SUPPORTED`).
    #[error("{}: quantization `{method}` is not supported ({supported})", path.display())]
    UnsupportedQuantization {
        path: PathBuf,
        method: String,
        supported: &'static str,
    },
    /// A scale whose value no format allows (zero, negative, not finite).
    #[error("{}: tensor `{tensor}` holds {value}, not a positive finite scale", path.display())]
    BadScale {
        path: PathBuf,
        tensor: String,
        value: f32,
    },
    /// The config stores a module in a format the scheme's reader does not
    /// know how to find in the checkpoint.
    #[error("{module}: {format} weights in the {scheme} layout are not supported")]
    UnreadFormat {
        module: String,
        format: &'static str,
        scheme: &'static str,
    },
    #[error("{}", TensorProblems(problems))]
    Tensors { problems: Vec<TensorProblem> },
}

fn listed_elsewhere(listed: &Option<PathBuf>) -> String {
    match listed {
        Some(other) => format!("puts in {}", other.display()),
        None => "does not list".to_string(),
    }
}

/// One disagreement between the tensors a model needs and those present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorProblem {
    Missing {
        tensor: String,
        expected: String,
    },
    Unexpected {
        tensor: String,
        file: PathBuf,
    },
    WrongDtype {
        tensor: String,
        file: PathBuf,
        found: Dtype,
        expected: Dtype,
    },
    WrongShape {
        tensor: String,
        file: PathBuf,
        found: Vec<usize>,
        expected: String,
    },
}

impl TensorProblem {
    /// The tensor the problem is about.
    pub fn tensor(&self) -> &str {
        match self {
            TensorProblem::Missing { tensor, .. }
            | TensorProblem::Unexpected { tensor, .. }
            | TensorProblem::WrongDtype { tensor, .. }
            | TensorProblem::WrongShape { tensor, .. } => tensor,
        }
    }
}

impl fmt::Display for TensorProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorProblem::Missing { tensor, expected } => {
                write!(f, "missing tensor `{tensor}` ({expected})")
            }
            TensorProblem::Unexpected { tensor, file } => {
                write!(f, "{}: unexpected tensor `{tensor}`", file.display())
            }
            TensorProblem::WrongDtype {
                tensor,
                file,
                found,
                expected,
            } => write!(
                f,
                "{}: tensor `{tensor}` is {found}, expected {expected}",
                file.display()
            ),
            TensorProblem::WrongShape {
                tensor,
                file,
                found,
                expected,
            } => write!(
                f,
                "{}: tensor `{tensor}` has shape {found:?}, expected {expected}",
                file.display()
            ),
        }
    }
}

/// The list shown for `CheckpointError::Tensors`: every problem up to a
/// screenful, then a count (a wrong architecture can produce thousands).
struct TensorProblems<'a>(&'a [TensorProblem]);

impl fmt::Display for TensorProblems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 40;
        write!(
            f,
            "{} tensor problem(s) for this architecture:",
            self.0.len()
        )?;
        for problem in self.0.iter().take(SHOWN) {
            write!(f, "\n  - {problem}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, "\n  … and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}
