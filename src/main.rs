//! The `batchrun` binary: parse, call the library, map the outcome to an exit code.

use std::process::ExitCode;

use batchrun::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse_with_default(std::env::args_os());
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("batchrun: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(async {
        match cli.command {
            Command::Run(args) => {
                let json = args.json;
                let shutdown = async {
                    // If the handler cannot be installed, never resolve:
                    // the run then ends only by itself.
                    if tokio::signal::ctrl_c().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                match batchrun::runner::run(*args, shutdown).await {
                    Ok(summary) => {
                        if json {
                            match serde_json::to_string(&summary) {
                                Ok(s) => println!("{s}"),
                                Err(e) => eprintln!("batchrun: cannot print the summary: {e}"),
                            }
                        }
                        summary.exit_code
                    }
                    Err(e) => {
                        eprintln!("batchrun: error: {e:#}");
                        e.exit_code()
                    }
                }
            }
            Command::Sim(args) => match batchrun::sim::run(args).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("batchrun sim: error: {e:#}");
                    1
                }
            },
            Command::Plans => {
                print!("{}", batchrun::status::plans_table());
                0
            }
            Command::Status(args) => match batchrun::status::status(&args) {
                Ok(text) => {
                    print!("{text}");
                    0
                }
                Err(e) => {
                    eprintln!("batchrun status: error: {e:#}");
                    1
                }
            },
        }
    });
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
