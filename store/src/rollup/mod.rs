//! Burst-preserving rollups: per interval (tier) and object, the figures that answer what the
//! raw stream answers at that resolution, written next to the raw history. Layout, schema and
//! definitions: `store/ROLLUPS.md`.
//!
//! ```text
//!  Arc<CounterBatch> ─▶ Accumulator (finest tier: every sample; kernel.rs for complete rows)
//!                          │ IntervalRow per closed interval
//!                          ▼
//!                       TierWriter(finest) ─ absorb ─▶ TierWriter(coarser) ─▶ …
//! ```
//!
//! * [`config`]: [`RollupConfig`] (`[rollup]`), tiers resolved into [`Tier`]s.
//! * [`plan`]: per session schema, which counters are levels, the rows (objects), the burst
//!   series.
//! * [`burst`]: the above-threshold test (exactly `stel-query bursts`' f64 expression, as an
//!   integer cutoff) and the segment monoid that composes intervals and query windows.
//! * [`accum`]: [`Accumulator`], [`IntervalRow`] and [`IntervalRow::absorb`].
//! * `kernel`: the runtime-dispatched row kernel (the module's only `unsafe`: calls into
//!   `#[target_feature]` functions).

pub mod accum;
pub mod burst;
pub mod config;
#[allow(unsafe_code)]
mod kernel;
pub mod plan;
pub mod rebuild;
pub mod sink;
pub mod writer;

pub use accum::{Accumulator, IntervalRow, SeriesRow, ThresholdRow, NO_TIME};
pub use config::{BurstRule, RollupConfig, Tier, TierConfig};
pub use plan::Plan;
pub use rebuild::{has_raw_history, rebuild, RebuildError, RebuildReport};
pub use sink::{accounting, RollupSink, RollupWriter, WriterTotals};
