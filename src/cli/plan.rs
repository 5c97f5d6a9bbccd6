//! `sparkrt plan`: every byte budgeted before anything is allocated.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::common::HostArgs;
use super::{EXIT_DOES_NOT_FIT, load_profile, model_dir};
use crate::host::gpu;
use crate::plan::{self, Plan, PlanDevice, report};
use crate::runtime::plan_checkpoint;

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
pub fn make_plan(args: &PlanArgs) -> Result<Plan> {
    let (profile, profile_path) = load_profile(&args.profile)?;
    let gpu_present = gpu::probe().first().is_some();
    let device = PlanDevice::resolve(profile.backend.device, gpu_present);
    if let Some(dir) = model_dir(args.model.as_deref(), &profile, &profile_path) {
        // A profile's model.path that is not downloaded yet plans from the
        // geometry; an explicit --model must exist.
        if args.model.is_some() || dir.join("config.json").is_file() {
            let (_, _, plan) = plan_checkpoint(&dir, Some(&profile), &args.host.source(), device)
                .with_context(|| {
                format!("planning with the checkpoint in {}", dir.display())
            })?;
            return Ok(plan);
        }
    }
    let reading = args.host.read(profile.host.kubelet)?;
    Ok(plan::compute(
        &profile,
        &plan::host_figures(&reading),
        None,
        device,
    ))
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
