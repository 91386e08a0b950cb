//! The long view `counters(ts, profile, "group", object, stat, value)`: every session's wide
//! table unpivoted, one row per (snapshot, counter column).
//!
//! It is a [`TableProvider`] of its own rather than a SQL view (a `UNION ALL` of one projection
//! per counter column — 1,920 branches for one 64 × 30 session — takes seconds just to plan, and
//! scans each file once per branch). At scan time:
//! - filters that use only `profile`, `group`, `object` and `stat` are evaluated once per
//!   (session, column) candidate, so `WHERE object = 'Ethernet0' AND stat = 'IF_IN_OCTETS'`
//!   reads exactly one counter column of one session; they are applied exactly (no re-check);
//! - filters on `ts` alone go to the wide scans for row-group/page statistics pruning
//!   ([`crate::catalog::with_pruning`]) and, as `date`/`hour` bounds, to partition pruning;
//!   DataFusion re-applies them above (they are inexact there);
//! - each remaining session is scanned once with just `ts` and its chosen columns, and
//!   [`UnpivotExec`] turns every wide batch of `n` rows into one `n`-row batch per column —
//!   `ts` and `value` are the wide batch's own arrays (no copy), the label columns are constant
//!   arrays reused across batches, and only the projected columns are built.

use std::{collections::HashMap, fmt, sync::Arc};

use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::{
    catalog::{Session as DfSession, TableProvider},
    common::{
        tree_node::{Transformed, TreeNode, TreeNodeRecursion},
        Column as DfColumn, DFSchema, ScalarValue,
    },
    error::{DataFusionError, Result as DfResult},
    execution::{SendableRecordBatchStream, TaskContext},
    logical_expr::{Expr, Operator, TableProviderFilterPushDown, TableType},
    physical_expr::{EquivalenceProperties, PhysicalExpr},
    physical_plan::{
        empty::EmptyExec,
        execution_plan::{Boundedness, EmissionType},
        stream::RecordBatchStreamAdapter,
        union::UnionExec,
        DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
        PlanProperties,
    },
};
use futures::StreamExt;

use crate::{
    catalog::{Catalog, Column},
    error::Result,
};

/// The label columns, in schema order after `ts`.
const LABELS: [&str; 4] = ["profile", "group", "object", "stat"];
const TS: usize = 0;
const VALUE: usize = 5;

/// One session as the long view sees it.
#[derive(Debug)]
struct Source {
    profile: Arc<str>,
    group: Arc<str>,
    columns: Vec<Column>,
    table: Arc<dyn TableProvider>,
}

/// The `counters` table.
#[derive(Debug)]
pub struct LongView {
    schema: SchemaRef,
    sources: Vec<Source>,
}

impl LongView {
    /// The long view over every session of `cat` (`None` when there is none).
    ///
    /// # Errors
    /// A session table that cannot be found in the catalog's context.
    pub async fn new(cat: &Catalog) -> Result<Option<Self>> {
        let mut sources = Vec::new();
        let mut ts_field = None;
        for s in &cat.sessions {
            let table = cat.ctx.table_provider(s.table.as_str()).await?;
            if ts_field.is_none() {
                ts_field = table.schema().field_with_name("ts").ok().cloned();
            }
            sources.push(Source {
                profile: s.profile.as_str().into(),
                group: s.group.as_str().into(),
                columns: s.columns.clone(),
                table,
            });
        }
        let Some(ts_field) = ts_field else {
            return Ok(None);
        };
        let schema = Arc::new(Schema::new(vec![
            ts_field,
            Field::new("profile", DataType::Utf8, false),
            Field::new("group", DataType::Utf8, false),
            Field::new("object", DataType::Utf8, false),
            Field::new("stat", DataType::Utf8, false),
            Field::new("value", DataType::UInt64, true),
        ]));
        Ok(Some(Self { schema, sources }))
    }

    /// Registers `counters` in the catalog's context.
    ///
    /// # Errors
    /// Registration failures.
    pub async fn register(cat: &Catalog) -> Result<()> {
        if let Some(v) = Self::new(cat).await? {
            cat.ctx.register_table("counters", Arc::new(v))?;
        }
        Ok(())
    }
}

/// The columns an expression references (unqualified names).
fn columns_of(e: &Expr) -> Vec<String> {
    let mut out = Vec::new();
    let _ = e.apply(|x| {
        if let Expr::Column(c) = x {
            out.push(c.name.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// How a filter is used: on the labels (decided per column, exactly), on `ts` (pushed to the
/// wide scans, re-checked above), or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    Labels,
    Time,
    None,
}

fn classify(e: &Expr) -> Use {
    if e.is_volatile() {
        return Use::None;
    }
    let cols = columns_of(e);
    if cols.is_empty() {
        Use::None
    } else if cols.iter().all(|c| LABELS.contains(&c.as_str())) {
        Use::Labels
    } else if cols.iter().all(|c| c == "ts") {
        Use::Time
    } else {
        Use::None
    }
}

/// `e` with every column reference unqualified (filters arrive qualified by the view's name).
fn unqualify(e: &Expr) -> DfResult<Expr> {
    Ok(e.clone()
        .transform(|x| {
            Ok(match x {
                Expr::Column(c) if c.relation.is_some() => {
                    Transformed::yes(Expr::Column(DfColumn::new_unqualified(c.name)))
                }
                other => Transformed::no(other),
            })
        })?
        .data)
}

fn ts_ns(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::TimestampNanosecond(Some(n), _) => Some(*n),
        ScalarValue::TimestampMicrosecond(Some(n), _) => n.checked_mul(1_000),
        ScalarValue::TimestampMillisecond(Some(n), _) => n.checked_mul(1_000_000),
        ScalarValue::TimestampSecond(Some(n), _) => n.checked_mul(1_000_000_000),
        _ => None,
    }
}

/// `[lo, hi]` (inclusive, ns) implied by conjunctions of `ts <op> literal`.
fn ts_bounds(filters: &[Expr]) -> (Option<i64>, Option<i64>) {
    let (mut lo, mut hi): (Option<i64>, Option<i64>) = (None, None);
    let mut visit = |e: &Expr| {
        let Expr::BinaryExpr(b) = e else { return };
        let (op, v) = match (b.left.as_ref(), b.right.as_ref()) {
            (Expr::Column(c), Expr::Literal(v, _)) if c.name == "ts" => (b.op, v),
            (Expr::Literal(v, _), Expr::Column(c)) if c.name == "ts" => match b.op.swap() {
                Some(op) => (op, v),
                None => return,
            },
            _ => return,
        };
        let Some(n) = ts_ns(v) else { return };
        let (l, h) = match op {
            Operator::Gt => (Some(n.saturating_add(1)), None),
            Operator::GtEq => (Some(n), None),
            Operator::Lt => (None, Some(n.saturating_sub(1))),
            Operator::LtEq => (None, Some(n)),
            Operator::Eq => (Some(n), Some(n)),
            _ => (None, None),
        };
        if let Some(l) = l {
            lo = Some(lo.map_or(l, |x| x.max(l)));
        }
        if let Some(h) = h {
            hi = Some(hi.map_or(h, |x| x.min(h)));
        }
    };
    for f in filters {
        for c in split_and(f) {
            visit(c);
        }
    }
    (lo, hi)
}

fn split_and(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::BinaryExpr(b) if b.op == Operator::And => {
            let mut v = split_and(&b.left);
            v.extend(split_and(&b.right));
            v
        }
        other => vec![other],
    }
}

impl LongView {
    /// Per source, the indices of the columns the label filters keep.
    fn pick(&self, state: &dyn DfSession, label_filters: &[Expr]) -> DfResult<Vec<Vec<usize>>> {
        let mut picks: Vec<Vec<usize>> = self
            .sources
            .iter()
            .map(|s| (0..s.columns.len()).collect())
            .collect();
        if label_filters.is_empty() {
            return Ok(picks);
        }
        // One row per (source, column): the labels the filters see.
        let schema = Arc::new(Schema::new(
            LABELS
                .iter()
                .map(|n| Field::new(*n, DataType::Utf8, false))
                .collect::<Vec<_>>(),
        ));
        let mut vals: [Vec<&str>; 4] = Default::default();
        for s in &self.sources {
            for c in &s.columns {
                vals[0].push(&s.profile);
                vals[1].push(&s.group);
                vals[2].push(&c.object);
                vals[3].push(&c.stat);
            }
        }
        let n = vals[0].len();
        let arrays: Vec<ArrayRef> = vals
            .iter()
            .map(|v| Arc::new(StringArray::from(v.clone())) as ArrayRef)
            .collect();
        let batch = RecordBatch::try_new(Arc::clone(&schema), arrays)?;
        let df_schema = DFSchema::try_from(Arc::clone(&schema))?;
        let mut keep = vec![true; n];
        for f in label_filters {
            let pe: Arc<dyn PhysicalExpr> = state.create_physical_expr(f.clone(), &df_schema)?;
            let mask = pe.evaluate(&batch)?.into_array(n)?;
            let mask = mask
                .as_any()
                .downcast_ref::<BooleanArray>()
                .ok_or_else(|| {
                    DataFusionError::Plan(format!("filter {f} is not a boolean predicate"))
                })?;
            for (i, k) in keep.iter_mut().enumerate() {
                *k &= mask.is_valid(i) && mask.value(i);
            }
        }
        let mut i = 0;
        for (s, p) in self.sources.iter().zip(picks.iter_mut()) {
            p.clear();
            for c in 0..s.columns.len() {
                if keep[i] {
                    p.push(c);
                }
                i += 1;
            }
        }
        Ok(picks)
    }
}

#[async_trait]
impl TableProvider for LongView {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match classify(f) {
                Use::Labels => TableProviderFilterPushDown::Exact,
                Use::Time => TableProviderFilterPushDown::Inexact,
                Use::None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn DfSession,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let proj: Vec<usize> = projection
            .cloned()
            .unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        let out_schema = Arc::new(self.schema.project(&proj)?);
        let mut label_filters = Vec::new();
        let mut time_filters = Vec::new();
        for f in filters {
            match classify(f) {
                Use::Labels => label_filters.push(unqualify(f)?),
                Use::Time => time_filters.push(unqualify(f)?),
                Use::None => {}
            }
        }
        let (lo, hi) = ts_bounds(&time_filters);
        let part_filters = crate::catalog::partition_bounds(lo, hi);
        let ts_predicate = datafusion::logical_expr::utils::conjunction(time_filters);
        let picks = self.pick(state, &label_filters)?;
        let mut children: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        for (s, pick) in self.sources.iter().zip(picks) {
            if pick.is_empty() {
                continue;
            }
            let wide = s.table.schema();
            let mut wide_proj = vec![wide.index_of("ts")?];
            for c in &pick {
                wide_proj.push(wide.index_of(&s.columns[*c].name)?);
            }
            let mut input = s
                .table
                .scan(state, Some(&wide_proj), &part_filters, None)
                .await?;
            if let Some(p) = &ts_predicate {
                input = crate::catalog::with_pruning(input, p, state)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
            }
            children.push(Arc::new(UnpivotExec::new(
                input,
                Arc::clone(&s.profile),
                Arc::clone(&s.group),
                pick.iter()
                    .map(|c| {
                        let c = &s.columns[*c];
                        (Arc::from(c.object.as_str()), Arc::from(c.stat.as_str()))
                    })
                    .collect(),
                proj.clone(),
                Arc::clone(&out_schema),
            )));
        }
        if children.is_empty() {
            return Ok(Arc::new(EmptyExec::new(out_schema)));
        }
        UnionExec::try_new(children)
    }
}

/// Unpivots a wide scan (`ts`, then one counter column per `cols` entry) into long rows.
#[derive(Debug)]
pub struct UnpivotExec {
    input: Arc<dyn ExecutionPlan>,
    profile: Arc<str>,
    group: Arc<str>,
    /// (object, stat) of input column `i + 1`.
    cols: Vec<(Arc<str>, Arc<str>)>,
    /// Output field `k` is long-view field `proj[k]`.
    proj: Vec<usize>,
    schema: SchemaRef,
    props: Arc<PlanProperties>,
}

impl UnpivotExec {
    fn new(
        input: Arc<dyn ExecutionPlan>,
        profile: Arc<str>,
        group: Arc<str>,
        cols: Vec<(Arc<str>, Arc<str>)>,
        proj: Vec<usize>,
        schema: SchemaRef,
    ) -> Self {
        let parts = input.output_partitioning().partition_count();
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(parts),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            input,
            profile,
            group,
            cols,
            proj,
            schema,
            props,
        }
    }
}

impl DisplayAs for UnpivotExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "UnpivotExec: {}/{}, {} column{}",
            self.profile,
            self.group,
            self.cols.len(),
            if self.cols.len() == 1 { "" } else { "s" }
        )
    }
}

/// Constant string columns, built once at the largest length seen and sliced after that.
#[derive(Default)]
struct Constants {
    arrays: HashMap<Arc<str>, ArrayRef>,
}

impl Constants {
    fn get(&mut self, s: &Arc<str>, n: usize) -> ArrayRef {
        match self.arrays.get(s) {
            Some(a) if a.len() >= n => a.slice(0, n),
            _ => {
                let a: ArrayRef = Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    s.as_ref(),
                    n,
                )));
                self.arrays.insert(Arc::clone(s), Arc::clone(&a));
                a
            }
        }
    }
}

impl ExecutionPlan for UnpivotExec {
    fn name(&self) -> &str {
        "UnpivotExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(
                "UnpivotExec takes one input".into(),
            ));
        }
        Ok(Arc::new(Self::new(
            children.swap_remove(0),
            Arc::clone(&self.profile),
            Arc::clone(&self.group),
            self.cols.clone(),
            self.proj.clone(),
            Arc::clone(&self.schema),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = Arc::clone(&self.schema);
        let (profile, group) = (Arc::clone(&self.profile), Arc::clone(&self.group));
        let cols = self.cols.clone();
        let proj = self.proj.clone();
        let mut consts = Constants::default();
        let out_schema = Arc::clone(&schema);
        let stream = input.flat_map(move |b| {
            let out: Vec<DfResult<RecordBatch>> = match b {
                Err(e) => vec![Err(e)],
                Ok(b) => {
                    let n = b.num_rows();
                    (0..cols.len())
                        .filter(|_| n > 0)
                        .map(|j| {
                            let arrays: Vec<ArrayRef> = proj
                                .iter()
                                .map(|k| match *k {
                                    TS => Arc::clone(b.column(0)),
                                    1 => consts.get(&profile, n),
                                    2 => consts.get(&group, n),
                                    3 => consts.get(&cols[j].0, n),
                                    4 => consts.get(&cols[j].1, n),
                                    VALUE => Arc::clone(b.column(j + 1)),
                                    _ => unreachable!("the long view has six columns"),
                                })
                                .collect();
                            RecordBatch::try_new_with_options(
                                Arc::clone(&out_schema),
                                arrays,
                                &RecordBatchOptions::new().with_row_count(Some(n)),
                            )
                            .map_err(Into::into)
                        })
                        .collect()
                }
            };
            futures::stream::iter(out)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{col, lit};

    #[test]
    fn filters_are_classified_and_bounded() {
        let f = col("object").eq(lit("Ethernet0"));
        assert_eq!(classify(&f), Use::Labels);
        let t = col("ts").gt_eq(lit(ScalarValue::TimestampNanosecond(
            Some(3_600_000_000_000),
            Some("UTC".into()),
        )));
        assert_eq!(classify(&t), Use::Time);
        assert_eq!(classify(&col("value").gt(lit(3u64))), Use::None);
        assert_eq!(
            classify(&col("object").eq(lit("x")).or(col("value").gt(lit(1u64)))),
            Use::None
        );
        let (lo, hi) = ts_bounds(&[t.and(col("ts").lt(lit(ScalarValue::TimestampNanosecond(
            Some(7_200_000_000_000),
            Some("UTC".into()),
        ))))]);
        assert_eq!((lo, hi), (Some(3_600_000_000_000), Some(7_199_999_999_999)));
        assert_eq!(crate::catalog::partition_bounds(lo, hi).len(), 2);
    }
}

/// The synthetic history the bench writes (not a library module; see its docs).
#[cfg(test)]
#[path = "synth.rs"]
mod synth;

#[cfg(test)]
mod data_tests {
    use std::sync::Arc;

    use arrow_array::{cast::AsArray, types::Int64Type};

    use super::synth::{bench_schema, generate, START_NS};

    use crate::catalog::Catalog;

    async fn one(cat: &Catalog, sql: &str) -> i64 {
        let b = cat.ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let b = b.iter().find(|b| b.num_rows() > 0).unwrap();
        let c = arrow::compute::cast(b.column(0), &arrow_schema::DataType::Int64).unwrap();
        c.as_primitive::<Int64Type>().value(0)
    }

    use datafusion::arrow;

    fn at(ms: i64) -> String {
        format!("to_timestamp_nanos({})", START_NS + ms * 1_000_000)
    }

    /// The long view answers like the wide tables, for label, time, value and mixed filters,
    /// over two sessions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn long_view_equals_the_wide_tables() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(bench_schema(4, 5));
        let mut other = bench_schema(2, 3);
        other.profile = "other".into();
        other.group = "QUEUE".into();
        let other = Arc::new(other);
        generate(dir.path(), &a, 3000, 1_000_000).unwrap();
        generate(dir.path(), &other, 500, 1_000_000).unwrap();
        let cat = Catalog::open(dir.path().to_str().unwrap(), true)
            .await
            .unwrap();
        super::LongView::register(&cat).await.unwrap();
        let q = |s: &str| s.to_string();
        let cases: Vec<(String, String)> = vec![
            (
                q("SELECT count(*) FROM counters"),
                q("SELECT (SELECT count(*) FROM bench_port) * 20 + (SELECT count(*) FROM other_queue) * 6"),
            ),
            (
                // Both sessions have Ethernet4.IF_IN_OCTETS.
                q("SELECT count(*) FROM counters WHERE object = 'Ethernet4' AND stat = 'IF_IN_OCTETS'"),
                q("SELECT (SELECT count(*) FROM bench_port) + (SELECT count(*) FROM other_queue)"),
            ),
            (
                q("SELECT count(*) FROM counters WHERE profile = 'other'"),
                q("SELECT count(*) * 6 FROM other_queue"),
            ),
            (
                q("SELECT count(*) FROM counters WHERE \"group\" = 'PORT' AND stat IN ('IF_IN_OCTETS', 'IF_OUT_OCTETS') AND object LIKE 'Ethernet1%'"),
                q("SELECT count(*) * 2 FROM bench_port"),
            ),
            (
                q("SELECT count(*) FROM counters WHERE (object = 'Ethernet0' AND stat = 'IF_IN_OCTETS') OR (object = 'Ethernet4' AND stat = 'IF_OUT_OCTETS')"),
                q("SELECT (SELECT count(*) * 2 FROM bench_port) + (SELECT count(*) FROM other_queue)"),
            ),
            (
                format!("SELECT max(value) - min(value) FROM counters WHERE profile = 'bench' AND object = 'Ethernet8' AND stat = 'IF_OUT_OCTETS' AND ts >= {} AND ts < {}", at(100), at(1100)),
                format!("SELECT max(\"Ethernet8.IF_OUT_OCTETS\") - min(\"Ethernet8.IF_OUT_OCTETS\") FROM bench_port WHERE ts >= {} AND ts < {}", at(100), at(1100)),
            ),
            (
                format!("SELECT count(*) FROM counters WHERE stat = 'IF_IN_OCTETS' AND ts > {}", at(2990)),
                format!("SELECT (SELECT count(*) * 4 FROM bench_port WHERE ts > {0}) + (SELECT count(*) * 2 FROM other_queue WHERE ts > {0})", at(2990)),
            ),
            (
                q("SELECT count(*) FROM counters WHERE stat = 'IF_IN_OCTETS' AND object = 'Ethernet0' AND profile = 'bench' AND value > 1000000"),
                q("SELECT count(*) FROM bench_port WHERE \"Ethernet0.IF_IN_OCTETS\" > 1000000"),
            ),
            (
                // A filter the view cannot decide per column (label OR value) is applied above it.
                q("SELECT count(*) FROM counters WHERE profile = 'other' AND (object = 'Ethernet0' OR value > 1000000000)"),
                q("SELECT (SELECT count(*) * 3 FROM other_queue) + (SELECT count(CASE WHEN \"Ethernet4.IF_IN_OCTETS\" > 1000000000 THEN 1 END) + count(CASE WHEN \"Ethernet4.IF_IN_UCAST_PKTS\" > 1000000000 THEN 1 END) + count(CASE WHEN \"Ethernet4.IF_IN_NON_UCAST_PKTS\" > 1000000000 THEN 1 END) FROM other_queue)"),
            ),
            (
                q("SELECT count(DISTINCT \"group\") FROM counters"),
                q("SELECT 2"),
            ),
            (
                q("SELECT count(*) FROM counters WHERE object = 'Ethernet999'"),
                q("SELECT 0"),
            ),
            (
                q("SELECT count(*) FROM (SELECT * FROM counters LIMIT 7)"),
                q("SELECT 7"),
            ),
        ];
        for (long, wide) in &cases {
            assert_eq!(one(&cat, long).await, one(&cat, wide).await, "{long}");
        }
        assert_eq!(one(&cat, "SELECT count(*) FROM bench_port").await, 3000);
        // One object × stat reads one wide column.
        let plan = cat
            .ctx
            .sql("EXPLAIN SELECT value FROM counters WHERE profile = 'bench' AND object = 'Ethernet4' AND stat = 'IF_IN_OCTETS'")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&plan)
            .unwrap()
            .to_string();
        assert!(text.contains("UnpivotExec: bench/PORT, 1 column"), "{text}");
        assert!(!text.contains("other/QUEUE"), "{text}");
    }
}
