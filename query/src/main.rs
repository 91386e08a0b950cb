//! The `stel-query` binary: parses the command line and maps results to exit codes
//! (0 = rows, 1 = no rows, 2 = error; a broken pipe exits 0).
use std::process::ExitCode;

use clap::Parser;
use stel_query::{cmd::Cli, output::Format, Error};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.cmd.format() == Format::Json;
    stel_query::output::set_diagnostics(cli.cmd.format());
    match cli.cmd.run() {
        Ok(code) => code,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            let code = match e {
                Error::NotFound(_) => 1,
                _ => 2,
            };
            let skipped = stel_query::quarantine::skipped_total();
            let mut e = if skipped > 0 {
                format!("{e} ({skipped} unreadable or foreign Parquet files were skipped)")
            } else {
                e.to_string()
            };
            if let Some(hint) = stel_query::error::s3_hint(&e, |k| std::env::var(k).ok()) {
                e = format!("{e} {hint}");
            }
            // Credentials of any URL in the message (an S3 endpoint's) stay out of it.
            let message = stel_store::redact::redact(&e).into_owned();
            if json {
                eprintln!(
                    "{}",
                    serde_json::json!({"type": "error", "data": {"message": message, "exit_code": code}})
                );
            } else {
                eprintln!("stel-query: {message}");
            }
            ExitCode::from(code)
        }
    }
}
