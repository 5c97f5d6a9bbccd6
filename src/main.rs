//! The `sparkrt` command line: parses arguments, runs one subcommand, and
//! turns errors into messages and exit codes (0 ok, 1 runtime failure,
//! 2 bad input, 3 the plan does not fit).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sparkrt::cli;

/// sparkrt serves Mixture-of-Experts models on a DGX Spark without wedging
/// the host: every byte is planned before anything is allocated.
#[derive(Parser)]
#[command(name = "sparkrt", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as text (colour only on a terminal, never with NO_COLOR)
    /// or as one JSON object each, for log collectors.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: cli::summary::LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Read the host: memory, kubelet reservations, kubepods cgroup, GPU.
    Probe(cli::probe::ProbeArgs),
    /// Budget every byte for a profile on this host; exit 3 if it does not fit.
    Plan(cli::plan::PlanArgs),
    /// Describe a checkpoint folder: architecture, bytes by group, problems.
    Inspect(cli::inspect::InspectArgs),
    /// Print Kubernetes manifests for GB10 nodes, sized by the plan; exit 3 if it does not fit.
    K8s(cli::k8s::K8sArgs),
    /// Generate text from a prompt (streams to stdout).
    Generate(cli::generate::GenerateArgs),
    /// Measure prefill and decode speed against the memory-bandwidth roofline.
    Bench(cli::bench::BenchArgs),
    /// Serve the OpenAI-compatible HTTP API with continuous batching.
    Serve(cli::serve::ServeArgs),
    /// Live unified-memory monitor in the terminal (runs sparkrt-top, the monitor's binary).
    Top(cli::top::TopArgs),
    /// Write a random checkpoint with a real model's geometry (benchmarks).
    MakeCheckpoint(cli::make_checkpoint::MakeCheckpointArgs),
    /// Compile every CUDA kernel with NVRTC (no GPU needed) and list them.
    Kernels(cli::kernels::KernelsArgs),
    /// Write a commented profile from a checkpoint (`profile init --model DIR`).
    Profile(cli::profile::ProfileArgs),
    /// Internal: renders chat templates for `serve` over stdin/stdout, in a
    /// process whose memory is capped (text::render_worker).
    #[command(hide = true)]
    RenderWorker {
        /// Address space the worker caps itself at, bytes.
        memory_bytes: u64,
    },
}

fn main() -> ExitCode {
    let args = Cli::parse();
    cli::summary::init_logging(args.log_format);
    // A kernel tier forced by SPARKRT_ISA that this CPU cannot run is a
    // usage error before any model is read, never a silent fallback.
    if matches!(
        args.command,
        Command::Generate(_) | Command::Bench(_) | Command::Serve(_)
    ) && let Err(error) = sparkrt::backend::cpu::kernels::Isa::choice()
    {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let result = match &args.command {
        Command::Probe(a) => cli::probe::run(a),
        Command::Plan(a) => cli::plan::run(a),
        Command::Inspect(a) => cli::inspect::run(a)
            .map(|()| ExitCode::SUCCESS)
            .map_err(anyhow::Error::from),
        Command::K8s(a) => cli::k8s::run(a),
        Command::Generate(a) => cli::generate::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Serve(a) => cli::serve::run(a),
        Command::Top(a) => cli::top::run(a),
        Command::MakeCheckpoint(a) => cli::make_checkpoint::run(a),
        Command::Kernels(a) => cli::kernels::run(a),
        Command::Profile(a) => cli::profile::run(a),
        Command::RenderWorker { memory_bytes } => {
            sparkrt::text::render_worker_main::serve_stdio(*memory_bytes)
                .map(|()| ExitCode::SUCCESS)
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {}", cli::error_message(&error));
            cli::exit_code_for(&error)
        }
    }
}
