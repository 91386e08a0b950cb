//! The CLI's questions as SQL table functions, so a Flight SQL client gets the same answers from
//! the same engine (not a SQL re-statement of it):
//!
//! `rates(group, resolution, profile, speed)` — `stel-query rates`: per interval and interface
//! RX/TX bytes/s, packets/s, utilisation and packets in the interval, SONiC's formulas, computed
//! by [`crate::cmd::rates::compute`] (the bucket scan). All arguments are optional text:
//! - `group`: `'PORT'` (default) or `'ROUTER_INTERFACE'`;
//! - `resolution`: a duration (`'1s'`, `'100ms'`), `'stream'` (every snapshot) or NULL / `''`
//!   (the whole window as one interval, like `rates` without `-r`);
//! - `profile`: the HFT profile when several carry the group;
//! - `speed`: port speed for the `*_util` columns (`'100G'`, `'25G'`, Mb/s; default 100G).
//!
//! The window comes from the query's `ts` bounds (`WHERE ts >= … AND ts < …`, Grafana's
//! `$__timeFilter(ts)`); without any, it is the last minute of data, like the CLI. Columns:
//! `ts` (end of the interval: its last snapshot), `iface`, `rx_ok`, `rx_bps`, `rx_pps`,
//! `rx_util`, `tx_ok`, `tx_bps`, `tx_pps`, `tx_util` (the CLI's `--json` keys; bytes/s,
//! packets/s, %). Rows stream out as the scan produces them.

use std::{fmt, sync::Arc};

use arrow_array::{
    builder::{Float64Builder, StringDictionaryBuilder, TimestampNanosecondBuilder, UInt64Builder},
    types::Int32Type,
    ArrayRef, RecordBatch,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::{
    catalog::{Session as DfSession, TableFunctionArgs, TableFunctionImpl, TableProvider},
    common::ScalarValue,
    error::{DataFusionError, Result as DfResult},
    execution::{SendableRecordBatchStream, TaskContext},
    logical_expr::{Between, BinaryExpr, Expr, Operator, TableProviderFilterPushDown, TableType},
    physical_plan::{
        stream::RecordBatchStreamAdapter,
        streaming::{PartitionStream, StreamingTableExec},
        ExecutionPlan,
    },
    prelude::SessionContext,
};

use crate::{
    catalog::Catalog,
    cmd::rates::{compute, RateRow},
    engine::{resolve_resolution, Progress},
    rates::{self, Rates},
    settings::{parse_time_ns, TimeArgs, TimeRange},
};

/// Rows per batch sent to the client.
const BATCH_ROWS: usize = 8192;

/// Registers the table functions in `ctx`, answering from `cat`.
pub fn register(ctx: &SessionContext, cat: Arc<Catalog>) {
    ctx.register_udtf("rates", Arc::new(RatesFunction { cat }));
}

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
}

/// The schema of `rates(…)`.
pub fn rates_schema() -> SchemaRef {
    let f = |n: &str, t: DataType| Field::new(n, t, true);
    Arc::new(Schema::new(vec![
        Field::new("ts", ts_type(), false),
        Field::new(
            "iface",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            false,
        ),
        f("rx_ok", DataType::UInt64),
        f("rx_bps", DataType::Float64),
        f("rx_pps", DataType::Float64),
        f("rx_util", DataType::Float64),
        f("tx_ok", DataType::UInt64),
        f("tx_bps", DataType::Float64),
        f("tx_pps", DataType::Float64),
        f("tx_util", DataType::Float64),
    ]))
}

struct RatesFunction {
    cat: Arc<Catalog>,
}

impl fmt::Debug for RatesFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RatesFunction").finish_non_exhaustive()
    }
}

/// The text of literal argument `i` (`None` when absent, NULL or empty).
fn text_arg(args: &[Expr], i: usize, name: &str) -> DfResult<Option<String>> {
    let Some(e) = args.get(i) else {
        return Ok(None);
    };
    match e {
        Expr::Literal(v, _) => match v {
            ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s) => {
                Ok(s.clone().filter(|s| !s.is_empty()))
            }
            ScalarValue::Null => Ok(None),
            other => Err(DataFusionError::Plan(format!(
                "rates(): argument {} ({name}) must be text, not {other}",
                i + 1
            ))),
        },
        other => Err(DataFusionError::Plan(format!(
            "rates(): argument {} ({name}) must be a literal, not {other}",
            i + 1
        ))),
    }
}

impl TableFunctionImpl for RatesFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let a = args.exprs();
        if a.len() > 4 {
            return Err(DataFusionError::Plan(
                "rates(group, resolution, profile, speed) takes at most 4 arguments".into(),
            ));
        }
        let group = text_arg(a, 0, "group")?.unwrap_or_else(|| "PORT".into());
        let (stats, group) = match group.to_ascii_uppercase().as_str() {
            "PORT" => (rates::PORT, "PORT"),
            "ROUTER_INTERFACE" | "RIF" => (rates::RIF, "ROUTER_INTERFACE"),
            other => {
                return Err(DataFusionError::Plan(format!(
                    "rates(): group `{other}` has no rates; use 'PORT' or 'ROUTER_INTERFACE'"
                )))
            }
        };
        let resolution = text_arg(a, 1, "resolution")?;
        if let Some(r) = resolution
            .as_deref()
            .filter(|r| !matches!(*r, "stream" | "native"))
        {
            crate::settings::parse_duration_ns(r)
                .map_err(|e| DataFusionError::Plan(format!("rates(): resolution: {e}")))?;
        }
        let profile = text_arg(a, 2, "profile")?;
        let speed = text_arg(a, 3, "speed")?.unwrap_or_else(|| "100G".into());
        let speed_mbps = rates::parse_speed_mbps(&speed)
            .map_err(|e| DataFusionError::Plan(format!("rates(): speed: {e}")))?;
        let session = self
            .cat
            .session(profile.as_deref(), group)
            .map_err(|e| DataFusionError::Plan(format!("rates(): {e}")))?;
        Ok(Arc::new(RatesTable {
            cat: Arc::clone(&self.cat),
            profile: session.profile.clone(),
            group: session.group.clone(),
            stats,
            resolution,
            speed_mbps,
        }))
    }
}

/// One call of `rates(…)`.
struct RatesTable {
    cat: Arc<Catalog>,
    profile: String,
    group: String,
    stats: rates::RateStats,
    resolution: Option<String>,
    speed_mbps: f64,
}

impl fmt::Debug for RatesTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RatesTable")
            .field("profile", &self.profile)
            .field("group", &self.group)
            .field("resolution", &self.resolution)
            .finish_non_exhaustive()
    }
}

/// The bounds a filter puts on `ts`: `(lower, upper)`, each `(ns, inclusive)`.
type Bounds = (Option<(i64, bool)>, Option<(i64, bool)>);

/// A time literal: a timestamp, RFC 3339 text, or ns since the epoch (possibly cast).
fn time_of(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(v, _) => match v {
            ScalarValue::TimestampNanosecond(Some(n), _) => Some(*n),
            ScalarValue::TimestampMicrosecond(Some(n), _) => n.checked_mul(1_000),
            ScalarValue::TimestampMillisecond(Some(n), _) => n.checked_mul(1_000_000),
            ScalarValue::TimestampSecond(Some(n), _) => n.checked_mul(1_000_000_000),
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => parse_time_ns(s).ok(),
            ScalarValue::Int64(Some(n)) => Some(*n),
            _ => None,
        },
        Expr::Cast(c) => time_of(&c.expr),
        Expr::TryCast(c) => time_of(&c.expr),
        _ => None,
    }
}

fn is_ts(e: &Expr) -> bool {
    match e {
        Expr::Column(c) => c.name == "ts",
        Expr::Cast(c) => is_ts(&c.expr),
        _ => false,
    }
}

/// What `e` says about `ts`, if it is a bound on it.
fn bounds_of(e: &Expr) -> Option<Bounds> {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (op, t) = if is_ts(left) {
                (*op, time_of(right)?)
            } else if is_ts(right) {
                (op.swap()?, time_of(left)?)
            } else if *op == Operator::And {
                let (a, b) = (bounds_of(left)?, bounds_of(right)?);
                return Some((a.0.or(b.0), a.1.or(b.1)));
            } else {
                return None;
            };
            match op {
                Operator::Gt => Some((Some((t, false)), None)),
                Operator::GtEq => Some((Some((t, true)), None)),
                Operator::Lt => Some((None, Some((t, false)))),
                Operator::LtEq => Some((None, Some((t, true)))),
                Operator::Eq => Some((Some((t, true)), Some((t, true)))),
                _ => None,
            }
        }
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) if is_ts(expr) => Some((Some((time_of(low)?, true)), Some((time_of(high)?, true)))),
        _ => None,
    }
}

#[async_trait]
impl TableProvider for RatesTable {
    fn schema(&self) -> SchemaRef {
        rates_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        // Time bounds choose the window; the filter still runs above (rows are exact).
        Ok(filters
            .iter()
            .map(|f| {
                if bounds_of(f).is_some() {
                    TableProviderFilterPushDown::Inexact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn DfSession,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let (mut lo, mut hi): (Option<i64>, Option<i64>) = (None, None);
        for f in filters {
            let Some((l, h)) = bounds_of(f) else { continue };
            if let Some((t, incl)) = l {
                let t = if incl { t } else { t.saturating_add(1) };
                lo = Some(lo.map_or(t, |x| x.max(t)));
            }
            if let Some((t, incl)) = h {
                let t = if incl { t.saturating_add(1) } else { t };
                hi = Some(hi.map_or(t, |x| x.min(t)));
            }
        }
        let session = self
            .cat
            .session(Some(&self.profile), &self.group)
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let extent = self
            .cat
            .extent(session)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let time = TimeArgs {
            from: lo.map(|t| t.to_string()),
            to: hi.map(|t| t.to_string()),
            ..TimeArgs::default()
        };
        let window = time
            .resolve(extent)
            .map_err(|e| DataFusionError::Plan(format!("rates(): {e}")))?;
        let schema = rates_schema();
        let part = RatesPartition {
            cat: Arc::clone(&self.cat),
            profile: self.profile.clone(),
            group: self.group.clone(),
            stats: self.stats,
            resolution: self.resolution.clone(),
            speed_mbps: self.speed_mbps,
            window,
            schema: Arc::clone(&schema),
        };
        let exec = StreamingTableExec::try_new(
            schema,
            vec![Arc::new(part)],
            projection,
            Vec::new(),
            false,
            None,
        )?;
        Ok(Arc::new(exec))
    }
}

/// The one partition of a `rates(…)` scan.
struct RatesPartition {
    cat: Arc<Catalog>,
    profile: String,
    group: String,
    stats: rates::RateStats,
    resolution: Option<String>,
    speed_mbps: f64,
    window: TimeRange,
    schema: SchemaRef,
}

impl fmt::Debug for RatesPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RatesPartition")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

/// Columns being filled for one batch.
struct RateBuilders {
    ts: TimestampNanosecondBuilder,
    iface: StringDictionaryBuilder<Int32Type>,
    ok: [UInt64Builder; 2],
    f: [Float64Builder; 6],
    rows: usize,
}

impl RateBuilders {
    fn new() -> Self {
        Self {
            ts: TimestampNanosecondBuilder::with_capacity(BATCH_ROWS).with_timezone("UTC"),
            iface: StringDictionaryBuilder::new(),
            ok: [(); 2].map(|_| UInt64Builder::with_capacity(BATCH_ROWS)),
            f: [(); 6].map(|_| Float64Builder::with_capacity(BATCH_ROWS)),
            rows: 0,
        }
    }

    fn push(&mut self, row: &RateRow<'_>, speed: f64) {
        let x: &Rates = &row.rates;
        self.ts.append_value(row.t_ns);
        self.iface.append_value(row.object);
        self.ok[0].append_option(x.rx_ok);
        self.f[0].append_option(x.rx_bps);
        self.f[1].append_option(x.rx_pps);
        self.f[2].append_option(Rates::util(x.rx_bps, Some(speed)));
        self.ok[1].append_option(x.tx_ok);
        self.f[3].append_option(x.tx_bps);
        self.f[4].append_option(x.tx_pps);
        self.f[5].append_option(Rates::util(x.tx_bps, Some(speed)));
        self.rows += 1;
    }

    fn finish(&mut self, schema: &SchemaRef) -> DfResult<RecordBatch> {
        let [rx_ok, tx_ok] = &mut self.ok;
        let [rx_bps, rx_pps, rx_util, tx_bps, tx_pps, tx_util] = &mut self.f;
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.ts.finish()),
            Arc::new(self.iface.finish()),
            Arc::new(rx_ok.finish()),
            Arc::new(rx_bps.finish()),
            Arc::new(rx_pps.finish()),
            Arc::new(rx_util.finish()),
            Arc::new(tx_ok.finish()),
            Arc::new(tx_bps.finish()),
            Arc::new(tx_pps.finish()),
            Arc::new(tx_util.finish()),
        ];
        self.rows = 0;
        Ok(RecordBatch::try_new(Arc::clone(schema), cols)?)
    }
}

/// Sends `b` to the consumer, waiting while its buffer is full (on the scan's own thread; the
/// runtime's context is entered there, so tokio's blocking send may not be used).
fn send_blocking(
    tx: &mut futures::channel::mpsc::Sender<DfResult<RecordBatch>>,
    b: DfResult<RecordBatch>,
) -> crate::Result<()> {
    futures::executor::block_on(futures::SinkExt::send(tx, b))
        .map_err(|_| crate::Error::Usage("the client went away".into()))
}

impl PartitionStream for RatesPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (mut tx, mut rx) = futures::channel::mpsc::channel::<DfResult<RecordBatch>>(1);
        let cat = Arc::clone(&self.cat);
        let (profile, group) = (self.profile.clone(), self.group.clone());
        let (stats, resolution) = (self.stats, self.resolution.clone());
        let (speed, window, schema) = (self.speed_mbps, self.window, Arc::clone(&self.schema));
        // The rate callback is synchronous and the scan's future is not `Send`: it runs on a
        // thread of its own, driven by the runtime's handle (its scan tasks still run on the
        // runtime), and waits there while the consumer's two-batch buffer is full. When the
        // consumer goes away the next send fails and the scan stops.
        let handle = tokio::runtime::Handle::current();
        let spawned = std::thread::Builder::new()
            .name("stel-query-rates".into())
            .spawn(move || {
                let run = async {
                    let s = cat.session(Some(&profile), &group)?;
                    let width = resolve_resolution(&cat, s, &window, resolution.as_deref()).await?;
                    let objects = s.objects();
                    let progress = Progress::new("rates");
                    let mut b = RateBuilders::new();
                    compute(
                        &cat,
                        s,
                        &objects,
                        &stats,
                        &window,
                        width,
                        None,
                        &progress,
                        |row| {
                            b.push(row, speed);
                            if b.rows >= BATCH_ROWS {
                                let batch = b.finish(&schema)?;
                                send_blocking(&mut tx, Ok(batch))?;
                            }
                            Ok(())
                        },
                    )
                    .await?;
                    if b.rows > 0 {
                        let batch = b.finish(&schema)?;
                        send_blocking(&mut tx, Ok(batch))?;
                    }
                    Ok::<_, crate::Error>(())
                };
                if let Err(e) = handle.block_on(run) {
                    let e = match e {
                        crate::Error::DataFusion(d) => d,
                        // No rows in the window is an empty answer, not an error.
                        crate::Error::NotFound(_) => return,
                        other => DataFusionError::External(Box::new(other)),
                    };
                    let _ = send_blocking(&mut tx, Err(e));
                }
            });
        if let Err(e) = spawned {
            let (mut tx2, rx2) = futures::channel::mpsc::channel(1);
            let _ = tx2.try_send(Err(DataFusionError::External(Box::new(e))));
            rx = rx2;
        }
        let stream = futures::stream::poll_fn(move |cx| {
            futures::Stream::poll_next(std::pin::Pin::new(&mut rx), cx)
        });
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        ))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::logical_expr::{col, lit};

    use super::*;

    #[test]
    fn time_bounds_are_read_from_filters() {
        let t = |s: &str| {
            lit(ScalarValue::TimestampNanosecond(
                Some(parse_time_ns(s).unwrap()),
                Some("UTC".into()),
            ))
        };
        let f = col("ts")
            .gt_eq(t("2023-11-14T22:13:20Z"))
            .and(col("ts").lt(t("2023-11-14T22:13:21Z")));
        let (lo, hi) = bounds_of(&f).unwrap();
        assert_eq!(lo, Some((1_700_000_000_000_000_000, true)));
        assert_eq!(hi, Some((1_700_000_001_000_000_000, false)));
        // Grafana's `$__timeFilter(ts)` before coercion: text on the right.
        let g = col("ts").lt_eq(lit("2023-11-14T22:13:21Z"));
        assert_eq!(
            bounds_of(&g).unwrap().1,
            Some((1_700_000_001_000_000_000, true))
        );
        assert!(bounds_of(&col("iface").eq(lit("Ethernet0"))).is_none());
    }
}
