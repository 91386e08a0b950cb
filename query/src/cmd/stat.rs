//! `stel-query stat`: SAI stat name ⇔ ID lookup.

use std::process::ExitCode;

use stel_store::sai::{self, ObjectType};

use crate::error::{Error, Result};

/// Look up a SAI stat: `<TYPE> <id|short name>` or `<full C name>`.
///
/// Examples:
///   stel-query stat PORT IF_IN_OCTETS
///   stel-query stat QUEUE 0x2
///   stel-query stat SAI_PORT_STAT_IF_IN_DISCARDS --json
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Object type (PORT, QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL, ROUTER_INTERFACE,
    /// SWITCH) or a full name like SAI_PORT_STAT_IF_IN_OCTETS.
    pub first: String,
    /// Stat ID (decimal or 0x hex) or short name.
    pub second: Option<String>,
    /// Print JSON Lines.
    #[arg(long)]
    pub json: bool,
}

fn parse_id(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// # Errors
/// An unknown stat (exit 1, with a hint).
pub fn run(a: Args) -> Result<ExitCode> {
    let found = match &a.second {
        None => sai::stat_by_full_name(&a.first),
        Some(s) => ObjectType::from_name(&a.first).and_then(|t| {
            parse_id(s)
                .and_then(|id| t.stat(id))
                .or_else(|| t.stat_by_name(s))
                .map(|st| (t, st))
        }),
    };
    let Some((t, s)) = found else {
        return Err(Error::NotFound(format!(
            "no such stat: {} {} (try `stel-query stat PORT IF_IN_OCTETS`; types: PORT, QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL, ROUTER_INTERFACE, SWITCH)",
            a.first,
            a.second.unwrap_or_default()
        )));
    };
    if a.json {
        println!(
            "{}",
            serde_json::json!({"type": "row", "data": {"object_type": t.name(), "object_type_id": t as u32, "stat_id": s.id, "short": s.short, "full": s.full}})
        );
    } else {
        println!("{}\t{}\t{}\t{}", t.name(), s.id, s.short, s.full);
    }
    Ok(ExitCode::SUCCESS)
}
