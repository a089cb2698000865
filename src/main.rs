//! The `batchrun` binary: parse, call the library, map the outcome to an exit code.

use std::process::ExitCode;

use std::io::Write;

use batchrun::cli::{Cli, Command};
use batchrun::report::err_line;

fn main() -> ExitCode {
    let cli = Cli::parse_with_default(std::env::args_os());
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            err_line(&format!("batchrun: cannot start the async runtime: {e}"));
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(async {
        match cli.command {
            Command::Run(args) => {
                let json = args.json;
                let shutdown = interrupted();
                match batchrun::runner::run(*args, shutdown).await {
                    Ok(summary) => {
                        if json {
                            match serde_json::to_string(&summary) {
                                Ok(s) => {
                                    let _ = writeln!(std::io::stdout(), "{s}");
                                }
                                Err(e) => {
                                    err_line(&format!("batchrun: cannot print the summary: {e}"))
                                }
                            }
                        }
                        summary.exit_code
                    }
                    Err(e) => {
                        err_line(&format!("batchrun: error: {e:#}"));
                        e.exit_code()
                    }
                }
            }
            Command::Sim(args) => match batchrun::sim::run(args).await {
                Ok(()) => 0,
                Err(e) => {
                    err_line(&format!("batchrun sim: error: {e:#}"));
                    1
                }
            },
            Command::Plans => {
                let _ = write!(
                    std::io::stdout(),
                    "{}",
                    batchrun::report::status::plans_table()
                );
                0
            }
            Command::Status(args) => match batchrun::report::status::status(&args) {
                Ok(text) => {
                    let _ = write!(std::io::stdout(), "{text}");
                    0
                }
                Err(e) => {
                    err_line(&format!("batchrun status: error: {e:#}"));
                    1
                }
            },
        }
    });
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM: a scheduler stopping
/// the job deserves the same clean stop as a person at the terminal. If no
/// handler can be installed it never resolves, and the run ends by itself.
async fn interrupted() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
