//! `sparkrt k8s`: plans the profile on this host and prints the manifests
//! `deploy::k8s` builds from the plan; a plan that does not fit produces
//! no manifest at all (exit 3).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::common::HostArgs;
use super::plan::{checkpoint_to_plan_with, planning_what};
use super::{EXIT_DOES_NOT_FIT, find_profile};
use crate::deploy::k8s::{
    ApiKeySecret, DEFAULT_IMAGE, K8sError, ManifestInputs, Workload, build, default_model_dir,
    to_yaml,
};
use crate::plan::profile::Profile;
use crate::plan::report;
use crate::runtime::plan_profile;

#[derive(Debug, clap::Args)]
pub struct K8sArgs {
    /// Profile: a path or a name from profiles/ (e.g. qwen3-30b-a3b-nvfp4).
    #[arg(long, value_name = "PROFILE")]
    pub profile: String,
    /// Run this many pods as a Deployment.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(i32).range(1..), conflicts_with = "daemonset")]
    pub replicas: i32,
    /// Run one pod on every GB10 node (a DaemonSet) instead of a Deployment.
    #[arg(long)]
    pub daemonset: bool,
    /// The model folder on each node, mounted read-only into the pod
    /// [default: /srv/sparkrt/models/<profile name>].
    #[arg(long, value_name = "PATH")]
    pub model_dir: Option<PathBuf>,
    /// Container image that has `sparkrt` on its PATH.
    #[arg(long, value_name = "IMG", default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// The Kubernetes Secret (and its key, default `api-key`) holding the
    /// API key: mounted read-only and passed as `--api-key-file`. Without
    /// it the pods serve with `--insecure-no-api-key` (a warning is printed).
    #[arg(long, value_name = "NAME[:KEY]")]
    pub api_key_secret: Option<String>,
    /// The host to plan against: a GB10 node's tree (default `/`, this machine).
    #[command(flatten)]
    pub host: HostArgs,
}

pub fn run(args: &K8sArgs) -> Result<ExitCode> {
    let api_key = args
        .api_key_secret
        .as_deref()
        .map(ApiKeySecret::parse)
        .transpose()?;
    // Resolve the profile once, so the plan and the ConfigMap use one file.
    let profile_path = find_profile(&args.profile)?;
    let profile_text = crate::util::files::read_regular_to_string(
        &profile_path,
        crate::limits::MAX_SMALL_FILE_BYTES,
    )
    .map_err(|source| K8sError::ReadProfile {
        path: profile_path.clone(),
        source,
    })?;
    let profile_file = file_name(&profile_path);
    let model_dir = match &args.model_dir {
        Some(dir) => dir.clone(),
        None => default_model_dir(&profile_file),
    };
    let profile = Profile::parse(&profile_text, &profile_path.display().to_string())?;
    // The folder is a node path; read its headers only where it also
    // exists here (e.g. when run on a node).
    let checkpoint = checkpoint_to_plan_with(
        model_dir.is_dir().then_some(model_dir.as_path()),
        &profile,
        &profile_path,
    );
    let plan = plan_profile(&profile, checkpoint.as_deref(), &args.host.source())
        .with_context(|| planning_what(checkpoint.as_deref(), &args.host))?;
    if !plan.fits {
        eprint!("{}", report::render(&plan));
        eprintln!("refusing to write manifests: the plan does not fit this host");
        return Ok(ExitCode::from(EXIT_DOES_NOT_FIT));
    }
    let workload = if args.daemonset {
        Workload::DaemonSet
    } else {
        Workload::Deployment {
            replicas: args.replicas,
        }
    };
    let manifests = build(&ManifestInputs {
        profile_file,
        profile_text,
        model_dir,
        image: args.image.clone(),
        workload,
        plan: &plan,
        api_key,
    })?;
    if args.api_key_secret.is_none() {
        eprintln!(
            "warning: no --api-key-secret: the pods listen on 0.0.0.0 with --insecure-no-api-key, \
             so anyone who reaches the Service can use the model"
        );
    }
    print!("{}", to_yaml(&manifests, &plan)?);
    Ok(ExitCode::SUCCESS)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}
