//! `sparkrt plan`: every byte budgeted before anything is allocated.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::common::HostArgs;
use super::{EXIT_DOES_NOT_FIT, load_profile, model_dir};
use crate::plan::profile::Profile;
use crate::plan::{Plan, report};
use crate::runtime::plan_profile;

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Profile: a path or a name from profiles/ (e.g. qwen3-30b-a3b-nvfp4).
    #[arg(long, value_name = "PROFILE")]
    pub profile: String,
    /// Checkpoint folder: exact weight bytes from its safetensors headers
    /// [default: the profile's model.path, if any].
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub host: HostArgs,
    /// Print one JSON object (all sizes in bytes) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Plans as `args` ask: profile, host, and the checkpoint's headers if any.
fn make_plan(args: &PlanArgs) -> Result<Plan> {
    let (profile, profile_path) = load_profile(&args.profile)?;
    let checkpoint = checkpoint_to_plan_with(args.model.as_deref(), &profile, &profile_path);
    plan_profile(&profile, checkpoint.as_deref(), &args.host.source())
        .with_context(|| planning_what(checkpoint.as_deref(), &args.host))
}

/// What a failed plan was reading: the checkpoint's headers, else the host.
pub fn planning_what(checkpoint: Option<&Path>, host: &HostArgs) -> String {
    match checkpoint {
        Some(dir) => format!("planning with the checkpoint in {}", dir.display()),
        None => format!("reading the host below {}", host.host_root.display()),
    }
}

/// The checkpoint whose headers a plan reads: `explicit` (which must
/// exist), else the profile's model.path once it is downloaded; `None`
/// plans from the profile's geometry.
pub fn checkpoint_to_plan_with(
    explicit: Option<&Path>,
    profile: &Profile,
    profile_path: &Path,
) -> Option<PathBuf> {
    model_dir(explicit, profile, profile_path)
        .filter(|dir| explicit.is_some() || dir.join("config.json").is_file())
}

pub fn run(args: &PlanArgs) -> Result<ExitCode> {
    let plan = make_plan(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", report::render(&plan));
    }
    Ok(if plan.fits {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DOES_NOT_FIT)
    })
}
