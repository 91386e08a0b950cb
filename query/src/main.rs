//! stel-query: answers questions about stel's counter history. Today it translates SAI stat
//! names and IDs (the names every other command prints); rates, history, bursts, inspect, SQL and
//! export arrive with the store (they read its Parquet files).
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use stel_store::sai::{self, ObjectType};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Questions about stel's counters.
///
/// Examples:
///   stel-query stat PORT 0                       # -> SAI_PORT_STAT_IF_IN_OCTETS
///   stel-query stat SAI_QUEUE_STAT_PACKETS       # -> QUEUE 0
///   stel-query stat QUEUE WRED_ECN_MARKED_PACKETS --json
#[derive(Debug, Parser)]
#[command(version, verbatim_doc_comment)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Look up a SAI stat: `<TYPE> <id|short name>` or `<full C name>`.
    Stat {
        /// Object type (PORT, QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL, ROUTER_INTERFACE,
        /// SWITCH) or a full name like SAI_PORT_STAT_IF_IN_OCTETS.
        first: String,
        /// Stat ID (decimal or 0x hex) or short name.
        second: Option<String>,
        /// Print JSON Lines.
        #[arg(long)]
        json: bool,
    },
}

fn parse_id(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn main() -> ExitCode {
    let Cmd::Stat {
        first,
        second,
        json,
    } = Args::parse().cmd;
    let found = match &second {
        None => sai::stat_by_full_name(&first),
        Some(s) => ObjectType::from_name(&first).and_then(|t| {
            parse_id(s)
                .and_then(|id| t.stat(id))
                .or_else(|| t.stat_by_name(s))
                .map(|st| (t, st))
        }),
    };
    match found {
        Some((t, s)) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"type": "row", "data": {"object_type": t.name(), "object_type_id": t as u32, "stat_id": s.id, "short": s.short, "full": s.full}})
                );
            } else {
                println!("{}\t{}\t{}\t{}", t.name(), s.id, s.short, s.full);
            }
            ExitCode::SUCCESS
        }
        None => {
            eprintln!(
                "stel-query: no such stat: {first} {} (try `stel-query stat PORT IF_IN_OCTETS`; types: PORT, QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL, ROUTER_INTERFACE, SWITCH)",
                second.unwrap_or_default()
            );
            ExitCode::from(1)
        }
    }
}
