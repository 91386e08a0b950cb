//! `stel-query completions <shell>`: shell completion scripts from the same clap definition.

use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::error::Result;

/// Print a shell completion script (bash, zsh, fish, elvish, powershell).
///
/// Examples:
///   stel-query completions bash > /etc/bash_completion.d/stel-query
///   stel-query completions zsh > "${fpath[1]}/_stel-query"
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
// `${fpath[1]}` is zsh, not a link: this text is the command's --help.
#[allow(rustdoc::broken_intra_doc_links)]
pub struct Args {
    /// The shell to complete for.
    pub shell: Shell,
}

/// # Errors
/// Never (writing to stdout failures aside).
pub fn run(a: Args) -> Result<ExitCode> {
    let mut cmd = super::Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "stel-query", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
