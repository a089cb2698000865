//! The `batchrun` binary: argv -> Cli -> Settings -> run -> exit code.

use std::io::Write;
use std::process::ExitCode;

use batchrun::cli::{Cli, Command, RunArgs};
use batchrun::exit;
use batchrun::report::err_line;
use batchrun::settings::{self, Settings};

fn main() -> ExitCode {
    let cli = Cli::parse_with_default(std::env::args_os());
    if matches!(cli.command, Command::Run(_)) {
        // The key is in this process's memory: no core file may hold it.
        batchrun::sys::forbid_core_dumps();
    }
    let rt = match runtime(&cli.command) {
        Ok(rt) => rt,
        Err(e) => {
            err_line(&format!("batchrun: cannot start the async runtime: {e}"));
            return ExitCode::from(exit::FATAL as u8);
        }
    };
    let code = rt.block_on(async {
        match cli.command {
            Command::Run(args) => run(*args).await,
            Command::Sim(args) => match batchrun::sim::run(*args).await {
                Ok(()) => exit::OK,
                Err(e) => {
                    err_line(&format!("batchrun sim: error: {e:#}"));
                    exit::FATAL
                }
            },
            Command::Completions { shell } => {
                batchrun::manual::completions(shell, &mut std::io::stdout());
                exit::OK
            }
            Command::Man => match batchrun::manual::man(&mut std::io::stdout()) {
                Ok(()) => exit::OK,
                // `batchrun man | head`: the reader has what it wanted.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::OK,
                Err(e) => {
                    err_line(&format!("batchrun man: error: {e}"));
                    exit::FATAL
                }
            },
            Command::Plans => match print_out(&batchrun::status::plans_table(), "the plans") {
                true => exit::OK,
                false => exit::FATAL,
            },
            Command::Status(args) => match batchrun::status::status(&args) {
                Ok(text) => match print_out(&text, "the status") {
                    true => exit::OK,
                    false => exit::FATAL,
                },
                Err(e) => {
                    err_line(&format!("batchrun status: error: {e:#}"));
                    exit::FATAL
                }
            },
            Command::Report(args) => match report(&args) {
                Ok(line) => {
                    err_line(&format!("batchrun: {line}"));
                    exit::OK
                }
                Err(e) => {
                    err_line(&format!("batchrun report: error: {e:#}"));
                    exit::FATAL
                }
            },
        }
    });
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// `batchrun report INPUT`: the input's state dir found as `run` finds it
/// (a shard's with `--shard`; a pipe's under `.batchrun/stdin`).
fn report(args: &batchrun::cli::ReportArgs) -> anyhow::Result<String> {
    let input = settings::recorded_input(&args.input)?;
    let base = settings::state_dir_for(&args.input, args.state_dir.as_deref());
    let state_dir = args
        .shard
        .map_or_else(|| base.clone(), |s| base.join(s.tag()));
    let shards = settings::shard_checkpoints(&base);
    if args.shard.is_none() && !batchrun::checkpoint::held(&base) && !shards.is_empty() {
        let each: Vec<String> = shards.iter().map(|(s, _)| s.to_string()).collect();
        anyhow::bail!(
            "{} ran in shards ({}), each with a checkpoint of its own: name one with --shard I/N",
            args.input.display(),
            each.join(", ")
        );
    }
    let named = match &input {
        None => std::path::Path::new("stdin"),
        Some(_) => args.input.as_path(),
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| batchrun::report::html::default_path(named, args.shard, args.format));
    batchrun::report::html::write(&state_dir, input.as_deref(), &out, args.format)
}

/// The async runtime. A run's per-call work is small next to what the
/// kernel spends moving its bytes, so it gets half the cores (at least one):
/// the others are left to the checkpoint's writer thread, sled's flusher,
/// the network stack and, often on the same machine, the API or the sim. On
/// two cores one worker thread needs less CPU per call than two (no tasks
/// passed between threads) and sends as fast. Everything else keeps tokio's
/// default of one worker per core.
fn runtime(command: &Command) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all();
    if matches!(command, Command::Run(_)) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        b.worker_threads((cores / 2).max(1));
    }
    b.build()
}

/// `batchrun run`: with `--sim`, the built-in sim is started here and the
/// run only sees its URL.
async fn run(args: RunArgs) -> i32 {
    let json = args.json;
    let sim = if args.sim {
        // The limits the sim starts with are the command's: a wrong one is
        // a usage error (exit 2), as without --sim, not the sim's failure.
        if let Err(e) = settings::checked_limits(&args) {
            return failed(&e, json);
        }
        let (_, concurrency) = settings::plan_limits(&args);
        let sim_args = batchrun::sim::SimArgs {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            limit: settings::all_limits(&args),
            concurrency: Some(concurrency),
            ..batchrun::sim::SimArgs::default()
        };
        match batchrun::sim::spawn(sim_args).await {
            Ok((addr, handle)) => Some((format!("http://{addr}"), handle)),
            Err(e) => {
                err_line(&format!(
                    "batchrun: error: starting the built-in sim: {e:#}"
                ));
                return exit::FATAL;
            }
        }
    } else {
        None
    };
    let outcome = match Settings::from_cli(&args, sim.as_ref().map(|(u, _)| u.as_str())) {
        Ok(settings) => batchrun::run::run(settings, batchrun::sys::stop_signal).await,
        Err(e) => Err(e),
    };
    if let Some((_, handle)) = sim {
        handle.abort();
    }
    match outcome {
        Ok(summary) => {
            if json {
                match serde_json::to_string(&summary) {
                    // The run's exit code stands: only the summary is lost.
                    Ok(s) => {
                        print_out(&format!("{s}\n"), "the summary");
                    }
                    Err(e) => err_line(&format!("batchrun: cannot print the summary: {e}")),
                }
            }
            summary.exit_code
        }
        Err(e) => failed(&e, json),
    }
}

/// Says why a run could not go (and, with `--json`, prints it as the
/// summary: a script reading it gets an answer on every exit); its exit
/// code.
fn failed(e: &batchrun::exit::RunError, json: bool) -> i32 {
    let message = format!("{e:#}");
    err_line(&format!("batchrun: error: {message}"));
    if json {
        let v = serde_json::json!({
            "state": "error",
            "exit_code": e.exit_code(),
            "message": message,
        });
        print_out(&format!("{v}\n"), "the summary");
    }
    e.exit_code()
}

/// Writes `text` to stdout, or says on stderr that `what` could not be
/// written (a full disk: `--json > /dev/full` was silent). A closed pipe is
/// no error: its reader has read what it wanted. Whether it was written.
fn print_out(text: &str, what: &str) -> bool {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => true,
        Err(e) => {
            err_line(&format!(
                "batchrun: {what} could not be written to stdout: {e}"
            ));
            false
        }
    }
}
