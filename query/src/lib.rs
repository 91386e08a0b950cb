//! stel-query: answers questions about stel's counter history.
//!
//! Data flows through the crate in this order: [`settings`] turns what was typed into a data
//! location, a time window and an output format; [`catalog`] registers the Parquet tree the
//! daemon writes (local or `s3://…`) as one DataFusion table per HFT session, with Hive
//! partition pruning and `ts` statistics pruning; [`engine`] runs the vectorised bucket scan the
//! time-series commands share; [`rates`] is SONiC's rate math and portstat's formatting;
//! [`output`] prints tables, CSV or JSON Lines (warnings through [`diag`]); [`cmd`] holds one
//! module per subcommand; [`window`] is the time window and time as text;
//! [`tiers`] plans a question over the raw files and the rollup tiers (the coarsest source
//! that is exact for each part of the window);
//! [`fleet`] runs a command over every switch of a lake (`switch=<name>/` roots) in this
//! process; [`spark`] compiles the fleet questions to Spark SQL for a Spark Connect server;
//! [`cmd::serve`] answers SQL over Arrow Flight SQL from the same catalog.
//!
//! It is its own crate because it links DataFusion (a large, slow-to-build engine) which the
//! daemon must never link; it depends on `stel-store` only for names and the file contract.
#![forbid(unsafe_code)]

pub mod burst;
pub mod catalog;
pub mod chart;
pub mod cmd;
pub mod diag;
pub mod engine;
pub mod error;
pub mod fleet;
pub mod longview;
pub mod output;
pub mod plot;
pub mod quarantine;
pub mod rates;
pub mod settings;
pub mod spark;
pub mod tiers;
pub mod window;

pub use error::{Error, Result};
