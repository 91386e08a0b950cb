//! Fleet questions on a distributed engine: `--engine spark --remote sc://host:port`.
//!
//! The same commands (`top`, `bursts`, `rates`, `sql`) are compiled to Spark SQL over the lake
//! (`store/LAKE.md`: `switch=/profile=/group=/date=/hour=` Hive partitions) and sent to a Spark
//! Connect server — Sail (`pysail`, DataFusion-based, local or cluster mode) or Apache Spark's
//! connect server — which lists, prunes and scans the files on its own workers. Only aggregated
//! rows come back (per switch and time bucket, or per burst), and the presentation — SONiC's rate
//! math, ranking, formatting — is the local engine's own code, so both engines print the same
//! answer for the same files.
//!
//! * [`client`]: the Spark Connect client (gRPC + Arrow IPC; the protos are declared by hand in
//!   `proto`).
//! * [`lake`]: the session's view of the lake (`lake` temporary view, columns, the exact
//!   nanosecond time expression, files in the lake and files a query reads).
//! * [`compile`]: the SQL each question compiles to (pure functions, exact-string tested).

pub mod client;
pub mod compile;
pub mod lake;
mod proto;

pub use client::{Remote, SparkClient};
pub use lake::Lake;
