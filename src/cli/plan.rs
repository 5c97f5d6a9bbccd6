//! `sparkrt plan`: every byte budgeted before anything is allocated.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use super::EXIT_DOES_NOT_FIT;
use super::common::{HostArgs, ServingArgs, resolve_profile};
use crate::plan::{Plan, report};
use crate::runtime::plan_profile;

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Profile: a path or a name from profiles/ (e.g. qwen3-30b-a3b-nvfp4)
    /// [default with --model: the built-in defaults over the checkpoint].
    #[arg(long, value_name = "PROFILE", required_unless_present = "model")]
    pub profile: Option<String>,
    /// Checkpoint folder: the geometry from its config.json and exact weight
    /// bytes from its safetensors headers [default: the profile's
    /// model.path, once downloaded].
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Print one JSON object (all sizes in bytes) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Plans as `args` ask: profile, flags, host, and the checkpoint if any.
fn make_plan(args: &PlanArgs) -> Result<Plan> {
    if args.profile.is_none() && args.model.is_none() {
        bail!("give --profile NAME, --model DIR, or both");
    }
    let resolved = resolve_profile(
        args.profile.as_deref(),
        args.model.as_deref(),
        &args.serving,
        false,
    )?;
    let checkpoint = resolved.checkpoint.as_deref();
    plan_profile(&resolved.profile, checkpoint, &args.host.source())
        .with_context(|| planning_what(checkpoint, &args.host))
}

/// What a failed plan was reading: the checkpoint's headers, else the host.
pub fn planning_what(checkpoint: Option<&Path>, host: &HostArgs) -> String {
    match checkpoint {
        Some(dir) => format!("planning with the checkpoint in {}", dir.display()),
        None => format!("reading the host below {}", host.host_root.display()),
    }
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
