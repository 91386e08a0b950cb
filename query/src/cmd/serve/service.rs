//! The Flight SQL service: statements and prepared statements (SQL through DataFusion, read-only),
//! and the metadata calls generic clients browse with (catalogs, schemas, tables, table types,
//! SQL info).
//!
//! A statement is planned when its `FlightInfo` is asked for (schema, errors early) and planned
//! again and run when its ticket is fetched: the ticket is the SQL text itself, so the server
//! keeps no per-statement state and any ticket goes through the same checks. Results stream:
//! the query runs on the engine's runtime and hands batches over a channel of two, so a slow
//! client holds the query back instead of the server buffering its answer.

use std::{pin::Pin, sync::Arc};

use arrow_array::RecordBatch;
use arrow_flight::{
    encode::FlightDataEncoderBuilder,
    error::FlightError,
    flight_service_server::FlightService,
    sql::{
        metadata::{SqlInfoData, SqlInfoDataBuilder},
        server::{FlightSqlService, PeekableFlightDataStream},
        ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
        ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas,
        CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
        CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
        CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
        TicketStatementQuery,
    },
    FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage,
    SchemaAsIpc, Ticket,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::{
    catalog::TableProvider,
    execution::{
        disk_manager::{DiskManagerBuilder, DiskManagerMode},
        memory_pool::{GreedyMemoryPool, TrackConsumersPool},
        runtime_env::RuntimeEnvBuilder,
        SessionStateBuilder,
    },
    logical_expr::{LogicalPlan, TableType},
    prelude::SessionContext,
};
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tokio::{
    sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore},
    time::Instant,
};
use tonic::{metadata::MetadataValue, Request, Response, Status, Streaming};

use super::limits::{classify, Limits, Refusal, Stats};
use crate::engine::SqlAccess;

type DoGetStream = <FlightSqlServer as FlightService>::DoGetStream;

/// The server's shared state.
struct Inner {
    /// The catalog's context (tables, functions, object stores); each query runs on a copy with
    /// its own memory pool.
    ctx: SessionContext,
    /// The runtime queries execute on (the gRPC runtime only moves bytes).
    exec: tokio::runtime::Handle,
    limits: Limits,
    permits: Arc<Semaphore>,
    stats: Arc<Stats>,
    token: Option<Arc<str>>,
    sql_info: SqlInfoData,
    /// Turns true when the server is stopping: running queries end with `UNAVAILABLE`.
    stop: watch::Receiver<bool>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("limits", &self.limits)
            .field("stats", &self.stats)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

/// The Flight SQL service (cheap to clone).
#[derive(Debug, Clone)]
pub(super) struct FlightSqlServer {
    inner: Arc<Inner>,
}

impl FlightSqlServer {
    /// A service over `ctx` running queries on `exec`.
    ///
    /// # Errors
    /// The SQL info table cannot be built (a bug).
    pub(super) fn new(
        ctx: SessionContext,
        exec: tokio::runtime::Handle,
        limits: Limits,
        stats: Arc<Stats>,
        token: Option<Arc<str>>,
        stop: watch::Receiver<bool>,
    ) -> crate::Result<Self> {
        let mut b = SqlInfoDataBuilder::new();
        b.append(SqlInfo::FlightSqlServerName, "stel-query");
        b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        b.append(SqlInfo::FlightSqlServerArrowVersion, "59");
        b.append(SqlInfo::FlightSqlServerReadOnly, true);
        b.append(SqlInfo::FlightSqlServerSql, true);
        b.append(SqlInfo::FlightSqlServerSubstrait, false);
        b.append(SqlInfo::FlightSqlServerTransaction, 0i32);
        b.append(SqlInfo::FlightSqlServerCancel, false);
        b.append(SqlInfo::FlightSqlServerBulkIngestion, false);
        b.append(
            SqlInfo::FlightSqlServerStatementTimeout,
            limits.query_timeout.as_millis() as i32,
        );
        b.append(SqlInfo::SqlDdlCatalog, false);
        b.append(SqlInfo::SqlDdlSchema, false);
        b.append(SqlInfo::SqlDdlTable, false);
        b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
        b.append(SqlInfo::SqlAllTablesAreSelectable, true);
        b.append(SqlInfo::SqlTransactionsSupported, false);
        let sql_info = b
            .build()
            .map_err(|e| crate::Error::Usage(format!("SQL info: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                ctx,
                exec,
                permits: Arc::new(Semaphore::new(limits.max_queries.max(1))),
                limits,
                stats,
                token,
                sql_info,
                stop,
            }),
        })
    }

    fn refuse(&self, r: Refusal, m: impl Into<String>) -> Status {
        self.inner.stats.refuse(r, m)
    }

    /// Plans `sql` under read-only access: parse and plan errors are `INVALID_ARGUMENT`, a
    /// statement that writes or changes state `PERMISSION_DENIED`.
    async fn plan(ctx: &SessionContext, stats: &Stats, sql: &str) -> Result<LogicalPlan, Status> {
        let plan = ctx
            .state()
            .create_logical_plan(sql)
            .await
            .map_err(|e| stats.refuse(classify(&e), e.to_string()))?;
        SqlAccess::ReadOnly
            .options()
            .verify_plan(&plan)
            .map_err(|e| {
                let why = match &e {
                    datafusion::error::DataFusionError::Plan(m) => m.clone(),
                    other => other.to_string(),
                };
                stats.refuse(
                    Refusal::ReadOnly,
                    format!("read-only server: {why}; only reading statements run here (SELECT, WITH, VALUES, SHOW, DESCRIBE, EXPLAIN)"),
                )
            })?;
        Ok(plan)
    }

    /// The `FlightInfo` of a statement: its result schema and one endpoint whose ticket is the
    /// SQL itself.
    async fn statement_info(
        &self,
        sql: &str,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = self.schema_of(sql).await?;
        let ticket = TicketStatementQuery {
            statement_handle: sql.as_bytes().to_vec().into(),
        };
        let endpoint =
            FlightEndpoint::new().with_ticket(Ticket::new(ticket.as_any().encode_to_vec()));
        let info = FlightInfo::new()
            .try_with_schema(&schema)
            .map_err(|e| Status::internal(format!("encoding the schema: {e}")))?
            .with_endpoint(endpoint)
            .with_descriptor(descriptor)
            .with_ordered(true);
        Ok(Response::new(info))
    }

    /// The schema clients will receive for `sql`: the plan's, with dictionary columns as their
    /// values (the encoder sends dictionaries hydrated, which every client reads).
    async fn schema_of(&self, sql: &str) -> Result<Schema, Status> {
        let plan = Self::plan(&self.inner.ctx, &self.inner.stats, sql).await?;
        Ok(hydrated(plan.schema().as_arrow()))
    }

    /// A context for one query: the catalog's tables and functions, a memory pool of
    /// `--query-memory` bytes and no spilling.
    fn query_context(&self) -> Result<SessionContext, Status> {
        let state = self.inner.ctx.state();
        let pool = TrackConsumersPool::new(
            GreedyMemoryPool::new(self.inner.limits.query_memory),
            std::num::NonZeroUsize::new(3).unwrap_or(std::num::NonZeroUsize::MIN),
        );
        let rt = RuntimeEnvBuilder::from_runtime_env(state.runtime_env())
            .with_memory_pool(Arc::new(pool))
            .with_disk_manager_builder(
                DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
            )
            .build_arc()
            .map_err(|e| Status::internal(format!("query runtime: {e}")))?;
        let state = SessionStateBuilder::new_from_existing(state)
            .with_runtime_env(rt)
            .build();
        Ok(SessionContext::new_with_state(state))
    }

    /// Runs `sql` and streams its result.
    async fn execute(&self, sql: String) -> Result<Response<DoGetStream>, Status> {
        let inner = &self.inner;
        inner
            .stats
            .queries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let permit = Arc::clone(&inner.permits).try_acquire_owned().map_err(|_| {
            self.refuse(
                Refusal::Busy,
                format!(
                    "busy: {} running, the server's limit (--max-queries); retry when one has finished",
                    match inner.limits.max_queries {
                        1 => "1 query is".to_string(),
                        n => format!("{n} queries are"),
                    }
                ),
            )
        })?;
        let deadline = Instant::now() + inner.limits.query_timeout;
        let ctx = self.query_context()?;
        let stats = Arc::clone(&inner.stats);
        let memory = inner.limits.query_memory;
        let (schema_tx, schema_rx) = oneshot::channel::<Result<SchemaRef, Status>>();
        let (tx, rx) = mpsc::channel::<Result<RecordBatch, Status>>(2);
        let task = inner.exec.spawn(async move {
            let plan = match Self::plan(&ctx, &stats, &sql).await {
                Ok(p) => p,
                Err(s) => {
                    let _ = schema_tx.send(Err(s));
                    return;
                }
            };
            // The schema announced is what `FlightInfo` said (the plan's, hydrated); the
            // engine's batches can be stricter about nulls or use view types: relabelled.
            let schema: SchemaRef = Arc::new(hydrated(plan.schema().as_arrow()));
            let stream = match ctx.execute_logical_plan(plan).await {
                Ok(df) => df.execute_stream().await,
                Err(e) => Err(e),
            };
            let mut stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    let _ = schema_tx.send(Err(engine_error(&stats, memory, &e)));
                    return;
                }
            };
            if schema_tx.send(Ok(Arc::clone(&schema))).is_err() {
                return;
            }
            while let Some(b) = stream.next().await {
                let b = b
                    .and_then(|b| relabel(b, &schema))
                    .map_err(|e| engine_error(&stats, memory, &e));
                let end = b.is_err();
                if tx.send(b).await.is_err() || end {
                    return;
                }
            }
        });
        let guard = QueryGuard {
            _permit: permit,
            task: task.abort_handle(),
        };
        let mut stop = inner.stop.clone();
        let timeout = inner.limits.query_timeout;
        let schema = tokio::select! {
            r = schema_rx => r.map_err(|_| Status::internal("the query task ended without an answer"))??,
            _ = tokio::time::sleep_until(deadline) => {
                return Err(self.refuse(Refusal::Timeout, timeout_message(timeout)));
            }
            _ = stop.wait_for(|s| *s) => {
                return Err(self.refuse(Refusal::ShuttingDown, "the server is stopping"));
            }
        };
        let batches = ResultStream {
            rx,
            deadline,
            timeout,
            stop,
            stats: Arc::clone(&inner.stats),
            _guard: guard,
            done: false,
        }
        .into_stream();
        let flight = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(batches.map_err(|s| FlightError::Tonic(Box::new(s))))
            .map_err(|e| match e {
                FlightError::Tonic(s) => *s,
                other => Status::internal(other.to_string()),
            });
        Ok(Response::new(Box::pin(flight)))
    }

    /// A metadata answer (one batch) as a `DoGet` stream.
    fn one_batch(batch: RecordBatch) -> Response<DoGetStream> {
        let schema = batch.schema();
        let s = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(futures::stream::once(async move { Ok(batch) }))
            .map_err(|e| Status::internal(e.to_string()));
        Response::new(Box::pin(s))
    }

    /// `FlightInfo` for a metadata command: its schema and a ticket that is the command.
    fn metadata_info(
        cmd: Any,
        schema: &Schema,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(cmd.encode_to_vec()));
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(|e| Status::internal(format!("encoding the schema: {e}")))?
            .with_endpoint(endpoint)
            .with_descriptor(descriptor);
        Ok(Response::new(info))
    }
}

/// The status for an engine failure while a query runs (counted by kind).
fn engine_error(stats: &Stats, memory: usize, e: &datafusion::error::DataFusionError) -> Status {
    match classify(e) {
        Refusal::Memory => stats.refuse(
            Refusal::Memory,
            format!(
                "the query needs more than the server's limit of {:.0} MiB per query (--query-memory); narrow its window, aggregate before sorting, or add a LIMIT: {e}",
                memory as f64 / (1 << 20) as f64
            ),
        ),
        r => stats.refuse(r, e.to_string()),
    }
}

fn timeout_message(t: std::time::Duration) -> String {
    format!(
        "the query ran longer than the server's limit of {:?} (--query-timeout) and was cancelled; narrow its time window or aggregate more",
        t
    )
}

/// Holds a query's concurrency permit and cancels its task when the response is dropped
/// (finished, failed, timed out or abandoned by the client).
#[derive(Debug)]
struct QueryGuard {
    _permit: OwnedSemaphorePermit,
    task: tokio::task::AbortHandle,
}

impl Drop for QueryGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The batches of one query, with its deadline and the server's stop signal.
struct ResultStream {
    rx: mpsc::Receiver<Result<RecordBatch, Status>>,
    deadline: Instant,
    timeout: std::time::Duration,
    stop: watch::Receiver<bool>,
    stats: Arc<Stats>,
    _guard: QueryGuard,
    done: bool,
}

impl ResultStream {
    fn into_stream(self) -> impl Stream<Item = Result<RecordBatch, Status>> + Send + 'static {
        futures::stream::unfold(self, |mut s| async move {
            if s.done {
                return None;
            }
            let item = tokio::select! {
                b = s.rx.recv() => b,
                _ = tokio::time::sleep_until(s.deadline) => {
                    Some(Err(s.stats.refuse(Refusal::Timeout, timeout_message(s.timeout))))
                }
                _ = s.stop.wait_for(|v| *v) => {
                    Some(Err(s.stats.refuse(Refusal::ShuttingDown, "the server is stopping")))
                }
            };
            match item {
                None => {
                    s.stats
                        .completed
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    None
                }
                Some(Ok(b)) => {
                    s.stats
                        .rows
                        .fetch_add(b.num_rows() as u64, std::sync::atomic::Ordering::Relaxed);
                    Some((Ok(b), s))
                }
                Some(Err(e)) => {
                    s.done = true;
                    Some((Err(e), s))
                }
            }
        })
    }
}

/// `schema` as clients receive it: dictionary columns as their values, and the string and binary
/// "view" types DataFusion reads Parquet into as plain `Utf8`/`Binary` (Flight SQL clients built
/// on older Arrow releases, Grafana's data source among them, cannot read view types).
fn hydrated(schema: &Schema) -> Schema {
    fn ty(t: &DataType) -> DataType {
        match t {
            DataType::Dictionary(_, v) => ty(v),
            DataType::Utf8View => DataType::Utf8,
            DataType::BinaryView => DataType::Binary,
            DataType::List(f) => DataType::List(Arc::new(field(f))),
            DataType::LargeList(f) => DataType::LargeList(Arc::new(field(f))),
            DataType::Struct(fs) => DataType::Struct(fs.iter().map(|f| field(f)).collect()),
            other => other.clone(),
        }
    }
    fn field(f: &Field) -> Field {
        f.clone().with_data_type(ty(f.data_type()))
    }
    Schema::new_with_metadata(
        schema.fields().iter().map(|f| field(f)).collect::<Vec<_>>(),
        schema.metadata().clone(),
    )
}

/// `b` as `schema` ([`hydrated`] from the plan's): names and nullability relabelled, columns of
/// another type cast.
fn relabel(b: RecordBatch, schema: &SchemaRef) -> datafusion::error::Result<RecordBatch> {
    if b.schema_ref() == schema {
        return Ok(b);
    }
    let cols = b
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(Arc::clone(c))
            } else {
                datafusion::arrow::compute::cast(c, f.data_type())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let opts = arrow_array::RecordBatchOptions::new().with_row_count(Some(b.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        cols,
        &opts,
    )?)
}

/// The SQL of a statement handle or ticket.
fn sql_of(handle: &[u8]) -> Result<String, Status> {
    String::from_utf8(handle.to_vec())
        .map_err(|_| Status::invalid_argument("the statement handle is not UTF-8 SQL text"))
}

#[tonic::async_trait]
impl FlightSqlService for FlightSqlServer {
    type FlightService = FlightSqlServer;

    async fn do_handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<
        Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>,
        Status,
    > {
        // The interceptor has checked the credentials; answer with the bearer token the
        // client sends from now on.
        let token: Arc<str> = self
            .inner
            .token
            .clone()
            .unwrap_or_else(|| "anonymous".into());
        let out = futures::stream::iter([Ok(HandshakeResponse {
            protocol_version: 0,
            payload: token.as_bytes().to_vec().into(),
        })]);
        let mut resp: Response<Pin<Box<dyn Stream<Item = _> + Send>>> =
            Response::new(Box::pin(out));
        let v = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Status::internal("the token is not a valid header value"))?;
        resp.metadata_mut().insert("authorization", v);
        Ok(resp)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.statement_info(&query.query, request.into_inner())
            .await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let sql = sql_of(&cmd.prepared_statement_handle)?;
        self.statement_info(&sql, request.into_inner()).await
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.execute(sql_of(&ticket.statement_handle)?).await
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.execute(sql_of(&query.prepared_statement_handle)?)
            .await
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let schema = self.schema_of(&query.query).await?;
        let IpcMessage(dataset_schema) = SchemaAsIpc::new(&schema, &Default::default())
            .try_into()
            .map_err(|e: arrow_schema::ArrowError| Status::internal(e.to_string()))?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: query.query.into_bytes().into(),
            dataset_schema,
            parameter_schema: Default::default(),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        // Handles are the SQL text: nothing to free.
        Ok(())
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let mut s = request.into_inner();
        while let Some(d) = s.next().await {
            if !d?.data_body.is_empty() {
                return Err(Status::invalid_argument(
                    "parameters are not supported: write the values into the SQL text",
                ));
            }
        }
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(query.prepared_statement_handle),
        })
    }

    async fn do_put_statement_update(
        &self,
        _ticket: CommandStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(self.refuse(
            Refusal::ReadOnly,
            "read-only server: updates are refused; only reading statements run here",
        ))
    }

    async fn do_put_prepared_statement_update(
        &self,
        _query: CommandPreparedStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(self.refuse(
            Refusal::ReadOnly,
            "read-only server: updates are refused; only reading statements run here",
        ))
    }

    async fn do_put_statement_ingest(
        &self,
        _ticket: CommandStatementIngest,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(self.refuse(
            Refusal::ReadOnly,
            "read-only server: bulk ingestion is refused",
        ))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        Self::metadata_info(query.as_any(), &schema, request.into_inner())
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut b = query.into_builder();
        for c in self.inner.ctx.catalog_names() {
            b.append(c);
        }
        Ok(Self::one_batch(b.build().map_err(internal)?))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Self::metadata_info(query.as_any(), &schema, request.into_inner())
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut b = query.into_builder();
        let ctx = &self.inner.ctx;
        for c in ctx.catalog_names() {
            let Some(cat) = ctx.catalog(&c) else { continue };
            for s in cat.schema_names() {
                b.append(&c, s);
            }
        }
        Ok(Self::one_batch(b.build().map_err(internal)?))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Self::metadata_info(query.as_any(), &schema, request.into_inner())
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut b = query.into_builder();
        for t in listed_tables(&self.inner.ctx).await {
            b.append(
                &t.catalog,
                &t.schema,
                &t.name,
                table_type(t.table.table_type()),
                &t.table.schema(),
            )
            .map_err(internal)?;
        }
        Ok(Self::one_batch(b.build().map_err(internal)?))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        Self::metadata_info(query.as_any(), &schema, request.into_inner())
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut b = query.into_builder();
        for t in ["TABLE", "VIEW", "LOCAL TEMPORARY"] {
            b.append(t);
        }
        Ok(Self::one_batch(b.build().map_err(internal)?))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.inner.sql_info).schema();
        Self::metadata_info(query.as_any(), &schema, request.into_inner())
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let batch = query
            .into_builder(&self.inner.sql_info)
            .build()
            .map_err(internal)?;
        Ok(Self::one_batch(batch))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// One table as GetTables lists it.
#[derive(Debug)]
pub(super) struct Listed {
    pub(super) catalog: String,
    pub(super) schema: String,
    pub(super) name: String,
    pub(super) table: Arc<dyn TableProvider>,
}

/// Every table GetTables (and so ADBC's `get_objects`, JDBC's `getTables`, Grafana's browser)
/// lists, by catalog, schema and name: the one listing the start-up line counts too, so the two
/// cannot disagree.
pub(super) async fn listed_tables(ctx: &SessionContext) -> Vec<Listed> {
    let mut out = Vec::new();
    for c in ctx.catalog_names() {
        let Some(cat) = ctx.catalog(&c) else { continue };
        for s in cat.schema_names() {
            let Some(schema) = cat.schema(&s) else {
                continue;
            };
            let mut names = schema.table_names();
            names.sort();
            for name in names {
                let Ok(Some(table)) = schema.table(&name).await else {
                    continue;
                };
                out.push(Listed {
                    catalog: c.clone(),
                    schema: s.clone(),
                    name,
                    table,
                });
            }
        }
    }
    out
}

fn table_type(t: TableType) -> &'static str {
    match t {
        TableType::Base => "TABLE",
        TableType::View => "VIEW",
        TableType::Temporary => "LOCAL TEMPORARY",
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}
